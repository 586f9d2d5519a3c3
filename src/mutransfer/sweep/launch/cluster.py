"""A sweep's workers as a job array through submitit: Slurm, or local processes for tests and laptops.

```toml
[cluster]
backend = "slurm"         # slurm | local (submitit's local executor: real processes, same pinning)
jobs = 4                  # array tasks, each one node's worth of workers
gpus_per_job = 8          # GPUs per task (#SBATCH --gres=gpu:8); 0: CPU workers
trials_per_device = 1     # workers per GPU (per task on the CPU)
partition = "gpu"
time_min = 240            # per task; at the limit the task is requeued (see below)
mem_gb = 64
cpus_per_task = 32        # the workers split them (torch threads = cpus // workers)
account = "proj"
qos = "normal"
setup = ["module load cuda/12.4", "source .venv/bin/activate"]   # run before the worker
[cluster.slurm]           # anything else, verbatim to submitit's SlurmExecutor (slurm_ prefix optional)
constraint = "a100"
```

Each array task (`processes.NodeTask`) runs `processes.run_workers` on its node: one worker process per GPU × `trials_per_device`,
each seeing its one GPU (``CUDA_VISIBLE_DEVICES``, mapped through the GPUs Slurm gave the task),
against the shared storage. Every task claims trials from the same queue, so the sweep ends when
the queue is empty, whichever tasks ran it. The task is submitit-checkpointable: at a time limit
or a preemption submitit requeues it; the worker processes die with it (they are started with a
parent-death signal), so the trials they were running go stale after the heartbeat grace period
and are run again by any worker.

Storage: every node must reach it, so a Slurm sweep needs PostgreSQL (``--storage
postgresql://...`` or the config's ``storage``); the default SQLite file is refused there (SQLite's
locking is not safe across machines), and kept for ``backend = "local"``. Optuna's journal file
storage is refused everywhere: Optuna's JournalStorage records no heartbeats, so a preempted
worker's trial would stay "running" for ever.

The storage URL reaches the tasks in the environment (``MUTRANSFER_STORAGE``; Slurm exports the
submitting environment by default), never in a file: submitit pickles each task's arguments into
the run directory, and a password must not be stored there. ``RUN/cluster.json`` records the
backend and job ids, so that `status` and `cancel` find the jobs later.

Local backend: submitit's local executor would give every job GPU 0; here each job gets its own
`gpus_per_job` GPUs of the sweep's ``devices`` (job j: ids j·g … j·g+g−1).

Other schedulers: the engine needs only "start `run_workers` on N machines with the same
storage": a Ray or Dask user starts `mutransfer worker RUN --storage URL` (or `run_workers`) in
each of their tasks; nothing else is needed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from ..._core.atomic import write_atomically
from ..._core.progress import Progress
from ..config.config import ClusterConfig, SweepConfig, cluster_config
from ..config.placement import gpu_names, parse_devices, visible_devices
from ..engine.runner import STORAGE_ENV, Sweep
from ..engine.storage import default_url, mask_url
from ..engine.trials import trial_outcome
from .processes import NodeTask

__all__ = [
    "CLUSTER_DIR",
    "CLUSTER_FILE",
    "ClusterPlan",
    "ClusterRun",
    "NodeTask",
    "SweepView",
    "cancel",
    "check_cluster",
    "job_states",
    "plan_cluster",
    "run_cluster",
    "status_lines",
    "submit",
    "trial_counts",
    "wait",
]

CLUSTER_FILE = "cluster.json"
JOB_END_SECONDS = 30.0  # once every trial is done, how long `wait` waits for the jobs to end
CLUSTER_DIR = "cluster"  # submitit's folder in the run directory: scripts, pickles, logs
FINAL_STATES = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "DONE",
    "FINISHED",
    "INTERRUPTED",
)


class ClusterRun:
    """The jobs of a submitted sweep, as recorded in ``RUN/cluster.json``."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        path = self.run_dir / CLUSTER_FILE
        if not path.is_file():
            raise ValueError(
                f"{self.run_dir}: no {CLUSTER_FILE}; this sweep was not submitted to a cluster "
                "(a [cluster] table in its config, or --cluster)"
            )
        data = json.loads(path.read_text())
        self.backend: str = data["backend"]
        self.folder = Path(data["folder"])
        self.job_ids: list[str] = list(data["jobs"])
        self._jobs: list[Any] = []

    def jobs(self) -> list[Any]:
        """submitit Job objects for the recorded ids (Slurm: states from sacct)."""
        if not self._jobs:
            import submitit

            if self.backend == "slurm":
                self._jobs = [submitit.SlurmJob(folder=self.folder, job_id=j) for j in self.job_ids]
        return self._jobs


