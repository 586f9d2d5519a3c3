"""Sweeps on SQLite: configs, grid/random/TPE, workers, divergence, kill -9 and resume, report, transfer."""

import ast
import json
import math
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

from mutransfer.cli import main
from mutransfer.sweep import Sweep, config_from_dict, mask_url
from mutransfer.sweep.analysis.analysis import drift, load_results, max_drift_steps

OBJECTIVE = textwrap.dedent('''
    import math, os, time
    from pathlib import Path

    FLAG = Path(__file__).parent / "FAIL"  # holds the exception raised above `raise_above`
    FAST = Path(__file__).parent / "FAST"  # while it exists, `sleep` is ignored (a rerun that only has to finish)
    EXCEPTIONS = {"ValueError": ValueError, "KeyboardInterrupt": KeyboardInterrupt,
                  "sys.exit(3)": lambda message: SystemExit(3)}

    def train(hp, scale):
        """A synthetic loss whose optimum is at lr 2^-6 in µP and drifts as 1/width in SP."""
        if not FAST.exists():
            time.sleep(float(hp.get("sleep", 0)))
        if hp.get("until_processes"):  # wait until that many processes have each begun a trial (a guard, not a timing)
            (Path(__file__).parent / f"pid{os.getpid()}").touch()
            deadline = time.monotonic() + 300
            while len(list(Path(__file__).parent.glob("pid*"))) < hp["until_processes"] and time.monotonic() < deadline:
                time.sleep(0.05)
        if hp["lr"] > float(hp.get("raise_above", 1e9)) and FLAG.exists():
            raise EXCEPTIONS[FLAG.read_text().strip() or "ValueError"](f"boom at lr {hp['lr']:.4g}")
        if hp["lr"] > float(hp.get("diverge_above", 1e9)):
            return float("nan")
        target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))
        return (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.01 * scale.seed
''')


def write(tmp_path, body, objective=True):
    if objective:
        (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(body).replace("OBJ", str(tmp_path / "obj.py")))
    return path


GRID = """
    name = "synthetic"
    objective = "OBJ:train"
    widths = [16, 64]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-10"
    high = "2**-2"
    grid = 9
    [fixed]
    sleep = SLEEP
"""


SHORT_GRACE = "4"  # MUTRANSFER_GRACE_PERIOD for the tests that kill a worker (the default is 8 s)


def studies(sweep):
    return {cell: sweep.study(*cell) for cell in sweep.config.cells}


def test_grid_sweep_report_and_transfer(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    sweep = Sweep(run)
    for cell, study in studies(sweep).items():
        trials = study.get_trials(states=(TrialState.COMPLETE,))
        assert len(trials) == 9 and len({t.params["lr"] for t in trials}) == 9, cell
    results = load_results(sweep)
    assert drift(sweep, results, "mup", "lr") == 0.0
    assert drift(sweep, results, "sp", "lr") == -2.0  # 1/width over 4× width = 2 octaves
    assert max_drift_steps(sweep, results, "sp", "lr") == 2.0

    assert main(["report", str(run)]) == 0
    for name in ("report.html", "loss_vs_lr.png", "transferred.json", "summary.json"):
        assert (run / name).stat().st_size > 0, name
    assert json.loads((run / "transferred.json").read_text())["lr"] == 2**-6
    html = (run / "report.html").read_text()
    assert "loss_vs_lr.png" in html and "Drift" in html
    png = (run / "loss_vs_lr.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 20_000

    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "256"]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "transfer.json").read_text())
    assert result["mup"]["hparams"]["lr"] == 2**-6 and result["sp"]["hparams"]["lr"] == 2**-6
    assert result["mup"]["loss"] < result["sp"]["loss"]  # SP's proxy optimum is 4 octaves off at 256
    assert "µP target" in out and "sweep compute / one target run" in out
    assert main(["report", str(run)]) == 0  # the report now shows the transfer too
    assert "Transfer from width 16 to width 256" in (run / "report.html").read_text()


