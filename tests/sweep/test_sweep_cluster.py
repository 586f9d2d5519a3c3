"""Cluster sweeps through submitit: Slurm end to end with a fake sbatch/srun/sacct/scancel on PATH
(PostgreSQL storage), the local backend's GPU pinning, status/cancel, and every refusal."""

import os
import signal
import sys
import textwrap
import time

import pytest
from optuna.trial import TrialState

import fake_slurm
from mutransfer.cli import main
from mutransfer.sweep import Sweep
from placed_sweeps import complete_trials, write_config

PG = os.environ.get("MUTRANSFER_TEST_POSTGRES")
OBJECTIVE = textwrap.dedent("""
    import math, time

    def train(hp, scale):
        time.sleep(float(hp.get("sleep", 0)))
        return (math.log2(hp["lr"]) + 6) ** 2 + 1.0 / scale.width
""")


def _config(tmp_path, cluster: str, name: str = "clus", grid: int = 4, sleep: float = 0.2, extra: str = ""):
    return write_config(tmp_path, OBJECTIVE, name, extra, grid, sleep, tail=cluster)


@pytest.fixture
def fake_slurm_env(tmp_path, monkeypatch):
    env = fake_slurm.install(tmp_path / "bin", tmp_path / "slurm")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return tmp_path / "slurm"


def _drop_database(url: str, name: str) -> None:
    import optuna

    storage = optuna.storages.RDBStorage(url)
    for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        if s.study_name.startswith(name + "/"):
            optuna.delete_study(study_name=s.study_name, storage=storage)
    storage.engine.dispose()


