"""The µP monitor in sweeps and transfers: the proxy's trajectory at its optimum, the target's against it."""

import json
import shutil
import textwrap

import pytest

from mutransfer.cli import main
from mutransfer.sweep import Sweep
from mutransfer.sweep.analysis.trajectory import every_for

MLP = """
    name = "mon"
    objective = "OBJ"
    widths = [32, 64]
    parametrizations = ["mup"]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-9"
    high = "2**-5"
    grid = 3
    [fixed]
    steps = 24
    batch_size = 32
    threads = 1
"""

# With MONWIRE_BREAK set, AdamW over model.parameters() with one lr: at the base width (the proxy) µP is the
# plain model, so nothing changes there; at twice the width the hidden and output layers run the base lr
# where µP wants lr / 2. Without it, recipe:mlp itself.
OBJECTIVE = textwrap.dedent("""
    import os
    import torch
    from mutransfer.sweep import recipes

    def train(hp, scale):
        with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as f:  # who trained what, where
            f.write(f"{os.getpid()} {scale.parametrization} {scale.width} {scale.seed} "
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\\n")
        if not os.environ.get("MONWIRE_BREAK"):
            return recipes.train_mlp(hp, scale)
        real = recipes.mt_optim.build_optimizer
        def one_lr(model, name, lr, **kw):
            real(model, name, lr, **kw)  # what the recipe would build, thrown away
            return torch.optim.AdamW(model.parameters(), lr=lr)
        recipes.mt_optim.build_optimizer = one_lr
        try:
            return recipes.train_mlp(hp, scale)
        finally:
            recipes.mt_optim.build_optimizer = real
""")


