"""Sweeps on PostgreSQL: several workers share the studies, every grid point runs once, and the
password in the storage URL never shows.

The sweep test needs a server whose URL is in MUTRANSFER_TEST_POSTGRES: `make test` runs pytest
through scripts/with-postgres.sh, which starts a throwaway one; without it that test is skipped.
The unreachable-server test needs no server.
"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from urllib.parse import unquote, urlsplit

import pytest

ENV = "MUTRANSFER_TEST_POSTGRES"
PARAMETRIZATIONS, WIDTHS, GRID = ("mup", "sp"), (16, 32), 5
TIMEOUT = 240  # seconds for the whole sweep; it takes 10-20 s on 2 cores

CONFIG = """
    name = "NAME"
    objective = "recipe:mlp"
    widths = [16, 32]
    sampler = "grid"

    [space.lr]
    type = "log"
    low = "2**-8"
    high = "2**-4"
    grid = 5

    [fixed]
    steps = 5
    threads = 1
"""


def cli(*args):
    return [sys.executable, "-m", "mutransfer.cli", *args]


def child_env():
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # tracebacks on SIGABRT, if the sweep hangs
    env.pop("MUTRANSFER_STORAGE", None)  # the URL is passed with --storage
    return env


def read_logs(logs):
    return "\n".join(f"--- {path.name}:\n{path.read_text()[-4000:]}" for paths in logs.values() for path in paths)


def trial_states(optuna, url, name):
    """{study: {state: count}} of this run's studies, for a failure message."""
    try:
        storage = optuna.storages.RDBStorage(url)
        return {
            s.study_name: dict(
                Counter(t.state.name for t in optuna.load_study(study_name=s.study_name, storage=storage).trials)
            )
            for s in optuna.get_all_study_summaries(storage)
            if s.study_name.startswith(name + "/")
        }
    except Exception as e:  # the failure message matters more
        return f"unavailable ({type(e).__name__})"


def hide(text, password):
    return text.replace(password, "<PASSWORD>")


@pytest.mark.slow
def test_two_local_workers_and_an_extra_worker_share_a_postgres_sweep(tmp_path):
    url = os.environ.get(ENV)
    if not url:
        pytest.skip(
            f"{ENV} is unset: run through scripts/with-postgres.sh (as `make test` does) "
            "or point it at a PostgreSQL database"
        )
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState

    password = unquote(urlsplit(url).password or "")
    assert password, f"{ENV} should hold a password, to check that it never shows"
    name = f"pgtest-{uuid.uuid4().hex[:12]}"  # reruns against the same database do not collide
    config = tmp_path / "sweep.toml"
    config.write_text(textwrap.dedent(CONFIG).replace("NAME", name))
    run = tmp_path / "run"
    # The extra worker starts together with `sweep`, so it must find the config as a worker on
    # another machine would: copied into its run directory (`sweep` accepts the same config).
    # Optuna's tables are created up front: two processes creating them at once in an empty
    # database make one of them fail (a UniqueViolation, reported as "unreachable", exit 2).
    run.mkdir()
    shutil.copyfile(config, run / "config.toml")
    optuna.storages.RDBStorage(url).engine.dispose()

    start = time.perf_counter()
    commands = {
        "sweep": cli("sweep", str(config), "--run", str(run), "--storage", url, "--workers", "2", "--no-progress"),
        "worker": cli("worker", str(run), "--storage", url, "--no-progress"),
    }
    procs, logs = {}, {}
    for label, command in commands.items():  # output to files: an undrained pipe could block a worker
        logs[label] = (tmp_path / f"{label}.out", tmp_path / f"{label}.err")
        with open(logs[label][0], "w") as out, open(logs[label][1], "w") as err:
            procs[label] = subprocess.Popen(
                command, cwd=tmp_path, env=child_env(), stdout=out, stderr=err, start_new_session=True
            )  # its own group, with `sweep`'s worker
    try:
        failed_at = None
        while any(proc.poll() is None for proc in procs.values()):
            now = time.perf_counter()
            if failed_at is None and any(proc.returncode for proc in procs.values()):
                failed_at = now  # the others may wait forever for a trial the failed one held
            if now - start > TIMEOUT or (failed_at is not None and now - failed_at > 15):
                for proc in procs.values():  # Python tracebacks of every process still running
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGABRT)
                time.sleep(2)
                codes = {label: proc.poll() for label, proc in procs.items()}
                pytest.fail(
                    f"not done after {now - start:.0f} s (exit codes {codes}); trials: "
                    f"{trial_states(optuna, url, name)}\n" + hide(read_logs(logs), password)
                )
            time.sleep(0.2)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.perf_counter() - start

    outputs = {label: (out.read_text(), err.read_text()) for label, (out, err) in logs.items()}
    for label, proc in procs.items():
        out, err = outputs[label]
        assert password not in out and password not in err, f"{label} printed the storage password"
        assert proc.returncode == 0, f"{label} exited {proc.returncode}:\n{hide(out + err, password)[-3000:]}"
    assert f"storage postgresql://{urlsplit(url).username}:***@" in outputs["sweep"][0]
    assert password not in (run / "run.json").read_text()

    workers = Counter()
    for parametrization in PARAMETRIZATIONS:
        for width in WIDTHS:
            study = optuna.load_study(study_name=f"{name}/{parametrization}/w{width}", storage=url)
            trials = study.get_trials(deepcopy=False)
            states = sorted(t.state.name for t in trials)
            assert states == ["COMPLETE"] * GRID, (parametrization, width, states)
            assert not any(t.state in (TrialState.WAITING, TrialState.RUNNING, TrialState.FAIL) for t in trials)
            lrs = sorted(t.params["lr"] for t in trials)
            assert len(set(lrs)) == GRID
            assert lrs == pytest.approx([2.0**e for e in range(-8, -3)]), lrs
            workers.update(t.user_attrs["worker"] for t in trials)
    print(f"{sum(workers.values())} trials in {seconds:.1f} s by workers {dict(workers)}")
    assert len(workers) >= 2, f"all trials ran in one worker: {dict(workers)}"
    for parametrization in PARAMETRIZATIONS:  # keep a long-lived database tidy
        for width in WIDTHS:
            optuna.delete_study(study_name=f"{name}/{parametrization}/w{width}", storage=url)


