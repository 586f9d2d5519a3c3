"""u-µP is a width-transferring parametrization like µP (`config.TRANSFERRING`): a sweep without µP transfers,
records, forecasts and monitors u-µP's proxy optimum as a µP sweep does µP's (`SweepConfig.transferred`); a sweep
of both keeps µP's and says that u-µP's target trains unmonitored."""

import json
import math
import textwrap

import pytest

from mutransfer.cli import main
from mutransfer.sweep import Sweep, config_from_dict
from mutransfer.sweep.analysis.summary import summary_text
from mutransfer.sweep.config.config import TRANSFERRING, transferred_parametrization

pytestmark = pytest.mark.filterwarnings("ignore::mutransfer.errors.MuPWarning")

MLP = """
    name = "NAME"
    objective = "recipe:mlp"
    widths = [32, 64]
    parametrizations = PS
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-9"
    high = "2**-5"
    grid = GRID
    [fixed]
    steps = 24
    batch_size = 32
    threads = 1
"""


def _sweep(tmp, name, ps, grid=3):
    cfg = tmp / f"{name}.toml"
    body = textwrap.dedent(MLP).replace("NAME", name).replace("PS", json.dumps(ps)).replace("GRID", str(grid))
    cfg.write_text(body)
    run = tmp / name
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    return run


def _trials(run, p, width):
    return [t for t in Sweep(run).study(p, width).get_trials() if t.value is not None]


def test_the_transferred_parametrization_is_mup_else_umup_else_none():
    assert TRANSFERRING == ("mup", "u-mup")
    assert transferred_parametrization(["mup", "sp"]) == "mup"
    assert transferred_parametrization(["u-mup", "mup"]) == "mup"
    assert transferred_parametrization(["sp", "u-mup"]) == "u-mup"
    assert transferred_parametrization(["sp"]) is None
    base = {"name": "t", "objective": "recipe:mlp", "widths": [16], "space": {"lr": {"low": 0.01, "high": 0.1}}}
    assert config_from_dict({**base, "parametrizations": ["u-mup"]}).transferred == "u-mup"
    assert config_from_dict(base).transferred == "mup"


@pytest.fixture(scope="module")
def umup_run(tmp_path_factory):
    """A finished u-µP-only sweep of the MLP recipe (which calls scale.monitor and scale.noise_scale)."""
    return _sweep(tmp_path_factory.mktemp("umup_only"), "um", ["u-mup"])


def test_a_umup_only_sweep_records_its_trials_and_writes_the_proxy_trajectory(umup_run):
    run = umup_run
    for width in (32, 64):  # every trial's first seed recorded its trajectory, as µP's do
        trials = _trials(run, "u-mup", width)
        assert len(trials) == 3
        for t in trials:
            traj = t.user_attrs["monitor_trajectory"]
            assert traj["parametrization"] == "u-mup" and traj["width"] == width and traj["steps"]
    measured = [t for t in _trials(run, "u-mup", 32) if "noise_scale" in t.user_attrs]  # the proxy cell only
    assert measured and not any("noise_scale" in t.user_attrs for t in _trials(run, "u-mup", 64))
    assert "u-µP proxy" in measured[0].user_attrs["noise_scale"]["where"]
    entry = json.loads((run / "run.json").read_text())["proxy_trajectory"]
    best = min(_trials(run, "u-mup", 32), key=lambda t: t.value)
    assert entry["parametrization"] == "u-mup" and entry["file"] == "proxy_trajectory.json"
    assert entry["trial"] == best.number and entry["wider_width"] == 64 and "not_recorded" not in entry
    assert entry["noise_scale"] == "noise_scale.json"
    traj = json.loads((run / "proxy_trajectory.json").read_text())
    assert traj["parametrization"] == "u-mup" and traj["hparams"]["lr"] == best.params["lr"]
    assert traj["wider"]["width"] == 64 and traj["steps"] == best.user_attrs["monitor_trajectory"]["steps"]