def check_cluster(cluster: ClusterConfig, url: str) -> None:
    """Refuse, before anything is written, what cannot work: submitit missing, sbatch missing, a
    storage the nodes cannot share."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ValueError("[cluster] needs submitit: pip install 'mutransfer[cluster]'") from None
    if cluster.backend == "slurm":
        if shutil.which("sbatch") is None:
            raise ValueError(
                'cluster.backend = "slurm" but sbatch is not on PATH: submit from a Slurm login node, '
                'or set [cluster] backend = "local" to run the jobs on this machine'
            )
        if url.startswith("sqlite"):
            raise ValueError(
                f'cluster.backend = "slurm" needs a storage every node reaches; {mask_url(url)} is an '
                "SQLite file (unsafe across machines): pass --storage postgresql://user@host/db (or set "
                "storage in the config)"
            )


def _slurm_parameters(cluster: ClusterConfig, name: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "time": cluster.time_min,
        "job_name": f"mutransfer-{name}",
        "array_parallelism": cluster.jobs,
        "signal_delay_s": 120,
    }
    if cluster.gpus_per_job:
        params["gres"] = f"gpu:{cluster.gpus_per_job}"
    for key in ("partition", "cpus_per_task", "account", "qos"):
        if getattr(cluster, key) is not None:
            params[key] = getattr(cluster, key)
    if cluster.mem_gb is not None:
        params["mem"] = f"{cluster.mem_gb:g}GB"
    if cluster.setup:
        params["setup"] = list(cluster.setup)
    for key, value in cluster.slurm.items():
        params[key[len("slurm_") :] if key.startswith("slurm_") else key] = value
    return params


def _local_gpu_ids(cluster: ClusterConfig, devices: Any) -> list[list[int]]:
    """Each local job's GPU ids (physical, for submitit's `visible_gpus`): consecutive blocks of the
    sweep's devices, mapped through this process's CUDA_VISIBLE_DEVICES."""
    g = cluster.gpus_per_job
    if not g:
        return [[] for _ in range(cluster.jobs)]
    parsed = parse_devices(devices, "devices") if devices is not None else "auto"
    if parsed == "cpu":
        raise ValueError('cluster.gpus_per_job > 0 but devices = "cpu"; set gpus_per_job = 0 for CPU jobs')
    ids = list(range(visible_devices())) if isinstance(parsed, str) else parsed  # "auto" (or "cpu", refused above)
    if len(ids) < g * cluster.jobs:
        raise ValueError(
            f"cluster: {cluster.jobs} local jobs × gpus_per_job {g} need {g * cluster.jobs} GPUs; "
            f"devices gives {len(ids)} ({ids}); lower jobs or gpus_per_job, or list more devices"
        )
    names = gpu_names(ids[: g * cluster.jobs], "devices")
    odd = [name for name in names if not name.isdigit()]
    if odd:
        raise ValueError(
            f'cluster.backend = "local" pins GPUs by number; CUDA_VISIBLE_DEVICES holds {odd[0]!r}: use numeric ids'
        )
    physical = [int(name) for name in names]
    return [physical[j * g : (j + 1) * g] for j in range(cluster.jobs)]


@dataclass(frozen=True)
class ClusterPlan:
    """A cluster submission settled and checked before anything is written (see `plan_cluster`).

    Attributes:
        cluster: the [cluster] table, the command line's overrides applied.
        run_dir: the run directory the jobs work in (``RUN/cluster.json``, ``RUN/cluster/``).
        gpu_ids: backend "local": each job's physical GPU ids (empty tuples for CPU jobs);
            backend "slurm": () (Slurm gives each task its GPUs).
        threads: torch threads per worker; None: the cores split between a task's workers.
    """

    cluster: ClusterConfig
    run_dir: Path
    gpu_ids: tuple[tuple[int, ...], ...]
    threads: int | None


def plan_cluster(
    config: SweepConfig,
    run_dir: str | os.PathLike,
    storage: str | None = None,
    overrides: dict[str, Any] | None = None,
    devices: Any = None,
    threads: int | None = None,
) -> ClusterPlan:
    """Check a cluster submission before the run directory is written, and settle its parameters.

    Everything that can be refused is refused here: the [cluster] table, submitit, sbatch, a
    storage the nodes cannot share, the local GPUs, and jobs of an earlier submission still queued
    or running in `run_dir`.

    Args:
        config: the loaded sweep config (`load_config`).
        run_dir: the run directory (it need not exist yet).
        storage: the storage URL given on the command line (default ``MUTRANSFER_STORAGE``, the
            config's, else the SQLite file in the run directory, as `Sweep.create`).
        overrides: [cluster] keys given on the command line (``--cluster slurm --jobs 4 ...``).
        devices: "auto", "cpu" or GPU ids for the local backend; None: the config's.
        threads: torch threads per worker; None: the config's.

    Returns:
        The plan `run_cluster` submits.

    Raises:
        ValueError: any of the refusals above.
    """
    run_dir = Path(run_dir)
    table = dict(config.raw.get("cluster") or {})
    table.update(overrides or {})
    cluster = cluster_config(table)
    check_cluster(cluster, storage or os.environ.get(STORAGE_ENV) or config.storage or default_url(run_dir))
    gpu_ids: tuple[tuple[int, ...], ...] = ()
    if cluster.backend == "local":
        gpu_ids = tuple(tuple(ids) for ids in _local_gpu_ids(cluster, config.devices if devices is None else devices))
    if (run_dir / CLUSTER_FILE).is_file():
        live = [j for j, s in job_states(ClusterRun(run_dir)).items() if not _ended(s)]
        if live:
            raise ValueError(
                f"{run_dir}: jobs {', '.join(live)} of an earlier submission are still queued or running; "
                f"watch them with `mutransfer status {run_dir}` or stop them with "
                f"`mutransfer cancel {run_dir}` first"
            )
    return ClusterPlan(cluster, run_dir, gpu_ids, threads or config.threads)


@dataclass(frozen=True)
class SweepView:
    """What the cluster code reads of a sweep, gathered once (`SweepView.of`): its name, storage,
    trial total and studies. The submission reads the first two; the poll loop counts the studies'
    trials through it, never going back to the `Sweep`.

    Attributes:
        name: the sweep's name (its config's `name`).
        url: the storage URL the workers use.
        total: trials the whole sweep runs.
        studies: each study with the trials it runs, in the order of the config's cells.
    """

    name: str
    url: str
    total: int
    studies: tuple[tuple[optuna.Study, int], ...]

    @classmethod
    def of(cls, sweep: Sweep) -> SweepView:
        """The view of `sweep`'s studies as they are now (build it after `retry_failed`, which
        reopens them)."""
        studies = sweep.studies
        per_cell = [studies.trials_per_cell(cell.parametrization) for cell in sweep.config.all_cells]
        return cls(sweep.config.name, sweep.url, sum(per_cell), tuple(zip(studies.all(), per_cell)))

    def counts(self) -> dict[str, dict[str, int]]:
        """Per study: done, running, failed, pending trials (pending: queued, not yet claimed, and
        not yet created for random/TPE)."""
        out = {}
        for study, per_cell in self.studies:
            trials = study.get_trials(deepcopy=False)
            outcomes = [trial_outcome(t) for t in trials]
            done = sum(o is not None for o in outcomes)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            out[study.study_name] = {
                "done": done,
                "running": running,
                "failed": sum(o == "failed" for o in outcomes),
                "pending": max(0, per_cell - done - running),
            }
        return out


def submit(view: SweepView, plan: ClusterPlan) -> ClusterRun:
    """Submit `plan.cluster.jobs` tasks running the workers of the prepared sweep seen by `view`;
    writes ``RUN/cluster.json``.

    Args:
        view: the sweep (`SweepView.of`): its name and storage URL.
        plan: the checked submission (`plan_cluster`).

    Returns:
        The submitted jobs.

    Raises:
        ValueError: the storage cannot be shared by the nodes, or the submission failed.
    """
    import submitit

    cluster = plan.cluster
    check_cluster(cluster, view.url)
    folder = plan.run_dir / CLUSTER_DIR
    args = (str(plan.run_dir.resolve()), cluster.gpus_per_job, cluster.trials_per_device, plan.threads)
    previous = os.environ.get(STORAGE_ENV)
    os.environ[STORAGE_ENV] = view.url  # the tasks' environment, not a file (see the module docstring)
    try:
        if cluster.backend == "slurm":
            executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=1000)
            try:
                executor.update_parameters(**_slurm_parameters(cluster, view.name))
            except ValueError as e:
                raise ValueError(f"[cluster.slurm]: {str(e).splitlines()[0]}") from None
            jobs = executor.map_array(NodeTask(), *[[a] * cluster.jobs for a in args])
            ids = [j.job_id for j in jobs]
        else:
            local = submitit.LocalExecutor(folder=folder, max_num_timeout=1000)
            ids = []
            for gpus in plan.gpu_ids:
                local.update_parameters(
                    timeout_min=cluster.time_min,
                    gpus_per_node=len(gpus),
                    visible_gpus=tuple(gpus),
                    setup=list(cluster.setup),
                )
                ids.append(local.submit(NodeTask(), *args).job_id)
    except (OSError, submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as e:
        raise ValueError(
            f"cluster: submission failed: {str(e).strip().splitlines()[-1] if str(e).strip() else e}"
        ) from None
    finally:
        if previous is None:
            os.environ.pop(STORAGE_ENV, None)
        else:
            os.environ[STORAGE_ENV] = previous
    record = {"backend": cluster.backend, "folder": str(folder.resolve()), "jobs": ids, "submitted": time.time()}
    write_atomically(plan.run_dir / CLUSTER_FILE, json.dumps(record, indent=1))
    return ClusterRun(plan.run_dir)


def job_states(run: ClusterRun) -> dict[str, str]:
    """Job id → state (Slurm's, from sacct through submitit; local: RUNNING while its process lives)."""
    if run.backend == "slurm":
        return {j.job_id: j.state for j in run.jobs()}
    out = {}
    for job_id in run.job_ids:
        try:
            os.kill(int(job_id), 0)
            alive = not _zombie(int(job_id))
        except (ProcessLookupError, ValueError):
            alive = False
        except PermissionError:
            alive = True
        out[job_id] = "RUNNING" if alive else "FINISHED"
    return out


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _ended(state: str) -> bool:
    """Whether a job state (Slurm's, e.g. "CANCELLED by 123", or the local "FINISHED") is final."""
    return state.split()[0] in FINAL_STATES


def _tally(states: dict[str, str]) -> str:
    """'1 PENDING, 2 RUNNING': how many jobs are in each state."""
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def trial_counts(sweep: Sweep) -> dict[str, dict[str, int]]:
    """Per study: done, running, failed, pending trials (pending: queued, not yet claimed, and not
    yet created for random/TPE). See `SweepView.counts`."""
    return SweepView.of(sweep).counts()


def status_lines(sweep: Sweep, run: ClusterRun | None = None) -> list[str]:
    """What `mutransfer status` prints: a line per study and, for a cluster sweep, the jobs."""
    view = SweepView.of(sweep)
    counts = view.counts()
    width = max(len(n) for n in counts)
    total = {k: sum(c[k] for c in counts.values()) for k in ("done", "running", "failed", "pending")}
    lines = [
        f"sweep {view.name}: {total['done']}/{view.total} done, {total['running']} running, "
        f"{total['failed']} failed, {total['pending']} pending (storage {mask_url(view.url)})"
    ]
    lines += [
        f"  {name:<{width}}  done {c['done']:>4}  running {c['running']:>3}  failed {c['failed']:>3}  "
        f"pending {c['pending']:>4}"
        for name, c in counts.items()
    ]
    if run is not None:
        states = job_states(run)
        lines.append(f"jobs ({run.backend}): {_tally(states)} — ids {', '.join(states)}")
    return lines


def _polls(view: SweepView, run: ClusterRun, poll: float) -> Iterator[tuple[int, str, bool | None]]:
    """Poll the trials and the jobs every `poll` s until the sweep is over; yield each poll's
    trials done, its live note, and the outcome: None while it goes on, else whether every trial
    is done."""
    ends_by = math.inf
    last = False  # every job had ended at the previous poll: this count is the last
    while True:
        counts = view.counts()
        states = job_states(run)
        done = sum(c["done"] for c in counts.values())
        note = (
            f"{sum(c['running'] for c in counts.values())} running, "
            f"{sum(c['pending'] for c in counts.values())} pending; jobs {_tally(states).lower()}"
        )
        if done >= view.total:
            if time.monotonic() >= ends_by or all(_ended(s) for s in states.values()):
                yield done, note, True
                return
            ends_by = min(ends_by, time.monotonic() + JOB_END_SECONDS)  # let the tasks leave
            yield done, note, None
            time.sleep(poll / 4)
            continue
        if last:
            yield done, note, False
            return
        yield done, note, None
        if states and all(_ended(s) for s in states.values()):
            last = True  # count once more at once: the last trials may have ended with the jobs
            continue
        time.sleep(poll)


def wait(view: SweepView, run: ClusterRun, progress: bool = True, poll: float = 2.0) -> bool:
    """Wait until every trial is done (True) or every job has ended with trials left (False),
    with a live line: done / running / failed / pending and the jobs' states.

    Args:
        view: the sweep (`SweepView.of`), read at each poll through its studies.
        run: its submitted jobs.
        progress: show the live line on stderr.
        poll: seconds between polls.

    Returns:
        Whether every trial is done.
    """
    polls = _polls(view, run, poll)
    bar = Progress(view.total, f"sweep {view.name}", enabled=progress)
    try:
        for done, note, over in polls:
            bar.done = done
            bar.update(note)
            bar.advance(0)
            if over is not None:
                return over
        return False  # not reached: the last poll gives the outcome
    finally:
        bar.close()


def cancel(run: ClusterRun) -> list[str]:
    """Cancel the jobs (scancel; local: stop the processes). Their running trials go stale and are
    run again when the sweep resumes. Returns the ids cancelled."""
    if run.backend == "slurm":
        for job in run.jobs():
            job.cancel(check=False)
        return list(run.job_ids)
    done = []
    for job_id in run.job_ids:  # the local controller stops its task on SIGINT (as submitit's LocalJob.cancel)
        try:
            os.kill(int(job_id), signal.SIGINT)
            done.append(job_id)
        except (ProcessLookupError, ValueError):
            pass
    return done


def run_cluster(
    sweep: Sweep,
    plan: ClusterPlan,
    detach: bool = False,
    progress: bool = True,
    retry_failed: bool = False,
    **old_form: Any,
) -> tuple[ClusterRun, bool | None]:
    """Submit the workers of a created sweep as jobs and (unless `detach`) wait for them.

    The caller reads the config once, checks the submission (`plan_cluster`: everything that can
    be refused is refused before the run directory is written) and creates the sweep once::

        config = load_config(path)
        plan = plan_cluster(config, run_dir, storage, overrides={"backend": "local", "jobs": 2})
        sweep = Sweep.create(path, run_dir, storage, config=config)
        run, ok = run_cluster(sweep, plan)

    Args:
        sweep: the sweep (`Sweep.create`), in `plan.run_dir`; it is prepared here.
        plan: the checked submission (`plan_cluster`).
        detach: return once the jobs are submitted.
        progress: show a live line on stderr while waiting.
        retry_failed: first queue every failed trial again (see `Sweep.retry_failed`).
        **old_form: the keywords of the old call form (`storage`, `overrides`, `devices`,
            `threads`, `config`): refused, with the new form in the message.

    Returns:
        The jobs, and whether every trial is done (None when detached).

    Raises:
        TypeError: the old call form ``run_cluster(config_path, run_dir, storage=..., ...)``; its
            `storage`, `overrides`, `devices` and `threads` now go to `plan_cluster`.
        ValueError: the sweep is not in `plan.run_dir`, or the submission failed.
    """
    if old_form or not isinstance(sweep, Sweep) or not isinstance(plan, ClusterPlan):
        raise TypeError(
            "run_cluster(sweep, plan) takes the created Sweep and a ClusterPlan, not a config path and a "
            "run directory: config = load_config(path); plan = plan_cluster(config, run_dir, storage, "
            "overrides); sweep = Sweep.create(path, run_dir, storage, config=config); run_cluster(sweep, plan)"
        )
    if Path(sweep.run_dir).resolve() != plan.run_dir.resolve():
        raise ValueError(f"run_cluster: the sweep is in {sweep.run_dir} but the plan is for {plan.run_dir}")
    sweep.prepare()
    if retry_failed:
        n = sweep.retry_failed()
        print(f"retrying {n} failed trial(s)" if n else "no failed trial to retry", file=sys.stderr)
    view = SweepView.of(sweep)  # all the rest reads the sweep through this
    run = submit(view, plan)
    print(
        f"submitted {len(run.job_ids)} {run.backend} job(s): {', '.join(run.job_ids)} (logs in {run.folder})",
        file=sys.stderr,
        flush=True,
    )
    if detach:
        return run, None
    return run, wait(view, run, progress)
