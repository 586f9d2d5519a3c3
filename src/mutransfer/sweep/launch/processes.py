"""A sweep's worker processes as processes: start them pinned to their slot, release them on the
storage, stop them; `run_workers`, a node's share of a sweep; and `NodeTask`, what a cluster array
task runs. Nothing here imports torch: a cluster task (submitit unpickles `NodeTask` in a new
interpreter) starts its workers at once, and each of them imports torch itself (3 s of CPU each on
the 2-core CI machine); what a worker does is `workers._worker_entry` and `runner.Sweep.work`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ..config.placement import Placement, plan, visible_devices, warn_no_gpu
from ..engine.interrupts import interrupts_ignored
from ..engine.storage import STORAGE_ENV

__all__ = [
    "PARENT_ENV",
    "NodeTask",
    "die_with_parent",
    "release_workers",
    "run_workers",
    "start_worker",
    "stop_workers",
]

# A worker process started by `run_sweep`. It starts before the sweep is created, so that its
# slow start (imports, see `workers._warm_up`) overlaps the parent's: it warms up, then waits for the
# parent's "go" and the storage URL on stdin (not on the command line: it may hold a password).
# A thread reads that line from the start: any other line or the end of input (the sweep was
# refused, the parent died) ends the process at once and quietly, even in the middle of importing
# torch (3 s of CPU per worker on the 2-core CI machine, which the parent's refusal would wait for).
# Ctrl-C (the terminal sends it to every process of the group) or SIGTERM (`timeout`, a scheduler:
# often to the whole group too) before it works exits at once and quietly; later, `workers._worker_entry`
# marks its trial interrupted and exits 130 (143) without a traceback (see `interrupts`).
_WORKER_CODE = (
    "import os, signal, sys, threading\n"
    "signal.signal(signal.SIGINT, lambda *_: os._exit(130))\n"
    "signal.signal(signal.SIGTERM, lambda *_: os._exit(143))\n"
    "def read(lines):\n"
    "    line = sys.stdin.readline()\n"
    "    if not line.startswith('go '):\n"
    "        os._exit(0)\n"
    "    lines.append(line)\n"
    "lines = []\n"
    "reader = threading.Thread(target=read, args=(lines,), daemon=True)\n"
    "reader.start()\n"
    "from mutransfer.sweep.launch.workers import _worker_entry\n"
    "sys.exit(_worker_entry(sys.argv[1], reader, lines, sys.argv[2] == 'wait', sys.argv[3] == 'torch'))\n"
)


PARENT_ENV = "MUTRANSFER_DIE_WITH"  # a worker that must end with its parent (this pid)


def stop_workers(procs: list[subprocess.Popen], grace: float = 60.0) -> None:
    """Ctrl-C or SIGTERM reached this process: make sure the workers got it too (a signal sent to
    this process alone did not reach them), let them mark their trials, then wait for them (killed
    after `grace` seconds): no worker outlives this process."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def release_workers(procs: list[subprocess.Popen], url: str | None) -> None:
    """Tell the waiting workers to work on the storage at `url`, or (None) to leave, and then wait
    until they have left."""
    for p in procs:
        try:
            if p.stdin is None:
                continue
            if url is not None:
                p.stdin.write(f"go {url}\n")
            p.stdin.close()
        except (BrokenPipeError, OSError):  # it died while warming up: reported when it is waited for
            pass
    if url is None:
        for p in procs:
            p.wait()


def start_worker(
    run_dir: str | os.PathLike,
    placement: Placement,
    slot: int,
    wait: bool,
    die_with_parent: bool = False,
    optimizer: bool = True,
) -> subprocess.Popen:
    """A worker process for `slot`: a new interpreter with the slot's GPU and thread count. With
    `wait`, it waits for the other workers' trials (no parent runs trials). `die_with_parent`: the
    kernel ends it when this process dies (a cluster task that was preempted or cancelled), so its
    trial goes stale and is run again elsewhere. `optimizer`: warm up a torch optimizer too (see
    `workers._warm_up`)."""
    env = {**os.environ, **placement.env(slot)}
    if die_with_parent:
        env[PARENT_ENV] = str(os.getpid())
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER_CODE, str(run_dir), "wait" if wait else "leave", "torch" if optimizer else "-"],
        stdin=subprocess.PIPE,
        text=True,
        env=env,
    )


def die_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux prctl
    PR_SET_PDEATHSIG; elsewhere nothing). Run by a cluster task and by its workers as they start."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


_PR_SET_PDEATHSIG = 1
try:  # looked up once, here: a child between fork and exec must not import
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):  # pragma: no cover
    _PRCTL = None


def run_workers(
    run_dir: str | os.PathLike, url: str, placement: Placement, meanwhile: Callable[[], object] | None = None
) -> list[int]:
    """Run one worker process per slot of `placement` on the sweep at `run_dir` (already prepared,
    storage `url`) until no trial is left; returns their exit codes. What a cluster task runs on
    its node: the workers die with it (preemption, cancel) and wait for each other's trials.
    `meanwhile`: run in this process once the workers are started (if it raises, the workers are
    stopped and the error goes on)."""
    procs = [start_worker(run_dir, placement, slot, wait=True, die_with_parent=True) for slot in range(placement.slots)]
    release_workers(procs, url)
    try:
        if meanwhile is not None:
            meanwhile()
        return [p.wait() for p in procs]
    except BaseException:
        with interrupts_ignored():
            stop_workers(procs)
        raise


try:  # the optional extra mutransfer[cluster]
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - submitit missing: `cluster.check_cluster` refuses [cluster]
    _Checkpointable = object  # type: ignore[assignment,misc]


class NodeTask(_Checkpointable):
    """One array task: the workers of one node (see `cluster`). Requeued by submitit at a time limit
    or preemption with the same arguments (its `checkpoint`). Its workers start before this process
    imports the sweep engine (torch): it opens the sweep while they work."""

    def __call__(self, run_dir: str, gpus: int, trials_per_device: int, threads: int | None = None) -> int:
        die_with_parent()  # a task whose job controller is killed leaves no orphan training
        url = os.environ.get(STORAGE_ENV)
        sweeps: list[Any] = []

        def open_sweep() -> None:
            from ..engine.runner import Sweep

            sweeps.append(Sweep(run_dir, storage=url))

        if url is None:  # `cluster.submit` always sets it; else the sweep's own storage, found first
            open_sweep()
            url = sweeps[0].url
        ids = list(range(gpus))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        # The task's GPUs map through CUDA_VISIBLE_DEVICES (Slurm's, or submitit's local one): no need to ask
        # torch how many it sees before the workers start; that is asked (for the warning) while they work.
        count = len([v for v in visible.split(",") if v.strip()]) if gpus and visible is not None else None
        placement = plan(ids or "cpu", trials_per_device, threads=threads, what="cluster.gpus_per_job", gpu_count=count)

        def meanwhile() -> None:
            if count and visible_devices() == 0:
                warn_no_gpu(ids, "cluster.gpus_per_job")
            if not sweeps:
                open_sweep()

        codes = run_workers(run_dir, url, placement, meanwhile=meanwhile)
        sweep = sweeps[0]
        left = sweep.total_trials() - sweep.finished()
        print(f"mutransfer task: workers exited with {codes}; {left} trial(s) of the sweep left", flush=True)
        return left
