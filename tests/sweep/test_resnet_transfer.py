"""µTransfer on a ResNet with BatchNorm (benchmarks/resnet_transfer.py): the roles µP gives its
parameters, and the benchmark's smoke run (slow), which must print the table, write the JSON and
the figure, and show Adam's optimum moving less under µP than under SP."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mutransfer as mt
from mutransfer.recipes import ResNet

ROOT = Path(__file__).resolve().parents[2]


def test_resnet_roles_under_mup():
    make = lambda w: ResNet(w, in_channels=1)  # noqa: E731
    model = mt.parametrize(make(32), base=make(8), delta=make(16))
    table = mt.describe(model)
    roles = {
        line.split()[0]: line.split()[2] for line in table.splitlines() if re.match(r"^[a-z]\S*\.(weight|bias)\s", line)
    }
    assert roles["stem.weight"] == "input"
    assert roles["head.weight"] == "output"
    assert roles["layers.0.conv1.weight"] == roles["layers.1.conv1.weight"] == "hidden"  # width → width, and → 2·width
    assert roles["layers.1.shortcut.0.weight"] == "hidden"  # 1×1 projection shortcut
    assert all(roles[n] == "vector" for n in roles if re.search(r"(\.bn\d?|shortcut\.1)\.(weight|bias)$", n))
    # BatchNorm's running statistics are buffers, untouched
    assert all(not isinstance(b, torch.nn.Parameter) for _, b in model.named_buffers())


@pytest.mark.slow
def test_resnet_transfer_benchmark_quick(tmp_path):
    pytest.importorskip("sklearn", reason="the benchmark's data are scikit-learn's digits")
    path, plot = tmp_path / "r.json", tmp_path / "r.png"
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/resnet_transfer.py",
            "--quick",
            "--workers",
            "1",
            "--json",
            str(path),
            "--plot",
            str(plot),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "| Adam | µP |" in out and "| SGD m=0.9 | SP |" in out and "drift" in out, out
    data = json.loads(path.read_text())
    assert data["widths"] == [8, 24] and data["base_width"] == 8
    assert data["base_identical"] is True  # at the base width µP is the SP model, bit for bit
    assert set(data["optima"]) == {"adam/SP", "adam/µP", "sgd/SP", "sgd/µP"}
    for key, optima in data["optima"].items():
        grid = data["grids"][key.split("/")[0]]
        assert all(k in grid for k in optima.values()), (key, optima)
        best = [data["losses"][key][w][str(k)] for w, k in optima.items()]
        assert all(math.isfinite(v) and 0.0 < v < 0.5 for v in best), (key, best)  # chance level is ln 10 ≈ 2.3
    # the point of µP: Adam's optimum moves less across width than SP's (between grid points: the quick grid's
    # steps are 2 octaves, SP's expected drift over 3× width log2(3) = 1.6), and the base lr does better reused
    moved = data["interpolated_drift"]
    assert moved["adam/µP"] < 0.5 < moved["adam/SP"], data["interpolated"]
    assert data["transfer"]["adam/µP"]["loss_at_base_lr"] < data["transfer"]["adam/SP"]["loss_at_base_lr"]
    assert plot.stat().st_size > 10_000