def test_rerunning_a_finished_sweep_runs_nothing_and_a_changed_config_is_refused(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    numbers = {c: [t.number for t in s.get_trials()] for c, s in studies(Sweep(run)).items()}
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert {c: [t.number for t in s.get_trials()] for c, s in studies(Sweep(run)).items()} == numbers
    cfg.write_text(cfg.read_text().replace("grid = 9", "grid = 5").replace('low = "2**-10"', 'low = "2**-12"'))
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "different config" in err
    # which keys differ, old → new as written, and where to run the new config instead
    assert 'space.lr.low: "2**-10" → "2**-12"' in err and "space.lr.grid: 9 → 5" in err, err
    assert f"--run {tmp_path / 'run-2'}" in err, err


def test_two_local_workers_run_every_trial_once(tmp_path):
    # each process's first trial waits for the other's, whenever the worker is done importing torch
    cfg = write(tmp_path, GRID.replace("SLEEP", "0") + "until_processes = 2\n")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--workers", "2", "--no-progress"]) == 0
    workers = set()
    for study in studies(Sweep(run)).values():
        trials = study.get_trials()
        assert all(t.state == TrialState.COMPLETE for t in trials)
        assert sorted(t.params["lr"] for t in trials) == sorted(set(t.params["lr"] for t in trials))
        assert len(trials) == 9
        workers |= {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2


def test_diverged_trials_are_recorded_and_the_sweep_goes_on(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0") + "diverge_above = 0.03\n")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    results = load_results(Sweep(run))
    diverged = [r for r in results if r.diverged]
    assert len(results) == 36 and len(diverged) == 4 * 2 * 2  # lrs 2^-5…2^-2 in 2 widths × 2 parametrizations
    assert all(math.isnan(r.loss) and r.params["lr"] > 0.03 for r in diverged)
    assert main(["report", str(run)]) == 0


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_random_and_tpe_run_n_trials_per_cell(tmp_path, sampler):
    body = GRID.replace("SLEEP", "0").replace('sampler = "grid"', f'sampler = "{sampler}"\n    n_trials = 6')
    cfg = write(tmp_path, body)
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 0
    for study in studies(Sweep(tmp_path / "run")).values():
        trials = study.get_trials(states=(TrialState.COMPLETE,))
        assert len(trials) == 6
        assert all(2**-10 <= t.params["lr"] <= 2**-2 for t in trials)


@pytest.mark.slow
def test_kill_9_then_rerun_resumes_without_losing_trials(tmp_path, monkeypatch):
    # a dead worker's trial goes stale after 4 s, not 8 (heartbeat every 1 s): the same path, a shorter wait
    monkeypatch.setenv("MUTRANSFER_GRACE_PERIOD", SHORT_GRACE)
    cfg = write(
        tmp_path,
        GRID.replace("SLEEP", "0.6")
        .replace("widths = [16, 64]", "widths = [16]")
        .replace('name = "synthetic"', 'name = "synthetic"\n    parametrizations = ["mup"]'),
    )
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    storage = f"sqlite:///{run / 'sweep.db'}"
    deadline = time.time() + 120
    done = []
    while time.time() < deadline:
        time.sleep(0.3)
        try:
            study = optuna.load_study(study_name="synthetic/mup/w16", storage=storage)
            done = study.get_trials(states=(TrialState.COMPLETE,))
        except Exception:
            continue
        if len(done) >= 3 and study.get_trials(states=(TrialState.RUNNING,)):
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: (t.params["lr"], t.value) for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert 3 <= len(before) < 9
    assert len(study.get_trials(states=(TrialState.RUNNING,))) == 1  # the trial that was cut off

    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    study = optuna.load_study(study_name="synthetic/mup/w16", storage=storage)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    after = {t.number: (t.params["lr"], t.value) for t in complete}
    assert all(after[n] == v for n, v in before.items())  # every completed trial kept as it was
    assert sorted(lr for lr, _ in after.values()) == sorted({lr for lr, _ in after.values()})
    assert len(after) == 9  # the interrupted one retried, nothing run twice
    assert len(study.get_trials(states=(TrialState.FAIL,))) == 1  # the dead worker's trial, marked stale


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: "bogus = 1\n" + s, "unknown key(s) bogus"),
        (lambda s: s.replace('high = "2**-2"', 'high = "2**-12"'), "space.lr: low"),
        (lambda s: s.replace('type = "log"', 'type = "loglog"'), "space.lr.type"),
        (lambda s: s.replace('sampler = "grid"', 'sampler = "cmaes"'), "sampler"),
        (lambda s: s.replace("widths = [16, 64]", "widths = []"), "widths"),
        (lambda s: s.replace("widths = [16, 64]", "widths = [16, 64"), "not valid TOML"),
        # a repeated choice is one grid point for Optuna but two in the count: the sweep never finished
        (
            lambda s: s.replace(
                "[fixed]", '[space.act]\n    type = "choice"\n    values = ["a", "a", "b"]\n    [fixed]'
            ),
            'space.act.values has duplicates: "a" and "a"',
        ),
        (
            lambda s: s.replace("[fixed]", '[space.act]\n    type = "choice"\n    values = [1, true]\n    [fixed]'),
            "space.act.values has duplicates: 1 and true",
        ),
        (
            lambda s: s.replace("widths = [16, 64]", "widths = [16, 64]\n    target_width = 8"),
            "target_width (8) is below the smallest of widths (16)",
        ),
        (
            lambda s: s.replace("widths = [16, 64]", "widths = [16, 64]\n    depths = [2, 4]\n    target_depth = 1"),
            "target_depth (1) is below the smallest of depths (2)",
        ),
    ],
)
def test_bad_config_fails_at_once_with_exit_2(tmp_path, capsys, edit, message):
    cfg = write(tmp_path, edit(GRID.replace("SLEEP", "0")))
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(cfg) in err
    assert not (tmp_path / "run" / "sweep.db").exists()


