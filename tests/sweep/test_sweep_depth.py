"""Depth as a sweep axis: config keys, (parametrization, width, depth) studies, depth_alpha,
recipes, drift across depths in the report, transfer to a deeper target."""

import json
import math
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

from mutransfer.cli import main
from mutransfer.sweep import Scale, Sweep, config_from_dict, mup_kwargs
from mutransfer.sweep.analysis.analysis import (
    best,
    deeper_is_better,
    drift,
    load_results,
    max_drift_steps,
    transferred_hparams,
)
from mutransfer.sweep.recipes import train_gpt, train_resmlp
from mutransfer.sweep.report.report import curves

OBJECTIVE = textwrap.dedent('''
    import math

    def train(hp, scale):
        """Optimum at lr 2^-6 in µP at every width and depth; in SP it halves per doubling of either."""
        shift = 0 if scale.mup else (math.log2(scale.width / scale.base_width)
                                     + math.log2(scale.depth / scale.base_depth))
        return (math.log2(hp["lr"]) + 6 + shift) ** 2 + 1.0 / scale.width + 1.0 / scale.depth + 0.01 * scale.seed
''')

SYNTHETIC = """
    name = "deep"
    objective = "OBJ:train"
    widths = [16, 32]
    depths = [4, 2]
    target_depth = 8
    seeds = [0, 1]
    [space.lr]
    type = "log"
    low = "2**-9"
    high = "2**-5"
    grid = 5
"""

RESMLP = """
    name = "resmlp-depth"
    objective = "recipe:resmlp"
    widths = [32]
    depths = [2, 4]
    [space.lr]
    type = "log"
    low = "2**-9"
    high = "2**-5"
    grid = 3
    [fixed]
    steps = 20
    batch_size = 32
    threads = 1
"""


def write(tmp_path, body):
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(body).replace("OBJ", str(tmp_path / "obj.py")))
    return path


def study_names(run, name):
    storage = f"sqlite:///{run / 'sweep.db'}"
    return sorted(s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name.startswith(name))


# ---------------------------------------------------------------------------- config


def test_depth_keys_and_cells():
    space = {"lr": {"low": 1e-3, "high": 1e-1, "grid": 3}}
    cfg = config_from_dict({"objective": "recipe:resmlp", "widths": [32], "depths": [8, 2, 4], "space": space})
    assert cfg.depths == [2, 4, 8] and cfg.base_depth == 2 and cfg.proxy_depth == 2 and cfg.target_depth is None
    assert cfg.cells == [(p, 32, d) for p in ("mup", "sp") for d in (2, 4, 8)]
    cfg = config_from_dict(
        {
            "objective": "recipe:resmlp",
            "widths": [32],
            "depths": [4, 8],
            "base_depth": 2,
            "target_depth": 32,
            "space": space,
        }
    )
    assert (cfg.base_depth, cfg.proxy_depth, cfg.target_depth) == (2, 4, 32)
    plain = config_from_dict({"objective": "recipe:mlp", "widths": [32, 64], "space": space})
    assert plain.depths is None and plain.base_depth is None and plain.proxy_depth is None
    assert plain.cells == [("mup", 32, None), ("mup", 64, None), ("sp", 32, None), ("sp", 64, None)]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace("depths = [4, 2]", "depths = []"), "depths must be a non-empty list"),
        (lambda s: s.replace("depths = [4, 2]", "depths = [4, 0]"), "depths must hold integers ≥ 1"),
        (lambda s: s.replace("depths = [4, 2]", "depths = [2, 2]"), "depths has duplicates"),
        (lambda s: s.replace("depths = [4, 2]", 'depths = "2,4"'), "depths must be a non-empty list"),
        (lambda s: s.replace("target_depth = 8", "base_depth = 0"), "base_depth must be a positive integer"),
        (lambda s: s.replace("target_depth = 8", 'target_depth = "8"'), "target_depth must be a positive integer"),
        (lambda s: s.replace("depths = [4, 2]\n", ""), "target_depth needs depths"),
        (lambda s: s + "    [fixed]\n    depth_alpha = 2\n", "fixed.depth_alpha must be a number in [0, 1]"),
        (
            lambda s: s + '    [space.depth_alpha]\n    type = "choice"\n    values = [0.5, "one"]\n',
            "space.depth_alpha must be a number in [0, 1]",
        ),
    ],
)
def test_bad_depth_config_fails_at_once_with_exit_2(tmp_path, capsys, edit, message):
    cfg = write(tmp_path, edit(SYNTHETIC))
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(cfg) in err
    assert not (tmp_path / "run" / "sweep.db").exists()


# ---------------------------------------------------------------------------- depth_alpha and recipes