def test_the_forecast_command_on_a_umup_only_run_forecasts_umup(umup_run, capsys):
    capsys.readouterr()
    code = main(["forecast", str(umup_run), "--width", "128"])
    printed = capsys.readouterr()
    assert code in (0, 1), printed.err  # a forecast, or its reason: not a usage error (was: 'mup' not swept)
    assert "not swept" not in printed.err + printed.out
    assert main(["forecast", str(umup_run), "--width", "128", "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["parametrization"] == "u-mup"
    assert main(["forecast", str(umup_run), "--parametrization", "mup"]) == 2  # µP was not swept: named
    assert "'mup' was not swept" in capsys.readouterr().err


def test_a_umup_only_transfer_forecasts_and_monitors_against_its_own_proxy(umup_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(umup_run, run)
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "128"]) == 0
    printed = capsys.readouterr().out
    assert "ran no µP" not in printed
    out = json.loads((run / "transfer.json").read_text())
    fc = out["forecast"]
    assert fc["parametrization"] == "u-mup" and fc["reason"] is None and fc["loss"] is not None
    assert fc["actual"]["loss"] == out["u-mup"]["loss"]
    assert "forecast: loss" in printed
    m = out["monitor"]
    assert m["proxy"] == "proxy_trajectory.json" and m["trajectory"] == "target_trajectory.json"
    assert "unmonitored" not in m and isinstance(m["alarms"], list)
    assert "monitor: " in printed and "against the proxy's trajectory" in printed
    target = json.loads((run / "target_trajectory.json").read_text())
    assert target["parametrization"] == "u-mup"
    # costed against the u-µP target run, its proxy cell the tuning
    assert out["cost_ratio"] > 0 and out["proxy_cost_ratio"] > 0 and "the u-µP trials at the proxy" in printed
    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["proxy_trajectory"] == "proxy_trajectory.json" and summary["forecast"]["parametrization"] == "u-mup"
    assert summary["transferred_hparams"]["lr"] == out["u-mup"]["hparams"]["lr"]
    assert "the u-µP proxy's best trial" in summary_text(summary)
    html = (run / "report.html").read_text()
    assert "u-µP monitor on the target" in html and "u-µP optimum at the proxy" in html


def test_a_sweep_of_mup_and_umup_keeps_mups_proxy_and_says_what_umup_gets(tmp_path, capsys):
    run = _sweep(tmp_path, "mx", ["mup", "u-mup"], grid=2)
    for p in ("mup", "u-mup"):  # both record their trials' trajectories
        assert all(t.user_attrs["monitor_trajectory"]["parametrization"] == p for t in _trials(run, p, 32))
    assert not any("noise_scale" in t.user_attrs for t in _trials(run, "u-mup", 32))  # µP's proxy measures it
    entry = json.loads((run / "run.json").read_text())["proxy_trajectory"]
    assert entry["parametrization"] == "mup" and entry["file"] == "proxy_trajectory.json"
    assert "u-µP's proxy optimum has no trajectory file of its own" in entry["not_recorded"]["u-mup"]
    assert json.loads((run / "proxy_trajectory.json").read_text())["parametrization"] == "mup"
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "64"]) == 0
    printed = capsys.readouterr().out
    out = json.loads((run / "transfer.json").read_text())
    assert out["forecast"]["parametrization"] == "mup"
    m = out["monitor"]
    assert m["proxy"] == "proxy_trajectory.json" and set(m["unmonitored"]) == {"u-mup"}
    assert json.loads((run / "target_trajectory.json").read_text())["parametrization"] == "mup"
    assert "the u-µP target trained unmonitored (no u-µP proxy trajectory)" in printed
    assert math.isfinite(out["u-mup"]["loss"])


OBJECTIVE = textwrap.dedent('''
    import math

    def train(hp, scale):
        """u-µP's lr optimum 2^-6 at batch 8, moving as √B; SP's also moves as 1/width."""
        target = -6 + 0.5 * math.log2(hp["batch_size"] / 8) - (0 if scale.mup else math.log2(scale.width / 16))
        return (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 1.0 / hp["steps"]
''')


def test_umup_beside_sp_gets_the_head_to_head_the_verdict_order_and_the_width_rule(tmp_path, capsys):
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    (tmp_path / "s.toml").write_text(
        'name = "usp"\nobjective = "obj.py:train"\nwidths = [16, 64]\nparametrizations = ["sp", "u-mup"]\n'
        '[space.lr]\nlow = "2**-9"\nhigh = "2**-2"\ngrid = 8\n[fixed]\nsteps = 20\nbatch_size = 8\nseq_len = 4\n'
    )
    run = tmp_path / "run"
    assert main(["sweep", str(tmp_path / "s.toml"), "--run", str(run), "--no-progress"]) == 0
    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    h2h = summary["head_to_head"]
    assert h2h["parametrization"] == "u-mup" and h2h["mup_transferred"] == pytest.approx(1 / 64 + 1 / 20)
    assert summary["verdicts"][0].startswith("u-µP")  # the transferred parametrization's verdict first
    assert "At width 64, u-µP with the HPs tuned at width 16" in capsys.readouterr().out
    assert summary["transferred_hparams"] == {"steps": 20, "batch_size": 8, "seq_len": 4, "lr": 2**-6}
    assert (
        main(
            [
                "transfer",
                str(run),
                "--width",
                "64",
                "--batch-size",
                "32",
                "--optimizer",
                "adam",
                "--critical-batch",
                "512",
            ]
        )
        == 0
    )
    out = json.loads((run / "transfer.json").read_text())
    assert out["u-mup"]["hparams"]["lr"] == pytest.approx(2**-5)  # η ∝ √B from the proxy's batch 8
    assert "µP" in [r["rule"] for r in out["hparam_rules"]["u-mup"]]  # u-µP's width step is listed, as µP's
    assert "µP" not in [r["rule"] for r in out["hparam_rules"]["sp"]]
    assert "the target trains at batch size 32" in out["forecast"]["reason"]
    assert out["forecast"]["parametrization"] == "u-mup" and out["cost_ratio"] > 0
