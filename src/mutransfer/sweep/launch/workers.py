"""A sweep's worker processes on one machine: start them pinned to their slot, release them on the
storage, stop them on Ctrl-C, and run a whole sweep (`run_sweep`) or a node's share of one
(`run_workers`, what a cluster task runs). Where the slots go is `placement`; what a worker does
with its trials is `runner.Sweep.work`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import torch

from ..._core.atomic import write_atomically
from ...errors import SweepInterrupted
from ..analysis.trajectory import write_proxy_trajectory
from ..config.config import SweepConfig, load_config
from ..config.placement import DEVICE_ENV, THREADS_ENV, Devices, Placement, plan
from ..engine.interrupts import exit_code, interrupts_ignored, raise_terminated
from ..engine.runner import EXIT_INTERRUPTED, EXIT_TERMINATED, STORAGE_ENV, Sweep
from ..engine.storage import mask_url, optuna_logs_quiet
from .processes import PARENT_ENV, die_with_parent, release_workers, run_workers, start_worker, stop_workers

__all__ = ["apply_threads", "die_with_parent", "run_sweep", "run_workers"]


def _warm_up(answered: Callable[[], bool] = lambda: False, optimizer: bool = True) -> None:
    """Do, while the parent is still creating the sweep, what a new process otherwise does while
    opening the storage or in its first trial. Measured per process on the 2-core CI machine:
    importing torch and this package 1.8 s (done before this), opening an Optuna RDB storage
    (SQLAlchemy and Alembic imports) 1.1 s, the first torch optimizer (it imports torch._dynamo)
    2.1 s. A worker doing this in parallel with the parent's setup starts claiming trials seconds
    earlier. Each step runs only while `answered()` is false: once the parent has answered, the
    worker goes on at once. The optimizer step only with `optimizer` (a built-in recipe, which
    trains with torch optimizers): another objective may never use one, and on a loaded machine
    the 2 s of CPU are not free; one that does pays them in its first trial."""
    for step in (_import_storage, _first_optimizer) if optimizer else (_import_storage,):
        if answered():
            return
        step()


def _import_storage() -> None:
    import alembic.command
    import alembic.migration  # noqa: F401
    from optuna.storages._rdb import models  # noqa: F401  (SQLAlchemy's ORM)


def _first_optimizer() -> None:
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)


def apply_threads() -> None:
    """Use the torch thread count the sweep gave this worker (``MUTRANSFER_THREADS``), if any."""
    threads = os.environ.get(THREADS_ENV)
    if threads:
        torch.set_num_threads(int(threads))


def _worker_entry(
    run_dir: str, reader: threading.Thread, lines: list[str], wait_for_others: bool = False, optimizer: bool = True
) -> int:
    """A worker process started by `run_sweep`: warm up (the first optimizer too with `optimizer`)
    until `reader` has the parent's "go URL" (in `lines`; on anything else it ended the process),
    run trials while any is left to claim (with `wait_for_others`, a GPU sweep's workers also wait
    for each other's running trials and retry a dead worker's; otherwise the parent does), then
    leave without the interpreter's teardown (0.7 s with torch loaded: a tail on every sweep)."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is not None:
        die_with_parent()
        if str(os.getppid()) != parent:  # it died before we asked
            return 0
    apply_threads()
    _warm_up(lambda: not reader.is_alive(), optimizer)
    reader.join()
    if not lines:  # the reader failed (no stdin): nothing to work on
        return 0
    os.environ[STORAGE_ENV] = lines[0][3:].rstrip("\n")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_terminated)
    code = 0
    try:
        sweep = Sweep(run_dir, patient=True)
        # A GPU slot trains on its one visible GPU; where this process sees none (ids passed through
        # on a machine without CUDA: the parent warned), on the CPU.
        gpu = os.environ.get(DEVICE_ENV) == "cuda" and torch.cuda.is_available()
        sweep.use_device("cuda" if gpu else "cpu", "devices")
        _ = sweep.objective  # loaded before any trial: a broken objective fails here
        sweep.work(progress=False, wait_for_others=wait_for_others)
        sweep.storage.engine.dispose()
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (`Terminated`)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # leaving: nothing more to interrupt
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = exit_code(e)
    except ValueError as e:
        print(f"mutransfer worker: error: {e}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_reason(code: int) -> str:
    """' (killed by SIGKILL)' for a negative exit code, ' (interrupted)' for 130 or 143, else ''."""
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        return " (interrupted)"
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return ""
    return ""


def _check_gpus(placement: Placement, precision: str) -> None:
    """Ask each GPU of `placement`, in a throwaway process (this one must not initialise CUDA),
    whether it can train in `precision`; a ValueError naming the device otherwise."""
    code = (
        "import sys, torch\n"
        "from mutransfer._core.devices import check_precision\n"
        "if torch.cuda.is_available():\n"
        "    for i in range(torch.cuda.device_count()):\n"
        "        try: check_precision(sys.argv[1], torch.device('cuda', i), 'precision')\n"
        "        except ValueError as e: print(e); sys.exit(2)\n"
    )
    gpus = ",".join(dict.fromkeys(g for g in placement.gpus if g is not None))
    done = subprocess.run(
        [sys.executable, "-c", code, precision],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus},
    )
    if done.returncode:  # check_precision's message, else the last line of what went wrong
        raise ValueError((done.stdout.strip() or done.stderr.strip() or "the GPU check failed").splitlines()[-1])