@pytest.mark.slow
@pytest.mark.skipif(not PG, reason="needs MUTRANSFER_TEST_POSTGRES (make test starts a server)")
def test_slurm_array_end_to_end_with_preemption(tmp_path, fake_slurm_env, capsys, monkeypatch):
    """2 array tasks × 2 (fake) GPUs: the #SBATCH lines, every grid point finished exactly once,
    each task's workers pinned to its GPUs, one task killed mid-run (its trial reruns elsewhere)."""
    # the killed task's trial goes stale after 4 s, not 8 (heartbeat every 1 s): the same path, a shorter wait
    monkeypatch.setenv("MUTRANSFER_GRACE_PERIOD", "4")
    name = f"slurm{os.getpid()}"
    _drop_database(PG, name)
    cfg = _config(
        tmp_path,
        """
        [cluster]
        backend = "slurm"
        jobs = 2
        gpus_per_job = 2
        partition = "gpu"
        time_min = 30
        mem_gb = 8
        account = "proj"
        setup = ["export SETUP_RAN=1"]
        [cluster.slurm]
        constraint = "a100"
    """,
        name=name,
        grid=6,
        sleep=0.6,
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--storage", PG, "--detach"]) == 0
    out = capsys.readouterr()
    assert "detached" in out.out and "submitted 2 slurm job(s): 1000_0, 1000_1" in out.err
    script = (fake_slurm_env / "1000.sbatch").read_text()
    for line in (
        "#SBATCH --array=0-1%2",
        "#SBATCH --gres=gpu:2",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=30",
        "#SBATCH --mem=8GB",
        "#SBATCH --account=proj",
        "#SBATCH --constraint=a100",
        "#SBATCH --job-name=mutransfer-" + name,
        "export SETUP_RAN=1",
    ):
        assert line in script, line
    assert PG.split("@")[0].split(":")[-1] not in "".join(
        p.read_bytes().decode("latin-1") for p in run.rglob("*") if p.is_file()
    )  # no password
    # preemption: kill task 1 (its whole process group) once it runs a trial
    deadline = time.monotonic() + 120
    sweep = Sweep(run, storage=PG)
    while time.monotonic() < deadline:
        running = [
            t
            for c in sweep.config.all_cells
            for t in sweep.study(*c).get_trials(deepcopy=False)
            if t.state == TrialState.RUNNING and t.user_attrs.get("cuda_visible_devices") in ("2", "3")
        ]
        if running:
            break
        time.sleep(0.2)
    assert running, "task 1 never ran a trial"
    os.killpg(int((fake_slurm_env / "1000_1.pid").read_text()), signal.SIGKILL)
    assert main(["status", str(run), "--storage", PG]) == 0
    assert "jobs (slurm):" in capsys.readouterr().out
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and Sweep(run, storage=PG).finished() < 12:
        time.sleep(0.5)
    sweep, done = complete_trials(run, PG)
    assert len(done) == 12
    for cell in sweep.config.all_cells:  # every grid point exactly once
        lrs = [t.params["lr"] for t in sweep.study(*cell).get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        assert len(lrs) == len(set(lrs)) == 6
    assert {t.user_attrs["cuda_visible_devices"] for t in done} <= {"0", "1", "2", "3"}
    assert {"0", "1"} <= {t.user_attrs["cuda_visible_devices"] for t in done}
    rerun = [
        t
        for c in sweep.config.all_cells
        for t in sweep.study(*c).get_trials(deepcopy=False)
        if t.state == TrialState.FAIL
    ]
    assert rerun, "the killed task's trial should have gone stale and been rerun"
    assert main(["cancel", str(run)]) == 0
    _drop_database(PG, name)


@pytest.mark.slow
def test_local_backend_pins_each_job_to_its_gpus(tmp_path, capsys):
    """backend local, devices [0..3], 2 jobs × 2 GPUs: job 0's workers see 0 and 1, job 1's 2 and 3
    (submitit's local executor alone would give every job GPU 0); status lists the jobs."""
    cfg = _config(
        tmp_path,
        """
        [cluster]
        backend = "local"
        jobs = 2
        gpus_per_job = 2
        time_min = 5
    """,
        extra="devices = [0, 1, 2, 3]",
        grid=4,
        sleep=0.3,
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    _sweep, done = complete_trials(run)
    assert len(done) == 8
    by_worker: dict = {}
    for t in done:
        by_worker.setdefault(t.user_attrs["worker"], set()).add(t.user_attrs["cuda_visible_devices"])
    assert all(len(ids) == 1 for ids in by_worker.values())  # one GPU per worker
    assert {i for ids in by_worker.values() for i in ids} <= {"0", "1", "2", "3"}
    # submitit alone would give every worker GPU 0; at least two ids show the pinning (not all four:
    # on a loaded machine one job's workers may start after the other's have run all 8 trials).
    assert len({i for ids in by_worker.values() for i in ids}) >= 2
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "8/8 done" in out and "jobs (local): 2 FINISHED" in out


@pytest.mark.parametrize(
    "cluster, storage, message",
    [
        ('[cluster]\nbackend = "slurm"', None, "sbatch is not on PATH"),
        ('[cluster]\nbackend = "local"\ngpus_per_job = 2\njobs = 3', None, "need 6 GPUs; devices gives"),
        ('[cluster]\nbackend = "pbs"', None, "cluster.backend must be one of 'slurm', 'local'"),
        ('[cluster]\nbackend = "local"', "journal:sweep.log", "journal file storage records no heartbeats"),
    ],
)
def test_cluster_refusals_exit_2_and_leave_nothing(tmp_path, capsys, monkeypatch, cluster, storage, message):
    monkeypatch.setenv("PATH", "/nonexistent")
    cfg = _config(tmp_path, cluster, extra="devices = [0, 1]")
    run = tmp_path / "run"
    args = ["sweep", str(cfg), "--run", str(run)] + (["--storage", storage] if storage else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not run.exists()


def test_slurm_refuses_sqlite_and_missing_submitit(tmp_path, capsys, fake_slurm_env, monkeypatch):
    cfg = _config(tmp_path, '[cluster]\nbackend = "slurm"')
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run)]) == 2
    assert "SQLite file (unsafe across machines): pass --storage postgresql://" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "submitit", None)
    assert main(["sweep", str(cfg), "--run", str(run), "--storage", "postgresql://u@127.0.0.1:1/db"]) == 2
    assert "[cluster] needs submitit: pip install 'mutransfer[cluster]'" in capsys.readouterr().err
    assert not run.exists()
    assert main(["cancel", str(tmp_path)]) == 2
    assert "was not submitted to a cluster" in capsys.readouterr().err


def test_local_backend_ids_count_within_cuda_visible_devices(tmp_path, capsys, monkeypatch):
    """Local jobs' GPUs are the sweep's ids mapped through CUDA_VISIBLE_DEVICES, one rule with the
    sweep's own placement: an id past its end is refused by name, not an IndexError."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    cfg = _config(tmp_path, '[cluster]\nbackend = "local"\njobs = 2\ngpus_per_job = 2', extra="devices = [0, 1, 2, 3]")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "devices: GPU id(s) [2, 3] are not visible here (CUDA_VISIBLE_DEVICES=4,6" in err and "Traceback" not in err
    assert not run.exists()
