"""Every exception and warning mutransfer raises or emits, in one place.

Each error for bad input is also a `ValueError` (or a `TypeError` for a wrong kind of object), so
code written against the builtin classes keeps working; catch `MuTransferError` to catch them all.
Messages name the parameter, file or option involved and say what to do.

This module imports nothing: any part of the package (and `mutransfer.limits`, which otherwise
stands alone) may raise these.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CoordCheckError",
    "DeviceError",
    "ExportError",
    "HParamTransferError",
    "KernelWarning",
    "ModelError",
    "MonitorAlarm",
    "MuPWarning",
    "MuTransferError",
    "OptimizerError",
    "StorageError",
    "SweepInterrupted",
    "Terminated",
    "UsageError",
]


class MuTransferError(Exception):
    """Base class of every error mutransfer raises on purpose."""


class ModelError(MuTransferError, ValueError):
    """The model cannot be put in µP as asked: no width dims, base and delta that do not match,
    a role or an attention scale that could not be established, a second `parametrize`."""


class OptimizerError(MuTransferError, ValueError):
    """`param_groups` or a ready optimizer got an optimizer, an option or groups it cannot scale."""


class CoordCheckError(MuTransferError, ValueError):
    """`coord_check` got widths, data or a model factory it cannot check."""


class DeviceError(MuTransferError, ValueError):
    """A `device=` or `precision=` this process cannot train on: no CUDA, an index past the
    visible GPUs, bf16 on a GPU without it, or a name that is not a device."""


class ExportError(MuTransferError, ValueError):
    """`export` could not fold a forward constant into the weights and prove it on a probe."""


class ConfigError(MuTransferError, ValueError):
    """A sweep config (TOML or dict) or a run directory that is invalid: the message names the key."""


class StorageError(MuTransferError, ValueError):
    """A sweep's storage failed for longer than the sweep waits (``MUTRANSFER_STORAGE_PATIENCE``):
    the message names the storage (password hidden) and what to do; rerunning resumes."""


class HParamTransferError(MuTransferError, ValueError):
    """`mt.transfer_hparams` cannot carry a hyperparameter to the target by a rule it knows (bad
    input, or a regime no rule covers): the message names the parameter and the fix."""


class UsageError(MuTransferError, ValueError):
    """Bad input to a command or a call (a flag, a `mt.Monitor` or `mt.gradient_noise_scale` setting): the
    `mutransfer` command prints it in one line and exits with 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, `kill` and schedulers send) reached a sweep or worker process: it
    is handled exactly like Ctrl-C (see `mutransfer.sweep.engine.interrupts`); `signum` is SIGTERM's number."""

    def __init__(self, signum: int = 15):
        super().__init__("terminated")
        self.signum = signum


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a sweep: the running trials were queued again and local workers
    stopped. `finished` trials of `total` are done; rerunning the same command resumes. `signum`
    is the signal's number (2 for Ctrl-C, 15 for SIGTERM): the command exits with 128 + signum."""

    def __init__(self, finished: int, total: int, signum: int = 2):
        word = "terminated" if signum == 15 else "interrupted"
        super().__init__(f"{word}: {finished} trials done, rerun to resume")
        self.finished, self.total, self.signum = finished, total, signum


class MonitorAlarm(RuntimeError):
    """`mt.Monitor(..., raise_on_alarm=True)` found the run out of µP: `alarms` holds the sample's
    `mt.monitor.Alarm`s (step, layer, what, measured, expected, cause). Not bad input: the run
    itself left µP, so it is a RuntimeError, raised to stop the run."""

    def __init__(self, alarms: list):
        self.alarms = list(alarms)
        head = "; ".join(str(a) for a in self.alarms[:3])
        super().__init__(f"µP monitor: {head}{' …' if len(self.alarms) > 3 else ''}")


class MuPWarning(UserWarning):
    """A decision mutransfer could not establish on the running model (names the parameter and the fix)."""


class KernelWarning(UserWarning):
    """An infinite-width kernel computed another way than asked (e.g. Monte Carlo, not exact)."""