def test_unreachable_postgres_exits_2_naming_the_storage_without_the_password(tmp_path):
    password = f"pw-{uuid.uuid4().hex}"
    url = f"postgresql://mutransfer:{password}@127.0.0.1:1/mutransfer"  # nothing listens on port 1
    config = tmp_path / "sweep.toml"
    config.write_text(textwrap.dedent(CONFIG).replace("NAME", "unreachable"))
    proc = subprocess.run(
        cli("sweep", str(config), "--run", str(tmp_path / "run"), "--storage", url, "--no-progress"),
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )  # hang guard
    output = proc.stdout + proc.stderr
    assert password not in output
    assert proc.returncode == 2, output[-2000:]
    assert not (tmp_path / "run").exists()  # nothing left behind for the corrected rerun to trip on
    assert "postgresql://mutransfer:***@127.0.0.1:1/mutransfer" in proc.stderr, proc.stderr
    assert "Traceback" not in output
    if postgres_driver_installed():
        assert "unreachable" in proc.stderr, proc.stderr


def postgres_driver_installed():
    """Whether SQLAlchemy's driver for plain postgresql:// URLs imports (psycopg2 before SQLAlchemy 2.1,
    psycopg 3 since)."""
    try:
        from sqlalchemy.engine import make_url

        make_url("postgresql://").get_dialect().import_dbapi()
    except ImportError:
        return False
    return True


@pytest.mark.slow
def test_the_password_of_a_postgres_storage_never_reaches_the_run_directory_or_the_output(tmp_path, monkeypatch, capfd):
    """Issue 30: config.toml and the database's copy kept the storage password as written. The run
    directory (every file) and every printed line must not hold it; `report` reads it from
    MUTRANSFER_STORAGE_PASSWORD."""
    url = os.environ.get(ENV)
    if not url:
        pytest.skip(f"{ENV} is unset: run through scripts/with-postgres.sh (as `make test` does)")
    import optuna

    from mutransfer.sweep.config.urls import PASSWORD_ENV

    password = unquote(urlsplit(url).password or "")
    assert password
    name = f"pgpw-{uuid.uuid4().hex[:12]}"
    config = tmp_path / "sweep.toml"
    body = textwrap.dedent(CONFIG).replace("NAME", name).replace("widths = [16, 32]", "widths = [16]")
    config.write_text(f'storage = "{url}"\n' + body.replace("grid = 5", "grid = 2"))
    run = tmp_path / "run"
    # In this process, its output captured at the file descriptors (library loggers too): two
    # interpreters fewer to start.
    from mutransfer.cli import main

    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.delenv("MUTRANSFER_STORAGE", raising=False)  # the URL is the config's
    capfd.readouterr()
    assert main(["sweep", str(config), "--run", str(run), "--no-progress"]) == 0, capfd.readouterr().err
    out = capfd.readouterr()
    monkeypatch.setenv(PASSWORD_ENV, password)
    assert main(["report", str(run)]) == 0, capfd.readouterr().err
    report = capfd.readouterr()
    printed = out.out + out.err + report.out + report.err
    assert password not in printed
    for path in run.rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
    storage = optuna.storages.RDBStorage(url)
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name.startswith(f"{name}/"):
            assert password not in summary.user_attrs["config_toml"]
    storage.engine.dispose()