def test_depth_alpha_is_a_reserved_name_that_reaches_parametrize():
    assert mup_kwargs({"lr": 0.01, "depth_alpha": 0.5, "output_mult": 2}) == {"output_mult": 2.0, "depth_alpha": 0.5}
    with pytest.raises(TypeError, match="depth_alpha"):
        mup_kwargs({"depth_alpha": "half"})
    hp = {"lr": 2**-6, "steps": 6, "batch_size": 16}
    at = {a: train_resmlp({**hp, "depth_alpha": a}, Scale(32, 32, "mup", 0, 4, 2)) for a in (0.0, 0.5, 1.0)}
    assert len({round(v, 7) for v in at.values()}) == 3, at  # each α trains a different model at depth 4
    base = {a: train_resmlp({**hp, "depth_alpha": a}, Scale(32, 32, "mup", 0, 2, 2)) for a in (0.0, 1.0)}
    assert base[0.0] == base[1.0]  # at the base depth α changes nothing
    assert train_resmlp({**hp, "depth": 2}, Scale(32, 32, "mup", 0)) == base[1.0]  # hp depth without a sweep depth
    with pytest.raises(ValueError, match="depth is set by the sweep's depths"):
        train_resmlp({**hp, "depth": 2}, Scale(32, 32, "mup", 0, 4, 2))
    with pytest.raises(ValueError, match="task must be one of"):
        train_resmlp({**hp, "task": "rank"}, Scale(32, 32, "sp", 0))
    assert math.isfinite(train_resmlp({**hp, "task": "regress"}, Scale(64, 32, "mup", 0, 4, 2)))


def test_gpt_recipe_takes_n_layer_from_the_scale():
    hp = {"lr": 2**-7, "steps": 2, "batch_size": 2, "seq_len": 8, "n_head": 2}
    two = train_gpt({**hp, "n_layer": 2}, Scale(16, 16, "mup", 0))
    assert train_gpt(hp, Scale(16, 16, "mup", 0, 2, 2)) == two
    assert train_gpt(hp, Scale(16, 16, "mup", 0, 3, 2)) != two
    assert train_gpt(hp, Scale(16, 16, "sp", 0, 3, 2)) != train_gpt(hp, Scale(16, 16, "sp", 0, 2, 2))
    with pytest.raises(ValueError, match="n_layer is set by the sweep's depths"):
        train_gpt({**hp, "n_layer": 2}, Scale(16, 16, "mup", 0, 3, 2))


# ---------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_synthetic_depth_sweep_drift_report_and_transfer(tmp_path, capsys):
    cfg = write(tmp_path, SYNTHETIC)
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert study_names(run, "deep/") == sorted(
        f"deep/{p}/w{w}/d{d}" for p in ("mup", "sp") for w in (16, 32) for d in (2, 4)
    )
    sweep = Sweep(run)
    for cell in sweep.config.cells:
        trials = sweep.study(*cell).get_trials(states=(TrialState.COMPLETE,))
        assert len(trials) == 5, cell
        assert all(t.user_attrs["losses"][1] - t.user_attrs["losses"][0] == pytest.approx(0.01) for t in trials)
    results = load_results(sweep)
    assert {r.depth for r in results} == {2, 4}
    assert best(results, "mup", 32, 4).params["lr"] == 2**-6
    assert best(results, "sp", 32, 4).params["lr"] == 2**-8
    assert drift(sweep, results, "mup", "lr", "depth") == 0.0
    assert drift(sweep, results, "sp", "lr", "depth") == -1.0  # depth 2 → 4 at the proxy width
    assert drift(sweep, results, "sp", "lr") == -1.0  # width 16 → 32 at the proxy depth
    assert max_drift_steps(sweep, results, "sp", "lr", "depth", at=32) == 1.0
    assert deeper_is_better(sweep, results, "mup") is True
    assert transferred_hparams(sweep, results, parametrization="sp") == {"lr": 2**-6}  # proxy: width 16, depth 2
    assert transferred_hparams(sweep, results, parametrization="sp", depth=4) == {"lr": 2**-7}

    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["depths"] == [2, 4] and summary["proxy_depth"] == 2 and summary["base_depth"] == 2
    assert summary["optima"]["mup"]["32"]["4"]["lr"] == 2**-6
    assert summary["optima"]["sp"]["32"]["4"]["lr"] == 2**-8
    assert summary["depth_drift"]["mup"]["lr"] == {"octaves": 0.0, "max_grid_steps": 0.0}
    assert summary["depth_drift"]["sp"]["lr"] == {"octaves": -1.0, "max_grid_steps": 1.0}
    assert summary["drift"]["sp"]["lr"] == {"octaves": -1.0, "max_grid_steps": 1.0}
    assert summary["deeper_is_better"]["mup"] is True
    assert json.loads((run / "transferred.json").read_text()) == {"lr": 2**-6}
    html = (run / "report.html").read_text()
    assert "depths 2, 4 (µP base depth 2)" in html and "depths at width 32" in html and "widths at depth 4" in html
    assert "Deeper is better" in html and "proxy width 16 and depth 2" in html
    assert [label for _, _, label in curves(sweep)] == [f"width {w}, depth {d}" for w in (16, 32) for d in (2, 4)]
    assert (run / "loss_vs_lr.png").read_bytes()[:4] == b"\x89PNG"

    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "64"]) == 0  # depth: the config's target_depth
    out = capsys.readouterr().out
    t = json.loads((run / "transfer.json").read_text())
    assert (t["target_width"], t["target_depth"], t["proxy_width"], t["proxy_depth"]) == (64, 8, 16, 2)
    assert t["mup"]["hparams"] == {"lr": 2**-6} and t["sp"]["hparams"] == {"lr": 2**-6}
    assert t["mup"]["loss"] == pytest.approx(1 / 64 + 1 / 8 + 0.005)  # the µP optimum holds at 4× width and depth
    assert t["mup"]["loss"] < t["sp"]["loss"]
    assert "transfer from width 16, depth 2 to width 64, depth 8:" in out
    assert main(["transfer", str(run), "--width", "64", "--depth", "16"]) == 0
    assert json.loads((run / "transfer.json").read_text())["target_depth"] == 16
    assert main(["report", str(run)]) == 0
    assert "Transfer from width 16, depth 2 to width 64, depth 16" in (run / "report.html").read_text()
    assert main(["transfer", str(run), "--depth", "0"]) == 2
    assert "--depth must be positive" in capsys.readouterr().err


