"""Where a sweep's trials run on one machine: worker slots, their GPU and their CPU threads.

A *slot* is one long-lived worker process. With GPUs, each device gets `trials_per_device`
slots (several small proxies may share one GPU), and every slot's process starts with
``CUDA_VISIBLE_DEVICES`` set to its one GPU, so the code inside sees it as ``cuda:0`` (the way
Optuna's FAQ recommends placing trials). Without GPUs there are `workers` CPU slots (the
sweep's own process is one of them, as always).

- ``devices = "auto"``: every GPU this process sees (``torch.cuda.device_count()``, which
  respects an existing ``CUDA_VISIBLE_DEVICES`` and creates no CUDA context), else the CPU.
- ``devices = "cpu"``: CPU slots only.
- ``devices = [0, 1, 2, 3]``: these GPUs, numbered as this process numbers them (``cuda:i``):
  under ``CUDA_VISIBLE_DEVICES=4,5`` the ids are 0 and 1, and the slots get ``4`` and ``5``.
  Ids are taken as given where this process sees no GPU (a scheduler's allocation, or a test
  on a machine without GPUs): the trials then run on the CPU with the variable set, and a
  warning says so.

CPU threads are split between the slots: each worker calls ``torch.set_num_threads(threads)``
with ``threads = max(1, cores // slots)`` (cores: the CPUs this process may run on), unless
`threads` is given. Without the split every worker used every core: ``--workers 2`` on 2 cores
ran 4 threads, and tiny models slowed down many times over (see benchmarks/sweep_threads.py).

Worker processes are new interpreters (``subprocess``, the same as multiprocessing's
``spawn``): nothing of this process's state, CUDA's included, is inherited.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEVICE_ENV",
    "SLOT_ENV",
    "THREADS_ENV",
    "Devices",
    "Placement",
    "available_cores",
    "gpu_names",
    "parse_devices",
    "plan",
    "visible_devices",
    "warn_no_gpu",
]

Devices = str | Sequence[int] | None
SLOT_ENV = "MUTRANSFER_SLOT"  # a worker's slot number, "<slot>/<slots>"
THREADS_ENV = "MUTRANSFER_THREADS"  # a worker's torch thread count
DEVICE_ENV = "MUTRANSFER_DEVICE"  # "cuda" for a GPU slot, "cpu" for a CPU slot
_CUDA = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Placement:
    """The slots of a sweep on this machine.

    `gpus`: the ``CUDA_VISIBLE_DEVICES`` value of each slot (None for a CPU slot); `threads`:
    torch threads per worker; `local_worker`: whether the sweep's own process runs trials too
    (CPU sweeps: yes, as before; GPU sweeps: no, it only watches, and never touches CUDA)."""

    gpus: tuple[str | None, ...]
    threads: int
    local_worker: bool

    @property
    def slots(self) -> int:
        return len(self.gpus)

    @property
    def on_gpus(self) -> bool:
        return any(g is not None for g in self.gpus)

    def env(self, slot: int) -> dict[str, str]:
        """The environment variables a worker in `slot` starts with."""
        env = {
            THREADS_ENV: str(self.threads),
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
            SLOT_ENV: f"{slot}/{self.slots}",
            DEVICE_ENV: "cpu" if self.gpus[slot] is None else "cuda",
        }
        gpu = self.gpus[slot]
        if gpu is not None:
            env[_CUDA] = gpu
        return env

    def describe(self) -> str:
        """'4 workers on GPUs 0, 1 (2 per device), 1 thread each' or '2 CPU workers, 1 thread each'."""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''} each"
        if not self.on_gpus:
            return f"{self.slots} CPU worker{'s' if self.slots != 1 else ''}, {threads}"
        ids = list(dict.fromkeys(g for g in self.gpus if g is not None))
        per = self.slots // len(ids)
        return (
            f"{self.slots} worker{'s' if self.slots != 1 else ''} on GPU{'s' if len(ids) != 1 else ''} "
            f"{', '.join(ids)} ({per} per device; CUDA_VISIBLE_DEVICES), {threads}"
        )


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask: a Slurm or cgroup allocation), else all."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def visible_devices() -> int:
    """How many GPUs this process sees, without creating a CUDA context (0 without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def parse_devices(devices: Devices, what: str = "devices") -> str | list[int]:
    """ "auto", "cpu" or the list of GPU ids in `devices` (a config value or a CLI string like
    "0,1,2,3"); a ValueError naming `what` otherwise."""
    if devices is None:
        return "auto"
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("auto", "cpu"):
            return text
        try:
            devices = [int(d) for d in text.replace(" ", "").split(",") if d]
        except ValueError:
            raise ValueError(f"{what} must be 'auto', 'cpu' or GPU ids like 0,1,2,3; got {text!r}") from None
    if not isinstance(devices, (list, tuple)) or any(isinstance(d, bool) or not isinstance(d, int) for d in devices):
        raise ValueError(f'{what} must be "auto", "cpu" or a list of GPU ids like [0, 1]; got {devices!r}')
    if not devices:
        raise ValueError(
            f'{what} is empty; give GPU ids like [0, 1], or "auto" (every visible GPU, else the CPU) or "cpu"'
        )
    if any(d < 0 for d in devices):
        raise ValueError(f"{what} must hold GPU ids ≥ 0, got {list(devices)!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(
            f"{what} has duplicates: {list(devices)!r}; to run several trials on one GPU set trials_per_device instead"
        )
    return list(devices)


def _positive(value: int | None, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def plan(
    devices: Devices = None,
    trials_per_device: int | None = None,
    workers: int | None = None,
    threads: int | None = None,
    *,
    what: str = "devices",
    cores: int | None = None,
    gpu_count: int | None = None,
) -> Placement:
    """The slots for `devices` (see the module docstring; None: "auto", but `workers` alone means CPU).

    `workers`: CPU worker processes (the sweep's own included; default `trials_per_device`, else 1);
    with GPUs the slots are devices × `trials_per_device` and `workers` must not be given.
    `cores` and `gpu_count` default to this machine's (tests pass their own)."""
    explicit = devices is not None
    parsed = parse_devices(devices, what)
    trials_per_device = _positive(trials_per_device, "trials_per_device")
    workers = _positive(workers, "workers")
    threads = _positive(threads, "threads")
    cores = available_cores() if cores is None else cores
    count = -1  # asked (torch imported) only where needed: not for "cpu"
    if parsed == "auto":
        count = visible_devices() if gpu_count is None else gpu_count
        if count == 0 or (workers is not None and not explicit):  # --workers alone: CPU workers, as before
            parsed = "cpu"
        else:
            parsed = list(range(count))
    if isinstance(parsed, str):  # "cpu": "auto" became a list of ids above, or "cpu"
        n = workers or trials_per_device or 1
        return Placement((None,) * n, threads or max(1, cores // n), local_worker=True)
    if workers is not None:
        raise ValueError(
            f"workers ({workers}) is for CPU sweeps; on GPUs the workers are {what} × "
            f"trials_per_device ({len(parsed)} × {trials_per_device or 1}): set trials_per_device "
            "to run several trials per GPU"
        )
    if count < 0:
        count = visible_devices() if gpu_count is None else gpu_count
    mapped = gpu_names(parsed, what, count)
    if count == 0:
        warn_no_gpu(parsed, what, stacklevel=3)
    per = trials_per_device or 1
    gpus = tuple(g for g in mapped for _ in range(per))
    return Placement(gpus, threads or max(1, cores // len(gpus)), local_worker=False)


def warn_no_gpu(ids: Sequence[int], what: str = "devices", stacklevel: int = 2) -> None:
    """The warning for GPU ids given where this process sees no GPU: the trials run on the CPU."""
    warnings.warn(
        f"{what} {list(ids)}: this process sees no GPU (no CUDA, or a CPU build of torch); the trials run "
        "on the CPU with CUDA_VISIBLE_DEVICES set as asked",
        UserWarning,
        stacklevel=stacklevel,
    )


def gpu_names(ids: Sequence[int], what: str = "devices", gpu_count: int | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entry of each GPU id, ids numbered as this process numbers GPUs:
    within a set ``CUDA_VISIBLE_DEVICES`` (ids 0 and 1 under ``4,5`` are ``"4"`` and ``"5"``), else
    as given. A ValueError naming `what` for an id this process cannot see (`gpu_count`: the
    visible GPUs, default this machine's; with none visible, ids pass through unchecked)."""
    visible = os.environ.get(_CUDA)
    names = _visible_names(visible)
    if names is not None:
        bad = [d for d in ids if d >= len(names)]
        if bad:
            raise ValueError(
                f"{what}: GPU id(s) {bad} are not visible here (CUDA_VISIBLE_DEVICES={visible} "
                f"gives ids 0 to {len(names) - 1}); ids count within CUDA_VISIBLE_DEVICES"
            )
        return [names[d] for d in ids]
    count = visible_devices() if gpu_count is None else gpu_count
    bad = [d for d in ids if d >= count] if count else []
    if bad:
        raise ValueError(
            f"{what}: GPU id(s) {bad} are not visible here (this process sees {count} GPU(s), ids 0 to {count - 1})"
        )
    return [str(d) for d in ids]


def _visible_names(value: str | None) -> list[str] | None:
    """The entries of a set CUDA_VISIBLE_DEVICES (None when unset)."""
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]
