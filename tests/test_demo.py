"""`mutransfer demo --quick`: µP's optimum stays put, SP's moves, and the transfer pays off (slow)."""
import json

import pytest

from mutransfer.cli import main


@pytest.mark.slow
def test_demo_quick_reproduces_the_headline_result(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    moved = {p: summary["drift"][p]["lr"]["max_grid_steps"] for p in ("mup", "sp")}
    assert moved["mup"] <= 1, summary["optima"]
    assert moved["sp"] >= 2, summary["optima"]
    transfer = json.loads((tmp_path / "run" / "transfer.json").read_text())
    assert transfer["target_width"] == 256 and transfer["proxy_width"] == 32
    assert transfer["mup"]["loss"] < transfer["sp"]["loss"]
    assert summary["wider_is_better"]["mup"] is True
    for name in ("report.html", "loss_vs_lr.png", "transferred.json"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    assert "µP's optimum stays put" in out and "report.html" in out