def _sweep(tmp_path, objective):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(textwrap.dedent(MLP).replace("OBJ", objective))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    return cfg, run


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished µP sweep of the objective above (unbroken), shared: each test copies its run directory."""
    tmp = tmp_path_factory.mktemp("monitor_sweep")
    (tmp / "obj.py").write_text(OBJECTIVE)
    done = _sweep(tmp, str(tmp / "obj.py") + ":train")
    (tmp / "calls.txt").rename(tmp / "sweep_calls.txt")  # the sweep's calls (transfers add their own later)
    return done


def _copy(swept, tmp_path):
    cfg, run = swept
    shutil.copytree(run, tmp_path / "run")
    return cfg, tmp_path / "run"


def test_every_gives_a_dozen_samples_per_run():
    assert (
        every_for(150) == 13
        and every_for(24) == 2
        and every_for(20) == 2
        and every_for(5) == 1
        and every_for(None) == 10
    )


def test_a_sweep_records_the_proxy_trajectory_and_transfer_compares_the_target_with_it(swept, tmp_path, capsys):
    cfg, run = _copy(swept, tmp_path)
    traj = json.loads((run / "proxy_trajectory.json").read_text())
    best = min(
        (t for t in Sweep(run).study("mup", 32).get_trials() if t.value is not None), key=lambda t: t.value
    ).params["lr"]
    assert traj["hparams"]["lr"] == best and traj["width"] == 32 and traj["every"] == 2
    assert [s["step"] for s in traj["steps"]] == [1, *range(2, 25, 2)]
    assert traj["steps"][-1]["layers"]["hidden.0"]["dw_rms"] > 0
    wider = traj["wider"]  # the next swept width at the same hparams: the finite-width trend
    assert wider["width"] == 64 and [s["step"] for s in wider["steps"]] == [s["step"] for s in traj["steps"]]
    assert wider["layers"]["hidden.0"]["m_in"] == 2 * traj["layers"]["hidden.0"]["m_in"]
    ran = json.loads((run / "run.json").read_text())["proxy_trajectory"]
    assert ran["file"] == "proxy_trajectory.json" and ran["samples"] == 13 and ran["wider_width"] == 64
    # it is the optimum's own trial's trajectory, recorded in its worker: no point was trained twice
    optimum = next(t for t in Sweep(run).study("mup", 32).get_trials() if t.number == ran["trial"])
    assert optimum.params["lr"] == best
    assert optimum.user_attrs["monitor_trajectory"]["steps"] == traj["steps"]
    calls = (swept[0].parent / "sweep_calls.txt").read_text().splitlines()
    assert len(calls) == 6  # 3 grid points × 2 widths × 1 seed: the objective ran once per point
    # a rerun of the finished sweep does not train the proxy again
    stamp = (run / "proxy_trajectory.json").stat().st_mtime_ns
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert (run / "proxy_trajectory.json").stat().st_mtime_ns == stamp
    assert main(["report", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["proxy_trajectory"] == "proxy_trajectory.json"

    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "64"]) == 0
    assert "monitor: no alarm (against the proxy's trajectory" in capsys.readouterr().out
    out = json.loads((run / "transfer.json").read_text())
    assert out["monitor"]["alarms"] == [] and out["monitor"]["proxy"] == "proxy_trajectory.json"
    target = json.loads((run / "target_trajectory.json").read_text())
    assert [s["step"] for s in target["steps"]] == [s["step"] for s in traj["steps"]]
    html = (run / "report.html").read_text()  # rewritten by the transfer
    assert "monitor_target_vs_proxy.png" in html and "No alarm." in html
    assert (run / "monitor_target_vs_proxy.png").read_bytes()[:4] == b"\x89PNG"


def test_transfer_names_the_layer_an_optimizer_over_model_parameters_leaves_at_the_base_lr(
    swept, tmp_path, capsys, monkeypatch
):
    _, run = _copy(swept, tmp_path)
    monkeypatch.setenv("MONWIRE_BREAK", "1")
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "64"]) == 0
    printed = capsys.readouterr().out
    alarms = json.loads((run / "transfer.json").read_text())["monitor"]["alarms"]
    lr_alarms = {a["layer"]: a for a in alarms if a["what"] == "lr"}
    assert {"hidden.0", "hidden.1", "readout"} <= set(lr_alarms), alarms  # base lr where µP wants lr / 2
    a = lr_alarms["hidden.0"]
    assert a["step"] == 1 and abs(a["measured"] / a["expected"] - 2.0) < 1e-6 and "param_groups" in a["cause"]
    assert "alarm(s) on hidden.0" in printed
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    assert "hidden.0" in html and "No alarm." not in html


def test_an_objective_that_never_calls_scale_monitor_gets_one_line_and_no_file(tmp_path, capsys):
    (tmp_path / "plain.py").write_text("def train(hp, scale):\n    return (hp['lr'] - 2**-7) ** 2\n")
    _, run = _sweep(tmp_path, str(tmp_path / "plain.py") + ":train")
    assert "never called scale.monitor" in capsys.readouterr().err
    assert not (run / "proxy_trajectory.json").exists()
    assert json.loads((run / "run.json").read_text())["proxy_trajectory"]["file"] is None
    assert main(["transfer", str(run), "--width", "64"]) == 0
    assert "monitor: off" in capsys.readouterr().out
    assert not (run / "target_trajectory.json").exists()


def test_a_monitor_that_raises_costs_the_trajectory_not_the_trial(tmp_path, capsys):
    (tmp_path / "bad.py").write_text(
        "import torch\n\ndef train(hp, scale):\n"
        "    scale.monitor(torch.nn.Linear(2, 2), None)  # never parametrized: the monitor raises, not the trial\n"
        "    return (hp['lr'] - 2**-7) ** 2\n"
    )
    _, run = _sweep(tmp_path, str(tmp_path / "bad.py") + ":train")
    assert "proxy trajectory: not recorded: scale.monitor raised ModelError" in capsys.readouterr().err
    ran = json.loads((run / "run.json").read_text())
    assert ran["finished_trials"] == 6 and ran["failed_trials"] == 0 and ran["proxy_trajectory"]["file"] is None


@pytest.mark.slow
def test_on_fake_gpus_every_run_trains_in_a_placed_worker_and_a_cluster_sweep_gets_the_trajectory(tmp_path, capsys):
    """devices [0, 1]: every objective call runs in a worker that sees one GPU id (none in the parent, which
    only watches), once per point; the proxy trajectory is the optimum's trial's, recorded there. The same
    sweep as a cluster (local backend) job gets it too, from `mutransfer report`."""
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    cfg = tmp_path / "sweep.toml"
    body = textwrap.dedent(MLP).replace("OBJ", str(tmp_path / "obj.py") + ":train")
    cfg.write_text(body.replace('sampler = "grid"', 'sampler = "grid"\ndevices = [0, 1]'))
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="sees no GPU"):
        assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    calls = [line.split() for line in (tmp_path / "calls.txt").read_text().splitlines()]
    assert len(calls) == 6 and {c[4] for c in calls} <= {"0", "1"}  # each in a worker pinned to one id
    ran = json.loads((run / "run.json").read_text())["proxy_trajectory"]
    optimum = next(t for t in Sweep(run).study("mup", 32).get_trials() if t.number == ran["trial"])
    assert ran["file"] == "proxy_trajectory.json" and optimum.user_attrs["cuda_visible_devices"] in ("0", "1")

    (tmp_path / "calls.txt").unlink()
    clustered = tmp_path / "cluster.toml"
    clustered.write_text(body.replace('name = "mon"', 'name = "monc"') + '\n[cluster]\nbackend = "local"\njobs = 1\n')
    crun = tmp_path / "crun"
    assert main(["sweep", str(clustered), "--run", str(crun), "--no-progress"]) == 0
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 6
    assert main(["report", str(crun)]) == 0
    traj = json.loads((crun / "proxy_trajectory.json").read_text())
    assert traj["width"] == 32 and traj["wider"]["width"] == 64 and len(traj["steps"]) == 13
    assert json.loads((crun / "summary.json").read_text())["proxy_trajectory"] == "proxy_trajectory.json"
