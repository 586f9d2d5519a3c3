"""Issue 51: one command reads its sweep's TOML once and opens its storage once (the CLI hands the
loaded config down to `run_sweep` / `run_cluster` → `Sweep.create`; `status`, `report` and `transfer`
open the run once and pass the `Sweep` on)."""

import importlib
import sys
import textwrap

import pytest
import tomllib

from mutransfer.cli import main

OBJECTIVE = textwrap.dedent("""
    import math

    def train(hp, scale):
        target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))
        return (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.01 * scale.seed
""")
CONFIG = """
name = "once"
objective = "OBJ:train"
widths = [16, 32]
sampler = "grid"
[space.lr]
type = "log"
low = "2**-8"
high = "2**-4"
grid = 3
"""
MODULES = [
    "mutransfer.sweep.engine.storage",
    "mutransfer.sweep.engine.studies",
    "mutransfer.sweep.engine.runner",
    "mutransfer.sweep.launch.workers",
    "mutransfer.sweep.launch.cluster",
    "mutransfer.sweep.analysis.forecasts",
    "mutransfer.sweep.report.report",
    "mutransfer.sweep.transfer.transfer",
]


class _Submitted(Exception):
    pass


@pytest.fixture
def counts(monkeypatch):
    """Counts TOML parses (`tomllib.loads`) and storage opens (`open_storage`, wherever it is bound)."""
    seen = {"toml": 0, "storage": 0}
    loads = tomllib.loads

    def counting_loads(*a, **k):
        seen["toml"] += 1
        return loads(*a, **k)

    monkeypatch.setattr(tomllib, "loads", counting_loads)
    opener = importlib.import_module("mutransfer.sweep.engine.storage").open_storage

    def counting_open(*a, **k):
        seen["storage"] += 1
        return opener(*a, **k)

    for name in MODULES:
        importlib.import_module(name)
    for name, module in list(sys.modules.items()):
        if name.startswith("mutransfer.sweep") and getattr(module, "open_storage", None) is opener:
            monkeypatch.setattr(module, "open_storage", counting_open)

    def take():
        out = dict(seen)
        seen.update(toml=0, storage=0)
        return out

    return take


def _write(tmp_path):
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / "sweep.toml"
    path.write_text(CONFIG.replace("OBJ", str(tmp_path / "obj.py")))
    return path


def test_each_command_reads_the_config_once_and_opens_the_storage_once(tmp_path, counts, capsys):
    cfg, run = _write(tmp_path), tmp_path / "run"
    counts()
    assert main(["sweep", str(cfg), "--run", str(run), "--workers", "1", "--no-progress"]) == 0
    assert counts() == {"toml": 1, "storage": 1}, "sweep"
    for command in (["status", str(run)], ["report", str(run)], ["transfer", str(run), "--width", "64"]):
        assert main(command) == 0, command
        assert counts() == {"toml": 1, "storage": 1}, command[0]


def test_run_cluster_reads_the_config_once_and_opens_the_storage_once(tmp_path, counts, monkeypatch, capsys):
    cfg = _write(tmp_path)
    cfg.write_text(cfg.read_text() + '[cluster]\nbackend = "local"\njobs = 1\n')

    def submitted(sweep, *a, **k):
        raise _Submitted

    monkeypatch.setattr("mutransfer.sweep.launch.cluster.submit", submitted)
    counts()
    with pytest.raises(_Submitted):
        main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"])
    assert counts() == {"toml": 1, "storage": 1}
