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


def test_run_cluster_takes_the_created_sweep_and_reads_nothing_again(tmp_path, counts, monkeypatch, capsys):
    """`run_cluster(sweep, plan)` works on what it is given: no config read, no storage opened, no
    `Sweep.create`; what it needs of the sweep it reads once, into a `SweepView` (the submission
    and the poll loop read that, never the `Sweep` again)."""
    from mutransfer.sweep import Sweep, load_config
    from mutransfer.sweep.launch import cluster

    cfg, run = _write(tmp_path), tmp_path / "run"
    config = load_config(cfg)
    plan = cluster.plan_cluster(config, run, overrides={"backend": "local", "jobs": 1})
    sweep = Sweep.create(cfg, run, config=config)
    seen = []

    def submitted(view, plan_):
        seen.append((view, plan_))
        raise _Submitted

    def refused(*a, **k):
        raise AssertionError("run_cluster created or loaded the sweep again")

    monkeypatch.setattr(cluster, "submit", submitted)
    monkeypatch.setattr(Sweep, "create", refused)
    monkeypatch.setattr("mutransfer.sweep.config.config.load_config", refused)
    counts()
    with pytest.raises(_Submitted):
        cluster.run_cluster(sweep, plan, detach=True, progress=False)
    assert counts() == {"toml": 0, "storage": 0}
    [(view, given)] = seen
    assert given is plan
    assert isinstance(view, cluster.SweepView)
    assert (view.name, view.url, view.total) == ("once", sweep.url, sweep.total_trials())
    assert [study.study_name for study, _ in view.studies] == [s.study_name for s in sweep.studies.all()]
    assert not hasattr(cluster, "load_config")  # the submitter has no way to read a config itself


def test_run_cluster_refuses_the_old_call_form_and_names_the_new_one(tmp_path):
    from mutransfer.sweep.launch.cluster import run_cluster

    cfg = _write(tmp_path)
    with pytest.raises(TypeError, match=r"plan_cluster\(config, run_dir.*Sweep\.create\(path"):
        run_cluster(cfg, tmp_path / "run")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes the created Sweep and a ClusterPlan"):
        run_cluster(str(cfg), tmp_path / "run", storage=None, detach=True)  # type: ignore[arg-type]
