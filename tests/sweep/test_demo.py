"""`mutransfer demo --quick`: tune at the proxy, then µP's optimum stays put, SP's moves, and µP with the
proxy's HPs is as good as SP re-tuned at the target (TP5 Fig. 1's promise) — all read from the run (slow)."""

import json

import pytest

from mutransfer.cli import main


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
    assert len(summary["seeds"]) >= 2 and mup["optimum"]["256"]["log2_interval"] is not None  # error bars
    assert mup["drift"]["interval"] is not None and summary["analysis"]["mup"]["width"]["regret"]["256"]
    assert summary["transferred"]["mup"] is True, summary["verdicts"]
    assert abs(mup["drift"]["value"]) <= 1 and sp["drift"]["value"] < -1, (mup["drift"], sp["drift"])
    assert summary["wider_is_better"]["mup"] is True
    h2h = summary["head_to_head"]
    assert h2h["width"] == 256 and h2h["relative"] <= 0.01, h2h  # µP tuned small ≤ SP re-tuned big (+1%)
    transfer = json.loads((tmp_path / "run" / "transfer.json").read_text())
    assert transfer["target_width"] == 256 and transfer["proxy_width"] == 32
    assert transfer["mup"]["loss"] < transfer["sp"]["loss"]
    assert transfer["mup"]["hparams"]["output_mult"] == pytest.approx(output_mult) and transfer["proxy_cost_ratio"] > 0
    for name in ("report.html", "loss_vs_lr.png", "transferred.json"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    assert summary["verdict"] in out and "report.html" in out and "µP across widths transferred" in out
