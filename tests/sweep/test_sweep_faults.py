"""The sweep engine under faults and concurrency (issue 30): SIGTERM, workers that keep dying,
storage errors, two sweeps started together, two configs sharing a name."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from mutransfer.sweep import Sweep

SRC = Path(__file__).resolve().parents[2] / "src"

OBJECTIVE = textwrap.dedent("""
    import math, os, time
    from pathlib import Path

    def train(hp, scale):
        if not (Path(__file__).parent / "FAST").exists():  # while it exists, `sleep` is ignored
            time.sleep(float(hp.get("sleep", 0)))
        die = Path(__file__).parent / "DIE"  # while it exists, a trial at the lowest lr kills its worker
        if die.exists() and hp["lr"] < 2**-9:
            os.kill(os.getpid(), 9)
        return (math.log2(hp["lr"]) + 6) ** 2 + 1.0 / scale.width
""")

GRID = """
    name = "NAME"
    objective = "OBJ:train"
    widths = [16]
    parametrizations = ["mup"]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-10"
    high = "2**-2"
    grid = POINTS
    [fixed]
    sleep = SLEEP
"""


def write(tmp_path: Path, sleep: float = 0.0, points: int = 9, name: str = "faults", file: str = "sweep.toml") -> Path:
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    body = GRID.replace("OBJ", str(tmp_path / "obj.py")).replace("SLEEP", str(sleep))
    body = body.replace("POINTS", str(points)).replace("NAME", name)
    path = tmp_path / file
    path.write_text(textwrap.dedent(body))
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}


def trials(run: Path, name: str = "faults") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=f"{name}/mup/w16", storage=f"sqlite:///{run / 'sweep.db'}").get_trials()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by anyone) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_requeues_stops_the_workers_exits_143_and_a_rerun_finishes(tmp_path):
    """Issue 30, SIGTERM: the main process died and its workers were orphaned, still training."""
    cfg = write(tmp_path, sleep=1.5, points=16)  # long enough for the workers to warm up and join
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--no-progress"]
    proc = subprocess.Popen(
        cmd + ["--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    pids: set[int] = set()
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            time.sleep(0.2)
            try:
                ts = trials(run)
            except Exception:
                continue
            pids = {int(t.user_attrs["worker"].split(":")[1]) for t in ts if "worker" in t.user_attrs}
            running = {t.user_attrs.get("worker") for t in ts if t.state == TrialState.RUNNING}
            if len(pids - {proc.pid}) >= 1 and len(running) >= 2:
                break
        workers = pids - {proc.pid}
        assert workers, (proc.poll(), pids, proc.pid)
        proc.send_signal(signal.SIGTERM)  # to the main process only, as `kill PID` does
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"terminated: \d+ trials done, rerun to resume", lines[0]), err
    time.sleep(0.5)
    assert not [pid for pid in workers if alive(pid)]  # no orphan
    ts = trials(run)
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    cut = [t for t in ts if t.state == TrialState.FAIL]
    assert cut and all(t.user_attrs.get("interrupted") for t in cut)  # re-queued, not left to go stale

    (tmp_path / "FAST").touch()  # the slow trials were for the SIGTERM; the rerun only has to finish them
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
    assert rerun.returncode == 0, rerun.stderr
    complete = [t for t in trials(run) if t.state == TrialState.COMPLETE]
    assert len(complete) == 16 and len({t.params["lr"] for t in complete}) == 16  # all, once each


@pytest.mark.filterwarnings("ignore:Attempting to set identical")  # the report's plot of 1 point
@pytest.mark.slow
def test_a_point_whose_worker_keeps_dying_is_finished_as_failed_and_retry_failed_reruns_it(tmp_path):
    """Issue 30, stale trials: after Optuna's 3 retries the point was never finished and the sweep
    waited for ever; --retry-failed ignored it."""
    from mutransfer.sweep.engine.storage import ClaimLock
    from mutransfer.sweep.engine.trials import claim, run_trial

    cfg = write(tmp_path, points=2)
    sweep = Sweep.create(cfg, tmp_path / "run")
    sweep.prepare()
    sweep.storage.grace_period = 0  # a trial without a new heartbeat is stale within a second
    cell = sweep.config.all_cells[0]
    study = sweep.studies[cell]
    deaths = 0
    while deaths < 4:  # a worker takes the point at lr 2^-10 and dies, four times
        with ClaimLock(sweep.url):
            trial = claim(sweep.storage, study, sweep.config)
        assert trial is not None
        if trial.params.get("lr", study.trials[trial.number].system_attrs["fixed_params"]["lr"]) > 2**-9:
            run_trial(sweep.context(), study, trial, cell)  # the other point trains normally
            continue
        deaths += 1
        time.sleep(1.1)  # SQLite's clock has whole seconds
        sweep.studies.fail_stale()
    assert sweep.work(progress=False) == 0  # nothing left to wait for: the sweep ends
    tally = sweep.tally()
    assert (tally.unfinished, tally.failed, tally.complete) == (0, 1, 1)
    [failed] = [t for t in Sweep(tmp_path / "run").study(*cell).trials if t.user_attrs.get("failed")]
    assert failed.user_attrs["error"].startswith("worker died 4 times")
    assert {**failed.system_attrs["fixed_params"], **failed.params} == {"lr": 2**-10}

    from mutransfer.sweep.report.report import write_report

    write_report(sweep, tmp_path / "report")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [f["error"][:20] for f in summary["failures"]] == ["worker died 4 times "]

    assert sweep.retry_failed() == 1  # --retry-failed reruns it
    assert sweep.work(progress=False) == 1
    tally = sweep.tally()
    assert (tally.unfinished, tally.failed, tally.complete) == (0, 0, 2)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_sweeps_started_together_enqueue_each_point_once(tmp_path, backend):
    """Issue 30, concurrency: two `mutransfer sweep` of one config on one run directory started
    together enqueued twice (186 trials for 100 points) or failed with an alembic UNIQUE error."""
    url = os.environ.get("MUTRANSFER_TEST_POSTGRES") if backend == "postgresql" else None
    if backend == "postgresql" and not url:
        pytest.skip("needs MUTRANSFER_TEST_POSTGRES (run under scripts/with-postgres.sh)")
    name = f"faults{os.getpid()}x{int(time.time())}" if url else "faults"  # the server outlives the test
    cfg = write(tmp_path, points=40, name=name)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--no-progress"]
    cmd += ["--storage", url] if url else []
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()) for _ in "ab"]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    ts = optuna.load_study(study_name=f"{name}/mup/w16", storage=url).trials if url else trials(run)
    assert len(ts) == 40 and len({t.params["lr"] for t in ts}) == 40  # one trial per grid point
    assert all(t.state == TrialState.COMPLETE for t in ts)


def test_two_configs_with_one_name_on_one_storage_are_refused(tmp_path, capsys):
    """Issue 30, concurrency: two different configs with the same `name` shared studies."""
    from mutransfer.cli import main

    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    a = write(tmp_path, points=3, file="a.toml")
    b = write(tmp_path, points=4, file="b.toml")
    assert main(["sweep", str(a), "--run", str(tmp_path / "ra"), "--storage", storage, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sweep", str(b), "--run", str(tmp_path / "rb"), "--storage", storage, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "sweep name 'faults': the storage already holds a sweep of this name" in err
    assert "a.toml" in err and "b.toml" in err
    assert len(optuna.load_study(study_name="faults/mup/w16", storage=storage).trials) == 3
    # the same config again (another run directory) is the same sweep: it resumes
    assert main(["sweep", str(a), "--run", str(tmp_path / "ra2"), "--storage", storage, "--no-progress"]) == 0


class _Faults:
    """Makes the storage's sessions fail like a database that is restarting: `left` more times
    (None: for ever, once `on`)."""

    def __init__(self, monkeypatch, left: int | None):
        import optuna.storages._rdb.storage as rdb
        import sqlalchemy.exc

        self.left, self.on, self.seen = left, True, 0
        real = rdb._create_scoped_session

        def session(*args, **kwargs):
            if self.on and (self.left is None or self.left > 0):
                self.seen += 1
                if self.left is not None:
                    self.left -= 1
                cause = sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
                raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from cause
            return real(*args, **kwargs)

        monkeypatch.setattr(rdb, "_create_scoped_session", session)


def test_transient_storage_errors_are_retried_with_backoff(tmp_path, monkeypatch):
    """Issue 30, storage errors: a database restart mid-sweep killed the process with a
    StorageInternalError traceback."""
    monkeypatch.setenv("MUTRANSFER_STORAGE_PATIENCE", "60")
    sweep = Sweep.create(write(tmp_path, points=3), tmp_path / "run")
    sweep.prepare()
    faults = _Faults(monkeypatch, left=3)
    assert sweep.work(progress=False) == 3
    assert faults.seen == 3 and faults.left == 0
    assert sweep.tally().complete == 3


def test_a_storage_down_for_longer_than_the_patience_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    """Issue 30, storage errors: after a bounded wait, one line naming the storage and the fix."""
    from mutransfer.cli import main
    from mutransfer.sweep.engine.studies import Studies

    monkeypatch.setenv("MUTRANSFER_STORAGE_PATIENCE", "1")
    faults = None
    prepare = Studies.prepare

    def prepared_then_down(self, *args, **kwargs):
        nonlocal faults
        prepare(self, *args, **kwargs)
        faults = _Faults(monkeypatch, left=None)

    monkeypatch.setattr(Studies, "prepare", prepared_then_down)
    cfg = write(tmp_path, points=3)
    start = time.monotonic()
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 2
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.match(r"mutransfer sweep: error: storage sqlite:///\S+sweep\.db failed for 1 s \(", err), err
    assert "rerun the same command to resume" in err and "MUTRANSFER_STORAGE_PATIENCE" in err


@pytest.mark.slow
def test_the_soak_benchmark_quick_loses_and_duplicates_nothing():
    """benchmarks/sweep_soak.py --quick: workers killed every 5 s (not replaced: < 30 s), no trial lost
    or run twice, no lock error."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "sweep_soak.py"), "--quick", "--sqlite-only", "--no-respawn"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = done.stdout.splitlines()[1].split()
    # storage, workers, trials, seconds, setup, trials/s, first/last 60 trials/s, lost, duplicates, killed,
    # lock errors
    assert row[0] == "SQLite" and row[1:3] == ["4", "120"], done.stdout
    assert row[8:10] == ["0", "0"] and row[11] == "0", done.stdout