@optuna_logs_quiet()
def run_sweep(
    config_path: str | os.PathLike,
    run_dir: str | os.PathLike,
    workers: int | None = None,
    storage: str | None = None,
    progress: bool = True,
    retry_failed: bool = False,
    devices: Devices = None,
    trials_per_device: int | None = None,
    threads: int | None = None,
    config: SweepConfig | None = None,
) -> Sweep:
    """Create (or resume) the sweep and run it on this machine's slots (see `placement`).

    On the CPU there are `workers` processes (this one included); on GPUs one worker per device ×
    `trials_per_device`, each seeing its one GPU, and this process only watches. A summary is
    written to ``RUN/run.json``; for a sweep over µP (else u-µP: `SweepConfig.transferred`), its proxy optimum's
    trial's trajectory (recorded in its worker) goes to ``RUN/proxy_trajectory.json``
    (`trajectory.write_proxy_trajectory`: nothing is trained again).

    Args:
        config_path: the sweep's TOML file.
        run_dir: the run directory (created, or resumed when it holds the same config).
        workers: CPU worker processes, this one included (default 1).
        storage: the storage URL (default ``MUTRANSFER_STORAGE``, the config's, else
            ``RUN/sweep.db``).
        progress: show a progress bar on stderr.
        retry_failed: first queue every failed trial again (see `Sweep.retry_failed`).
        devices: "auto", "cpu" or GPU ids; None: the config's.
        trials_per_device: workers per GPU; None: the config's.
        threads: torch threads per worker; None: the config's (else the cores split).
        config: `config_path` already loaded by the caller (the TOML is read once per command).

    Returns:
        The finished sweep.

    Raises:
        ValueError: a bad config, objective, storage or placement (nothing is left behind).
        SweepInterrupted: Ctrl-C or SIGTERM (a KeyboardInterrupt; its `signum` says which): the
            running trials were marked interrupted and queued again, the workers stopped;
            rerunning resumes.
        RuntimeError: worker processes failed and trials are unfinished; rerunning resumes.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be at least 1, got {workers}")
    config = config if config is not None else load_config(config_path)  # read once: workers, then the sweep
    placement = plan(
        config.devices if devices is None else devices,
        trials_per_device or config.trials_per_device,
        workers,
        threads or config.threads,
    )
    if placement.on_gpus and config.precision != "fp32":
        _check_gpus(placement, config.precision)
    # The workers start first and warm up while this process creates the sweep; they begin work
    # on "go", or leave when the sweep is refused.
    recipe = config.objective.startswith("recipe:")  # trains with torch optimizers: worth warming up
    procs = [
        start_worker(run_dir, placement, slot, wait=not placement.local_worker, optimizer=recipe)
        for slot in range(int(placement.local_worker), placement.slots)
    ]
    previous_threads = torch.get_num_threads()
    try:
        sweep = Sweep.create(config_path, run_dir, storage, config=config)  # objective and storage checked first
        if placement.local_worker:
            sweep.use_device("cpu")
        sweep.prepare()
        if retry_failed:
            n = sweep.retry_failed()
            print(f"retrying {n} failed trial(s)" if n else "no failed trial to retry", file=sys.stderr)
    except BaseException:
        release_workers(procs, None)
        raise
    if progress and (placement.slots > 1 or placement.on_gpus):
        print(f"sweep {sweep.config.name}: {placement.describe()}", file=sys.stderr, flush=True)
    release_workers(procs, sweep.url)
    try:
        if placement.local_worker:
            torch.set_num_threads(placement.threads)
            sweep.work(progress=progress)
        else:
            sweep.watch(procs, progress=progress)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (`Terminated`)
        with interrupts_ignored():
            stop_workers(procs)
            tally = sweep.tally()
            raise SweepInterrupted(tally.finished, tally.total, int(getattr(e, "signum", signal.SIGINT))) from None
    except SystemExit:
        with interrupts_ignored():
            stop_workers(procs)
        raise
    finally:
        torch.set_num_threads(previous_threads)
        codes = [p.wait() for p in procs]
    failed = [(p.pid, c) for p, c in zip(procs, codes) if c]
    tally = sweep.tally()  # one pass over the studies for the checks and run.json
    unfinished = tally.unfinished
    if failed and unfinished > 0:
        raise RuntimeError(
            f"{len(failed)} worker process(es) failed (exit codes {[c for _, c in failed]}) "
            f"and {unfinished} trial(s) are unfinished; rerun to resume"
        )
    if failed:
        for pid, code in failed:  # the other workers ran what they left: the sweep is complete
            print(
                f"warning: worker process {pid} exited with {code}{_exit_reason(code)}; its trials were retried",
                file=sys.stderr,
                flush=True,
            )
    elif unfinished > 0:
        raise RuntimeError(f"the workers left with {unfinished} trial(s) unfinished; rerun to resume")
    # the trials recorded their trajectories in their workers: the proxy's is the optimum's (nothing trained here)
    recorded = write_proxy_trajectory(sweep, say=lambda line: print(line, file=sys.stderr, flush=True))
    write_atomically(
        sweep.run_dir / "run.json",
        json.dumps(
            {
                "storage": mask_url(sweep.url),
                "placement": placement.describe(),
                "devices": sorted(set(g for g in placement.gpus if g is not None)) or "cpu",
                "threads": placement.threads,
                "precision": sweep.config.precision,
                "finished_trials": tally.finished,
                "failed_trials": tally.failed,
                "pruned_trials": tally.pruned,
                "total_trials": tally.total,
                **({"proxy_trajectory": recorded} if recorded is not None else {}),
            },
            indent=1,
        ),
    )
    return sweep