def test_unreachable_storage_exits_2_without_leaking_credentials(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    code = main(
        [
            "sweep",
            str(cfg),
            "--run",
            str(tmp_path / "run"),
            "--storage",
            "sqlite:////nonexistent-dir/x/sweep.db",
            "--no-progress",
        ]
    )
    assert code == 2
    assert "unreachable" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing left behind: the corrected rerun starts afresh
    assert (
        main(
            [
                "sweep",
                str(cfg),
                "--run",
                str(tmp_path / "run2"),
                "--storage",
                "mysql://bob:hunter2@localhost/db",
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "hunter2" not in err and "bob:***@" in err


def test_unknown_objective_fails_at_once(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace('"OBJ:train"', '"recipe:resnet"'))
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "unknown recipe" in capsys.readouterr().err


def test_the_example_in_the_config_docstring_validates():
    from mutransfer.sweep.config import config as config_module
    from mutransfer.sweep.config.config import tomllib  # tomli before Python 3.11

    block = re.search(r"```toml\n(.*?)```", config_module.__doc__, re.S)
    assert block, "the config module's docstring has no ```toml example"
    cfg = config_from_dict(tomllib.loads(block.group(1)), "the docstring example")
    assert cfg.name == "gpt-lr" and cfg.target_width == 512 and cfg.axes["steps"] == [100, 200, 400]


def test_mask_url():
    assert mask_url("postgresql://u:p4ss@db.example:5432/x") == "postgresql://u:***@db.example:5432/x"
    assert mask_url("postgresql://u@host/x") == "postgresql://u@host/x"
    assert mask_url("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


def test_config_from_python_matches_toml():
    cfg = config_from_dict(
        {"objective": "recipe:mlp", "widths": [64, 32], "space": {"lr": {"low": 1e-4, "high": 1e-2, "grid": 3}}}
    )
    assert cfg.widths == [32, 64] and cfg.base_width == 32 and cfg.sampler == "grid"
    assert [round(math.log10(v), 6) for v in cfg.space["lr"].grid_points()] == [-4, -3, -2]
    with pytest.raises(ValueError, match="both swept"):
        config_from_dict(
            {"objective": "recipe:mlp", "widths": [8], "space": {"lr": {"low": 1, "high": 2}}, "fixed": {"lr": 1}}
        )


def test_a_worker_elsewhere_joins_by_sweep_name_and_storage(tmp_path, monkeypatch):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--storage", storage, "--no-progress"]) == 0
    elsewhere = tmp_path / "other-machine"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["worker", "synthetic", "--storage", storage, "--no-progress"]) == 0  # nothing left to do
    copy = (elsewhere / "synthetic" / "config.toml").read_text()
    assert (
        copy
        == f'config_dir = "{tmp_path}"  # added by mutransfer: relative paths below resolve here\n' + cfg.read_text()
    )


@pytest.mark.slow
def test_a_worker_dying_right_after_claiming_does_not_block_the_sweep(tmp_path, monkeypatch):
    # a dead worker's trial goes stale after 4 s, not 8 (heartbeat every 1 s): the same path, a shorter wait
    monkeypatch.setenv("MUTRANSFER_GRACE_PERIOD", SHORT_GRACE)
    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace("widths = [16, 64]", "widths = [16]"))
    run = tmp_path / "run"
    Sweep.create(cfg, run).prepare()
    # A worker that dies right after its claim leaves in the storage what this claim leaves: a
    # RUNNING trial with its first heartbeat and no further one (no heartbeat thread runs here).
    from mutransfer.sweep.engine.trials import claim

    claimer = Sweep(run)
    assert claim(claimer.storage, claimer.study("mup", 16), claimer.config) is not None
    claimer.storage.engine.dispose()
    # Without a first heartbeat the claimed trial never goes stale and the worker waits for it
    # forever; the timeout only guards against that hang (it is no speed requirement).
    worker = subprocess.run(
        [sys.executable, "-m", "mutransfer.cli", "worker", str(run), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert worker.returncode == 0, worker.stderr
    sweep = Sweep(run)
    for study in studies(sweep).values():
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 9
    stale = sweep.study("mup", 16).get_trials(states=(TrialState.FAIL,))
    assert len(stale) == 1 and not stale[0].user_attrs  # failed by its heartbeat going stale, then retried


def test_a_worker_killed_between_its_claims_two_commits_leaves_a_trial_that_can_go_stale(tmp_path):
    """The soak test once hung for good: a worker was killed after its claim committed RUNNING and
    before the first heartbeat, and a RUNNING trial with no heartbeat is never found stale. The claim
    now records the heartbeat first; here the kill comes right after the RUNNING commit."""
    import sqlite3

    from mutransfer.sweep.engine.trials import claim

    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace("widths = [16, 64]", "widths = [16]"))
    run = tmp_path / "run"
    Sweep.create(cfg, run).prepare()
    claimer = Sweep(run)
    storage, commit = claimer.storage, claimer.storage.set_trial_state_values

    class Killed(BaseException):
        pass

    def set_state_then_die(trial_id, state, *args, **kwargs):
        commit(trial_id, state, *args, **kwargs)
        raise Killed  # SIGKILL: nothing after the commit runs, no cleanup

    storage.set_trial_state_values = set_state_then_die
    with pytest.raises(Killed):
        claim(storage, claimer.study("mup", 16), claimer.config)
    storage.engine.dispose()
    with sqlite3.connect(run / "sweep.db") as db:
        running = db.execute("select trial_id from trials where state = 'RUNNING'").fetchall()
        beats = {t for (t,) in db.execute("select trial_id from trial_heartbeats").fetchall()}
    assert len(running) == 1 and running[0][0] in beats  # the stale check can find it


DIES = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    MARK = Path(__file__).parent / "died"

    def train(hp, scale):
        if os.getpid() != int(os.environ["DIES_MAIN_PID"]):  # a worker process run_sweep started: its first trial kills it
            if not MARK.exists():
                MARK.touch()
                os.kill(os.getpid(), getattr(signal, hp["signal"]))
                time.sleep(60)  # the signal ends the process first
        else:  # the main process: its first trial waits until the worker is dead (a guard, not a timing)
            deadline = time.monotonic() + 300
            while not MARK.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        return (hp["lr"] - 0.01) ** 2
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig, shown", [("SIGKILL", "-9 (killed by SIGKILL)"), ("SIGINT", "130 (interrupted)")])
def test_a_dead_worker_process_is_a_warning_when_every_trial_finished(tmp_path, capsys, monkeypatch, sig, shown):
    """A local worker killed (or sent SIGINT on its own: a sweep started with `&`) while this
    process goes on: its trial is retried here, the sweep completes, the exit is a warning line."""
    (tmp_path / "dies.py").write_text(DIES)
    # a dead worker's trial goes stale after 4 s, not 8 (heartbeat every 1 s): the same path, a shorter wait
    monkeypatch.setenv("MUTRANSFER_GRACE_PERIOD", SHORT_GRACE)
    # The test's own process is told apart by its pid: under pytest-xdist it too was started as `python -c`.
    monkeypatch.setenv("DIES_MAIN_PID", str(os.getpid()))
    cfg = write(
        tmp_path,
        f'''
        name = "dies"
        objective = "dies.py:train"
        widths = [16]
        parametrizations = ["mup"]
        [space.lr]
        low = "2**-10"
        high = "2**-2"
        grid = 3
        [fixed]
        signal = "{sig}"
    ''',
        objective=False,
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--workers", "2", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert (tmp_path / "died").exists()  # the worker did run (and die on) a trial
    assert "3/3 trials done, storage" in out.strip().splitlines()[-1], (out, err)
    warnings = [line for line in err.splitlines() if "worker process" in line]
    assert len(warnings) == 1 and re.fullmatch(
        rf"warning: worker process \d+ exited with {re.escape(shown)}; its "
        r"trials were retried",
        warnings[0],
    ), err
    study = Sweep(run).study("mup", 16)
    assert sorted(t.params["lr"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == [
        2.0**-10,
        2.0**-6,
        2.0**-2,
    ]
    assert json.loads((run / "run.json").read_text())["finished_trials"] == 3


@pytest.mark.slow
def test_a_worker_started_before_the_sweep_waits_for_it(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0.05"))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mutransfer.cli",
            "worker",
            "synthetic",
            "--storage",
            storage,
            "--no-progress",
            "--wait",
            "60",
        ],
        cwd=elsewhere,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--storage", storage, "--no-progress"]) == 0
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    for study in studies(Sweep(tmp_path / "run", storage=storage)).values():
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 9


def test_claim_lock_excludes_other_processes_on_sqlite(tmp_path):
    """SQLite ignores SELECT … FOR UPDATE, so claims are serialized by a file lock."""
    from mutransfer.sweep.engine.storage import ClaimLock

    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    probe = (
        "import fcntl, sys\nf = open(sys.argv[1], 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
        "except BlockingIOError:\n    print('held')\n"
    )
    lock_file = str(tmp_path / "sweep.db.claim-lock")
    with ClaimLock(url):
        held = subprocess.run([sys.executable, "-c", probe, lock_file], capture_output=True, text=True).stdout
    free = subprocess.run([sys.executable, "-c", probe, lock_file], capture_output=True, text=True).stdout
    assert held.strip() == "held" and free.strip() == "free"
    assert ClaimLock("postgresql://u@localhost/db").path is None


# ---------------------------------------------------------------------------- failed trials

FAILING = GRID.replace("SLEEP", "0") + "raise_above = 0.03\n"  # lrs 2^-5…2^-2 raise: 4 of 9 per cell
BIG_LRS = [2.0**e for e in (-5, -4, -3, -2)]


def test_a_failing_trial_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    cfg = write(tmp_path, FAILING)
    (tmp_path / "FAIL").write_text("ValueError")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    final = out.strip().splitlines()[-1]
    assert "36/36 trials done" in final and "16 failed" in final and "--retry-failed" in final, final
    lines = [line for line in err.splitlines() if " failed: " in line]
    assert len(lines) == 16, err
    pattern = (
        r"trial (\d+) \((mup|sp) width (16|64)\) failed: ValueError: boom at lr \S+ — traceback in "
        r"(.*failures/synthetic_(mup|sp)_w(16|64)-trial\d+\.txt)"
    )
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    assert "Traceback" not in err

    sweep = Sweep(run)
    for (p, w, _), study in studies(sweep).items():
        trials = study.get_trials()
        assert len(trials) == 9
        failed = [t for t in trials if t.state == TrialState.FAIL]
        assert sorted(t.params["lr"] for t in failed) == BIG_LRS
        assert all(t.state == TrialState.COMPLETE for t in trials if t.params["lr"] < 0.03)
        for t in failed:
            assert t.user_attrs["failed"] is True and "diverged" not in t.user_attrs
            assert t.user_attrs["error"] == f"ValueError: boom at lr {t.params['lr']:.4g}"
            assert "Traceback" in t.user_attrs["traceback"] and "raise EXCEPTIONS" in t.user_attrs["traceback"]
            text = (run / "failures" / f"synthetic_{p}_w{w}-trial{t.number}.txt").read_text()
            for line in (
                f"width: {w}",
                "depth: None",
                f"parametrization: {p}",
                "seed: 0",
                f"params: {json.dumps({'lr': t.params['lr']})}",
                "ValueError: boom at lr",
            ):
                assert line in text, (line, text)
            assert "Traceback (most recent call last)" in text and "raise EXCEPTIONS" in text
    assert sweep.finished() == sweep.total_trials() == 36 and sweep.failed() == 16
    assert json.loads((run / "run.json").read_text())["failed_trials"] == 16

    numbers = {c: [t.number for t in s.get_trials()] for c, s in studies(sweep).items()}
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0  # a failed trial counts as done
    assert {c: [t.number for t in s.get_trials()] for c, s in studies(Sweep(run)).items()} == numbers
    assert "16 failed" in capsys.readouterr().out


def test_retry_failed_runs_each_failed_trial_once_more(tmp_path, capsys):
    cfg = write(tmp_path, FAILING)
    (tmp_path / "FAIL").write_text("ValueError")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    (tmp_path / "FAIL").unlink()  # the bug is fixed
    capsys.readouterr()
    assert main(["sweep", str(cfg), "--run", str(run), "--retry-failed", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "retrying 16 failed trial(s)" in err and "36/36 trials done, storage" in out.strip().splitlines()[-1]
    sweep = Sweep(run)
    for study in studies(sweep).values():
        complete = study.get_trials(states=(TrialState.COMPLETE,))
        assert sorted(t.params["lr"] for t in complete) == sorted(GRID_LRS)
        old = study.get_trials(states=(TrialState.FAIL,))
        assert len(old) == 4 and all(t.user_attrs["retried"] is True and t.user_attrs["failed"] for t in old)
        retries = {t.user_attrs["retry_of"]: t.params["lr"] for t in complete if "retry_of" in t.user_attrs}
        assert retries == {t.number: t.params["lr"] for t in old}
    assert sweep.failed() == 0 and sweep.finished() == 36
    assert sweep.retry_failed() == 0  # each failed trial is retried once
    assert not list((run / "failures").iterdir())  # the retried trials' tracebacks are gone: nothing is failing


def test_a_retry_that_fails_again_replaces_the_old_traceback_file(tmp_path, capsys):
    cfg = write(tmp_path, FAILING)
    (tmp_path / "FAIL").write_text("ValueError")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert main(["sweep", str(cfg), "--run", str(run), "--retry-failed", "--no-progress"]) == 0  # not fixed
    sweep = Sweep(run)
    current = {
        f"synthetic_{p}_w{w}-trial{t.number}.txt"
        for (p, w, _), study in studies(sweep).items()
        for t in study.get_trials(states=(TrialState.FAIL,))
        if "retried" not in t.user_attrs
    }
    assert len(current) == 16 and sweep.failed() == 16
    assert {f.name for f in (run / "failures").iterdir()} == current  # one file per current failure


GRID_LRS = [2.0**e for e in range(-10, -1)]


def test_random_sampler_counts_failed_trials_and_retries_them(tmp_path):
    from mutransfer.sweep import run_sweep

    body = FAILING.replace('sampler = "grid"', 'sampler = "random"\n    n_trials = 6')
    cfg = write(tmp_path, body)
    (tmp_path / "FAIL").write_text("ValueError")
    run = tmp_path / "run"
    sweep = run_sweep(cfg, run, progress=False)
    failed = {}
    for cell, study in studies(sweep).items():
        trials = study.get_trials()
        assert len(trials) == 6 and all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials)
        failed[cell] = sorted(t.params["lr"] for t in trials if t.state == TrialState.FAIL)
        assert all(lr > 0.03 for lr in failed[cell])
    assert sum(map(len, failed.values())) == sweep.failed() > 0
    run_sweep(cfg, run, progress=False)  # nothing left to run
    assert sum(len(s.get_trials()) for s in studies(Sweep(run)).values()) == 24
    (tmp_path / "FAIL").unlink()
    sweep = run_sweep(cfg, run, progress=False, retry_failed=True)
    for cell, study in studies(sweep).items():
        retried = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if "retry_of" in t.user_attrs]
        assert sorted(t.params["lr"] for t in retried) == failed[cell]
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 6
    assert sweep.failed() == 0


@pytest.mark.parametrize("kind", ["KeyboardInterrupt"])
def test_an_interrupted_trial_is_not_a_failure_and_is_requeued(tmp_path, kind):
    from mutransfer.sweep import run_sweep

    body = FAILING.replace("widths = [16, 64]", "widths = [16]").replace(
        'name = "synthetic"', 'name = "synthetic"\n    parametrizations = ["mup"]'
    )
    cfg = write(tmp_path, body)
    (tmp_path / "FAIL").write_text(kind)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, run, progress=False)
    study = Sweep(run).study("mup", 16)
    interrupted = study.get_trials(states=(TrialState.FAIL,))
    assert len(interrupted) == 1 and interrupted[0].user_attrs["interrupted"] is True
    assert "failed" not in interrupted[0].user_attrs
    assert not study.get_trials(states=(TrialState.RUNNING,))
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert interrupted[0].params["lr"] in [t.system_attrs["fixed_params"]["lr"] for t in waiting]
    (tmp_path / "FAIL").unlink()
    sweep = run_sweep(cfg, run, progress=False)
    assert sorted(t.params["lr"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == GRID_LRS
    assert sweep.finished() == 9 and sweep.failed() == 0


def test_an_objective_calling_sys_exit_fails_its_trial_and_the_sweep_goes_on(tmp_path, capsys):
    """argparse's parse_args calls sys.exit: that is the trial's failure, not the sweep's end (it
    used to end the sweep and requeue the trial, so that every rerun died the same way)."""
    cfg = write(tmp_path, FAILING)
    (tmp_path / "FAIL").write_text("sys.exit(3)")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "36/36 trials done, 16 failed" in out.strip().splitlines()[-1]
    lines = [line for line in err.splitlines() if " failed: " in line]
    assert len(lines) == 16 and all(
        "failed: the objective called sys.exit(3) (argparse's parse_args" in line for line in lines
    ), err
    sweep = Sweep(run)
    for study in studies(sweep).values():
        failed = study.get_trials(states=(TrialState.FAIL,))
        assert sorted(t.params["lr"] for t in failed) == BIG_LRS
        assert all(t.user_attrs["failed"] and "interrupted" not in t.user_attrs for t in failed)
        assert all(t.user_attrs["error"].startswith("the objective called sys.exit(3)") for t in failed)
        assert not study.get_trials(states=(TrialState.WAITING, TrialState.RUNNING))


RETURNS = textwrap.dedent("""
    import math
    def train(hp, scale):
        loss = (math.log2(hp["lr"]) + 6) ** 2
        kind = hp["returns"]
        if kind == "numpy":
            import numpy
            return numpy.float32(loss)
        if kind == "tensor":
            import torch
            return torch.tensor(loss)
        if kind == "int":
            return int(loss)
        return {"none": None, "string": str(loss), "list": [loss], "bool": True}[kind]
""")


@pytest.mark.parametrize(
    "kind, message",
    [
        ("none", r"the objective returned None; it must return the training loss as a float"),
        ("string", r"the objective returned '(0|16)\.0' \(str\); it must return the training loss as a float"),
        ("list", r"the objective returned \[(0|16)\.0\] \(list\); it must return the training loss as a float"),
        ("bool", r"the objective returned True \(bool\); it must return the training loss as a float"),
        ("numpy", None),
        ("tensor", None),
        ("int", None),
    ],
)
def test_an_objective_must_return_a_number(tmp_path, capsys, kind, message):
    """None, a string or a list fails the trial with what was wrong (not a TypeError from inside the
    runner, not a string read as a number); a sweep where every trial failed exits 1 and says so."""
    (tmp_path / "ret.py").write_text(RETURNS)
    cfg = write(
        tmp_path,
        f'''
        name = "ret"
        objective = "ret.py:train"
        widths = [16]
        parametrizations = ["mup"]
        [space.lr]
        low = "2**-10"
        high = "2**-2"
        grid = 3
        [fixed]
        returns = "{kind}"
    ''',
        objective=False,
    )
    run = tmp_path / "run"
    code = main(["sweep", str(cfg), "--run", str(run), "--no-progress"])
    out, err = capsys.readouterr()
    final = out.strip().splitlines()[-1]
    trials = Sweep(run).study("mup", 16).get_trials()
    if message is None:
        assert code == 0 and "3/3 trials done, storage" in final, (out, err)
        assert sorted(t.value for t in trials) == [0.0, 16.0, 16.0]
        return
    assert code == 1, (out, err)
    assert "3/3 trials done, every one failed" in final and "no trial completed" in final, final
    lines = [line for line in err.splitlines() if " failed: " in line]
    assert len(lines) == 3 and all(re.search("failed: " + message, line) for line in lines), err
    assert "Traceback" not in err and "runner.py" not in err
    assert all(re.match(message, t.user_attrs["error"]) for t in trials)
    assert all("runner.py" not in f.read_text() for f in (run / "failures").iterdir())


@pytest.mark.slow
def test_ctrl_c_prints_one_line_exits_130_and_a_rerun_resumes_at_once(tmp_path):
    # trials long against the gap between seeing two running and the Ctrl-C reaching them (0.3 s
    # trials once let both finish in that gap: nothing was left to mark interrupted)
    cfg = write(tmp_path, GRID.replace("SLEEP", "0.8").replace("widths = [16, 64]", "widths = [16]"))
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--no-progress"]
    # As from a terminal: SIGINT at its default in the child. Under `make test` pytest may run with
    # SIGINT ignored (a background job of a non-interactive shell), and an ignored SIGINT is
    # inherited through exec: the sweep would never see the Ctrl-C.
    proc = subprocess.Popen(
        cmd + ["--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    storage = f"sqlite:///{run / 'sweep.db'}"
    deadline = time.time() + 180  # a guard against a hang, not a speed requirement
    while time.time() < deadline:
        time.sleep(0.2)
        try:
            trials = [
                t
                for p in ("mup", "sp")
                for t in optuna.load_study(study_name=f"synthetic/{p}/w16", storage=storage).get_trials()
            ]
        except Exception:
            continue
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        if len(done) >= 2 and len([t for t in trials if t.state == TrialState.RUNNING]) >= 2:
            break
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "worker" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    m = re.fullmatch(r"interrupted: (\d+) trials done, rerun to resume", lines[0])
    assert m, err
    sweep = Sweep(run)
    assert int(m.group(1)) == sweep.finished() >= 2
    interrupted = []
    for study in studies(sweep).values():
        assert not study.get_trials(states=(TrialState.RUNNING,))
        interrupted += study.get_trials(states=(TrialState.FAIL,))
    # the trials running at the interrupt (in either process) are marked, none is left RUNNING
    assert interrupted and all(t.user_attrs.get("interrupted") for t in interrupted)

    (tmp_path / "FAST").touch()  # the slow trials were for the Ctrl-C; the rerun only has to finish them
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    for study in studies(Sweep(run)).values():
        assert sorted(t.params["lr"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == GRID_LRS
        assert not study.get_trials(states=(TrialState.WAITING, TrialState.RUNNING))
        # every failed trial is one marked at the interrupt: none had to go stale first
        assert all(t.user_attrs.get("interrupted") for t in study.get_trials(states=(TrialState.FAIL,)))


def test_ctrl_c_in_the_demo_prints_one_line_and_exits_130(tmp_path, capsys, monkeypatch):
    import mutransfer.sweep.transfer.demo as demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run_demo", interrupted)
    assert main(["demo", "--out", str(tmp_path), "--no-progress"]) == 130
    _out, err = capsys.readouterr()
    assert err == "interrupted: 0 trials done, rerun to resume\n"


# ---------------------------------------------------------------------------- bad objectives, paths


@pytest.mark.parametrize(
    "source, spec, message",
    [
        (None, "obj2.py:train", "not found"),
        (OBJECTIVE, "obj2.py:nosuch", "has no function 'nosuch'"),
        ("raise RuntimeError('no GPU here')\n", "obj2.py:train", "RuntimeError: no GPU here"),
        ("def train(:\n", "obj2.py:train", "SyntaxError"),
    ],
)
def test_a_bad_objective_leaves_nothing_behind_and_the_corrected_rerun_works(tmp_path, capsys, source, spec, message):
    if source is not None:
        (tmp_path / "obj2.py").write_text(source)
    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace('"OBJ:train"', f'"{tmp_path}/{spec}"'))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "obj2.py" in err and "Traceback" not in err, err
    assert not run.exists()
    cfg.write_text(cfg.read_text().replace(f"{tmp_path}/{spec}", f"{tmp_path}/obj.py:train"))
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0


def _children() -> set[int]:
    """This process's child processes not yet reaped (Linux /proc)."""
    pids = set()
    for task in Path("/proc/self/task").iterdir():
        pids |= {int(p) for p in (task / "children").read_text().split()}
    return pids


def test_a_refused_sweep_with_workers_leaves_no_worker_running(tmp_path, capsys):
    # the workers start before the sweep is checked (they warm up meanwhile): a refused sweep
    # must send them away, not leave them waiting or running
    before = _children()
    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace('"OBJ:train"', f'"{tmp_path}/obj2.py:train"'))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--workers", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "Traceback" not in err and "worker" not in err, err
    assert _children() == before and not run.exists()


def test_relative_paths_in_the_toml_resolve_next_to_it(tmp_path, monkeypatch):
    project, elsewhere, third = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "third"
    for d in (project, elsewhere, third):
        d.mkdir()
    (project / "obj.py").write_text(OBJECTIVE)
    cfg = project / "sweep.toml"
    cfg.write_text(
        textwrap.dedent(GRID.replace("SLEEP", "0"))
        .replace('"OBJ:train"', '"obj.py:train"')
        .replace('sampler = "grid"', 'sampler = "grid"\nstorage = "sqlite:///rel.db"')
    )
    run = tmp_path / "run"
    monkeypatch.chdir(elsewhere)
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert (project / "rel.db").is_file() and not (elsewhere / "rel.db").exists()
    monkeypatch.chdir(third)  # resuming from anywhere: the run's copy of the config still finds both
    sweep = Sweep(run)
    assert sweep.url == f"sqlite:///{project / 'rel.db'}"
    assert sweep.objective({"lr": 2**-6}, sweep.scale("mup", 16, None, 0)) == pytest.approx(1 / 16)
    assert sweep.finished() == 36
    assert main(["worker", str(run), "--no-progress"]) == 0
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0


def test_a_module_objective_is_importable_from_the_toml_directory(tmp_path, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "mt_test_toml_dir_objective.py").write_text(OBJECTIVE)
    cfg = project / "sweep.toml"
    cfg.write_text(
        textwrap.dedent(GRID.replace("SLEEP", "0")).replace('"OBJ:train"', '"mt_test_toml_dir_objective:train"')
    )
    monkeypatch.chdir(elsewhere)
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 0
    assert Sweep(tmp_path / "run").finished() == 36


def test_the_library_does_not_import_the_cli():
    import mutransfer

    root = os.path.dirname(mutransfer.__file__)
    offenders = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not name.endswith(".py") or path == os.path.join(root, "cli.py"):
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom):
                    module = node.module or ""
                    names = [a.name for a in node.names]
                    if (
                        module.endswith("cli")
                        or module == "mutransfer.cli"
                        or (module in ("", "mutransfer") and "cli" in names)
                    ):
                        offenders.append(os.path.relpath(path, root))
                elif isinstance(node, ast.Import) and any(a.name == "mutransfer.cli" for a in node.names):
                    offenders.append(os.path.relpath(path, root))
    assert not offenders


def test_loading_errors_are_value_errors_naming_the_file(tmp_path):
    from mutransfer._core.loading import load_callable

    bad = tmp_path / "broken_at_import.py"
    bad.write_text("import math\nraise KeyError('missing setting')\n")
    with pytest.raises(ValueError, match=r"broken_at_import\.py.*KeyError: 'missing setting'"):
        load_callable(f"{bad}:train", "objective")
    (tmp_path / "fine.py").write_text("def train(hp, scale):\n    return 1.0\n")
    assert load_callable("fine.py:train", "objective", base_dir=tmp_path)({}, None) == 1.0
    with pytest.raises(ValueError, match="module:function"):
        load_callable("no-colon", "objective")


# ---------------------------------------------------------------------------- transfer


def test_transfer_refuses_a_target_narrower_than_the_proxy_and_warns_at_the_proxy(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "8"]) == 2
    err = capsys.readouterr().err
    assert "--width 8" in err and "proxy width 16" in err
    assert not (run / "transfer.json").exists()
    assert main(["transfer", str(run), "--width", "16"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "--width 16" in err and "proxy width" in err
    assert json.loads((run / "transfer.json").read_text())["target_width"] == 16


def test_transfer_refuses_a_target_shallower_than_the_proxy_depth(tmp_path, capsys):
    body = GRID.replace("SLEEP", "0").replace("widths = [16, 64]", "widths = [16]\n    depths = [2, 4]")
    cfg = write(tmp_path, body.replace("grid = 9", "grid = 3"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "32", "--depth", "1"]) == 2
    err = capsys.readouterr().err
    assert "--depth 1" in err and "proxy depth 2" in err
    assert main(["transfer", str(run), "--width", "32", "--depth", "2"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "--depth 2" in err


def test_transfer_after_the_report_updates_it_and_records_cpu_seconds(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert main(["report", str(run)]) == 0
    assert "Transfer from" not in (run / "report.html").read_text()
    assert main(["transfer", str(run), "--width", "64"]) == 0
    assert "Transfer from width 16 to width 64" in (run / "report.html").read_text()
    data = json.loads((run / "transfer.json").read_text())
    for p in ("mup", "sp"):  # the cheapest seed × the seeds (transfer's docstring: setup left out)
        per_seed = data[p]["cpu_seconds_per_seed"]
        assert len(per_seed) == len(data["seeds"]) and all(isinstance(c, float) for c in per_seed)
        assert data[p]["cpu_seconds"] == pytest.approx(min(per_seed) * len(per_seed))
        assert isinstance(data[p]["seconds"], float) and data[p]["seconds"] > 0
    for study in studies(Sweep(run)).values():
        for t in study.get_trials():  # a trial's own process time: at most its wall time on its threads
            a = t.user_attrs
            assert isinstance(a["cpu_seconds"], float) and 0 <= a["cpu_seconds"] <= a["seconds"] * a["threads"] + 0.05


def test_a_sweep_leaves_optunas_log_level_as_it_found_it(tmp_path, capsys):
    from mutransfer.sweep import run_sweep

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)  # a user who wants Optuna's own lines elsewhere
    try:
        cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace("widths = [16, 64]", "widths = [16]"))
        run_sweep(cfg, tmp_path / "run", progress=False)
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
        err = capsys.readouterr().err
        assert "A new study created" not in err and "finished with value" not in err, err[-500:]
    finally:
        optuna.logging.set_verbosity(before)


def test_importing_the_sweep_module_does_not_change_optunas_log_level():
    code = (
        "import optuna; v = optuna.logging.get_verbosity(); import mutransfer.sweep.engine.runner, mutransfer.cli; "
        "print(v == optuna.logging.get_verbosity())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


COUNTING = textwrap.dedent("""
    import math
    from pathlib import Path

    CALLS = Path(__file__).parent / "calls"

    def train(hp, scale):
        with CALLS.open("a") as f:
            f.write(f"{scale.parametrization} {scale.width} {scale.seed}\\n")
        target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))
        return (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.01 * scale.seed
""")


def test_a_transfer_to_a_swept_width_reuses_the_sweeps_runs_but_the_monitored_one(tmp_path, capsys):
    """The target at the largest swept width with the proxy's optimum is a trial the sweep ran: its
    losses and CPU time are taken from it (only µP's first seed trains, for the monitor); a target
    at an unswept width trains every seed."""
    (tmp_path / "obj.py").write_text(COUNTING)
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'name = "count"\nobjective = "{tmp_path / "obj.py"}:train"\nwidths = [16, 64]\nsampler = "grid"\n'
        'seeds = [0, 1]\n[space.lr]\ntype = "log"\nlow = "2**-8"\nhigh = "2**-4"\ngrid = 5\n'
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    calls = tmp_path / "calls"
    calls.write_text("")
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "64", "--device", "cpu"]) == 0  # where the sweep trained
    out = capsys.readouterr().out
    assert calls.read_text().split("\n")[:-1] == ["mup 64 0"]  # the monitored seed only
    result = json.loads((run / "transfer.json").read_text())
    swept = {(r.parametrization, r.params["lr"]): r for r in load_results(Sweep(run)) if r.width == 64}
    for p in ("mup", "sp"):
        trial = swept[(p, 2**-6)]
        assert result[p]["losses"] == pytest.approx(list(trial.losses))
        assert result[p]["reused"]["trial"] == trial.number
    assert result["mup"]["reused"]["seeds"] == [1] and result["sp"]["reused"]["seeds"] == [0, 1]
    assert result["sp"]["cpu_seconds_per_seed"] == pytest.approx([swept[("sp", 2**-6)].cpu_seconds / 2] * 2)
    assert "seeds 0, 1 from the sweep's trial" in out and "seed 1 from the sweep's trial" in out
    calls.write_text("")
    assert main(["transfer", str(run), "--width", "128"]) == 0
    assert sorted(calls.read_text().split("\n")[:-1]) == ["mup 128 0", "mup 128 1", "sp 128 0", "sp 128 1"]
    assert "reused" not in json.loads((run / "transfer.json").read_text())["mup"]