def test_per_trial_cost_does_not_grow_with_the_grid(tmp_path, monkeypatch):
    """Issue 30, soak: a 5,000-point grid did not finish. Enqueueing committed once per point (~5
    min), and every claim and progress count read the study through Optuna's cache, which re-reads
    every WAITING trial: ~0.3 trials/s. Now one transaction enqueues the grid, and claiming,
    running and counting a trial read a bounded number of trials whatever the grid's size."""
    import optuna.storages._rdb.storage as rdb

    from mutransfer.sweep.engine.storage import ClaimLock
    from mutransfer.sweep.engine.trials import claim, run_trial

    sessions = [0]
    scoped = rdb._create_scoped_session

    def counted_session(*args, **kwargs):
        sessions[0] += 1
        return scoped(*args, **kwargs)

    monkeypatch.setattr(rdb, "_create_scoped_session", counted_session)
    cfg = write(tmp_path, points=400)
    sweep = Sweep.create(cfg, tmp_path / "run")
    before = sessions[0]
    sweep.prepare()
    assert sessions[0] - before < 40  # not one transaction per point
    built = [0]
    build = rdb.RDBStorage._build_frozen_trial_from_trial_model

    def counted_build(self, model):
        built[0] += 1
        return build(self, model)

    monkeypatch.setattr(rdb.RDBStorage, "_build_frozen_trial_from_trial_model", counted_build)
    ctx = sweep.context()
    cell = sweep.config.all_cells[0]
    for _ in range(3):
        built[0] = 0
        with ClaimLock(sweep.url):
            trial = claim(sweep.storage, sweep.studies[cell], sweep.config)
        assert trial is not None
        assert run_trial(ctx, sweep.studies[cell], trial, cell) is None
        tally = sweep.tally()
        assert sweep.studies.running() == 0
        assert built[0] <= 10, built[0]  # not the 400 waiting trials (nor the finished ones)
    assert (tally.complete, tally.unfinished) == (3, 397)
    params = [t.params["lr"] for t in sweep.studies[cell].get_trials(states=(TrialState.COMPLETE,))]
    assert params == [p["lr"] for p in sweep.grid()[:3]]  # in grid order, once each