def test_depth_flag_needs_a_sweep_over_depths(tmp_path, capsys):
    body = SYNTHETIC.replace("depths = [4, 2]\n", "").replace("target_depth = 8\n", "")
    cfg = write(tmp_path, body.replace("grid = 5", "grid = 2").replace("widths = [16, 32]", "widths = [16]"))
    (tmp_path / "obj.py").write_text(OBJECTIVE.replace("scale.depth", "2").replace("scale.base_depth", "2"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert study_names(run, "deep/") == ["deep/mup/w16", "deep/sp/w16"]  # names unchanged without depths
    assert main(["transfer", str(run), "--width", "32", "--depth", "4"]) == 2
    assert "--depth needs a sweep over depths" in capsys.readouterr().err
    assert main(["transfer", str(run), "--width", "32"]) == 0
    assert "target_depth" not in json.loads((run / "transfer.json").read_text())


@pytest.mark.slow
def test_resmlp_sweep_over_depths_end_to_end(tmp_path):
    cfg = write(tmp_path, RESMLP)
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert study_names(run, "resmlp-depth/") == [f"resmlp-depth/{p}/w32/d{d}" for p in ("mup", "sp") for d in (2, 4)]
    sweep = Sweep(run)
    results = load_results(sweep)
    assert len(results) == 12 and not any(r.diverged for r in results)

    def losses(p, d):
        return sorted((r.params["lr"], r.loss) for r in results if r.parametrization == p and r.depth == d)

    assert losses("mup", 2) == losses("sp", 2)  # at the base width and depth µP is the plain model
    assert losses("mup", 4) != losses("sp", 4)  # deeper, µP scales the residual branches

    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    step = 2.0  # 2^-9, 2^-7, 2^-5
    for p in ("mup", "sp"):
        lrs = [summary["optima"][p]["32"][str(d)]["lr"] for d in (2, 4)]
        assert lrs == [best(results, p, 32, d).params["lr"] for d in (2, 4)]
        octaves = math.log2(lrs[1] / lrs[0])
        assert summary["depth_drift"][p]["lr"] == {"octaves": octaves, "max_grid_steps": abs(octaves) / step}
        assert summary["drift"][p]["lr"] == {"octaves": None, "max_grid_steps": None}  # one width
    assert json.loads((run / "transferred.json").read_text()) == {
        "steps": 20,
        "batch_size": 32,
        "threads": 1,
        "lr": best(results, "mup", 32, 2).params["lr"],
    }
    html = (run / "report.html").read_text()
    assert "depths 2, 4" in html and "depths at width 32" in html and "One curve per depth" in html
    assert [label for _, _, label in curves(sweep)] == ["depth 2", "depth 4"]
    png = (run / "loss_vs_lr.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 20_000

    assert main(["transfer", str(run), "--depth", "8"]) == 0
    t = json.loads((run / "transfer.json").read_text())
    assert (t["target_width"], t["target_depth"], t["proxy_depth"]) == (32, 8, 2)
    assert t["mup"]["hparams"]["lr"] == best(results, "mup", 32, 2).params["lr"]
    assert all(math.isfinite(t[p]["loss"]) for p in ("mup", "sp"))
    assert t["mup"]["loss"] != t["sp"]["loss"]  # depth scaling is on in the µP target
