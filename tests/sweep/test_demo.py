"""`mutransfer demo --quick`: tune at the proxy, then µP's optimum stays put, SP's moves, and µP with the
proxy's HPs is as good as SP re-tuned at the target (TP5 Fig. 1's promise) — all read from the run (slow)."""

import json
import math

import pytest

from mutransfer.cli import main
from mutransfer.sweep.transfer.demo import FULL, QUICK, demo_config, tune_config


@pytest.mark.parametrize("quick", [False, True])
def test_the_demo_configs_bracket_the_optima_they_look_for(quick, tmp_path):
    """Fast: the configs the demo writes load, sweep 4× in width (32 → 128; the quick one 16 → 64; width
    256 alone cost 60% of the demo's compute), and their grids bracket µP's optimum at the proxy (2^-6.0
    at 32, 2^-5.3 at 16) and SP's at the widest (2^-8.1 at 128, 2^-7.4 at 64) with an octave to spare."""
    from mutransfer.sweep.config.config import load_config

    (tmp_path / "tune.toml").write_text(tune_config(quick))
    (tmp_path / "demo.toml").write_text(demo_config(quick, output_mult=2.0))
    tune, demo = load_config(tmp_path / "tune.toml"), load_config(tmp_path / "demo.toml")
    settings = QUICK if quick else FULL
    proxy, widest = (16, 64) if quick else (32, 128)
    assert tune.widths == [proxy] and demo.widths == settings["widths"] and max(demo.widths) == widest == 4 * proxy
    mup_optimum, sp_optimum = (-5.3, -7.4) if quick else (-6.0, -8.1)
    lrs = [math.log2(v) for v in demo.space["lr"].grid_points()]
    assert lrs[0] <= sp_optimum - 1 and lrs[-1] >= mup_optimum + 1 and len(demo.seeds) == 2
    tune_lrs = [math.log2(v) for v in tune.space["lr"].grid_points()]
    mults = [math.log2(v) for v in tune.space["output_mult"].grid_points()]
    assert tune_lrs[0] < mup_optimum < tune_lrs[-1] and mults[0] <= 1 and mults[-1] >= 2
    assert demo.fixed["output_mult"] == 2.0 and demo.parametrizations == ["mup", "sp"]


@pytest.mark.slow
def test_demo_quick_reproduces_the_headline_result(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    tune = json.loads((tmp_path / "tune" / "summary.json").read_text())
    assert tune["transferred"] == {"mup": None} and tune["verdict"].startswith("No transfer verdict")
    output_mult = tune["transferred_hparams"]["output_mult"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["transferred_hparams"]["output_mult"] == pytest.approx(output_mult)  # stage 2: the tuned α_output
    mup = summary["analysis"]["mup"]["width"]["hparams"]["lr"]
    sp = summary["analysis"]["sp"]["width"]["hparams"]["lr"]
    target = str(max(summary["widths"]))
    assert len(summary["seeds"]) >= 2 and mup["optimum"][target]["log2_interval"] is not None  # error bars
    assert mup["drift"]["interval"] is not None and summary["analysis"]["mup"]["width"]["regret"][target]
    assert summary["transferred"]["mup"] is True, summary["verdicts"]
    assert abs(mup["drift"]["value"]) <= 1 and sp["drift"]["value"] < -1, (mup["drift"], sp["drift"])
    assert summary["wider_is_better"]["mup"] is True
    h2h = summary["head_to_head"]
    assert h2h["width"] == 64 and h2h["relative"] <= 0.01, h2h  # µP tuned small ≤ SP re-tuned big (+1%)
    transfer = json.loads((tmp_path / "run" / "transfer.json").read_text())
    assert transfer["target_width"] == 64 and transfer["proxy_width"] == 16
    assert transfer["mup"]["loss"] < transfer["sp"]["loss"]
    assert transfer["mup"]["hparams"]["output_mult"] == pytest.approx(output_mult) and transfer["proxy_cost_ratio"] > 0
    for name in ("report.html", "loss_vs_lr.png", "transferred.json"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    assert summary["verdict"] in out and "report.html" in out and "µP across widths transferred" in out


def test_the_demos_text_does_not_depend_on_what_the_process_imported():
    """recipe:gpt's text once held the docstrings of submodules a package had as attributes only once
    imported (json.tool, logging.config): a sweep worker (Optuna loaded) trained on other text than a
    fresh interpreter, and the demo's losses moved with it."""
    import sys

    from mutransfer.recipes.data import stdlib_text

    stdlib_text.cache_clear()
    for name in ("json.tool", "logging.config"):  # forget them, as a fresh interpreter has never seen them
        sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if hasattr(sys.modules[parent], child):
            delattr(sys.modules[parent], child)
    before = stdlib_text()
    import json.tool  # noqa: F401
    import logging.config  # noqa: F401

    stdlib_text.cache_clear()
    assert stdlib_text() == before and len(before) > 100_000
