"""µTransfer sweeps on proxy models: one Optuna study per cell (parametrization, width[, depth]),
workers claiming trials, a report and the transfer to the target.

What users call is here (`mt.sweep.run_sweep`, `mt.sweep.Sweep`, `mt.sweep.load_config`, and
`Scale`, `Pruned`, `mup_kwargs` for their own objective); the modules behind it are the engine.
Everything is imported on first use, so that ``import mutransfer.sweep`` does not wait for torch.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

# public name → module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    "Sweep": ".engine.runner",
    "run_sweep": ".launch.workers",
    "SweepConfig": ".config.config",
    "load_config": ".config.config",
    "config_from_dict": ".config.config",
    "Cell": ".config.cells",
    "Scale": ".scale",
    "Pruned": ".scale",
    "mup_kwargs": ".scale",
    "load_objective": ".recipes",
    "mask_url": ".engine.storage",
    "fit_measured_laws": ".analysis.hparam_fits",
    "forecast": ".analysis.forecasts",
    "Forecast": ".analysis.forecasts",
}
# old public name → (module, name, what to use instead); importable for one release with a warning
_DEPRECATED: dict[str, tuple[str, str, str]] = {}

__all__ = [
    "Cell",
    "Forecast",
    "Pruned",
    "Scale",
    "Sweep",
    "SweepConfig",
    "config_from_dict",
    "fit_measured_laws",
    "forecast",
    "load_config",
    "load_objective",
    "mask_url",
    "mup_kwargs",
    "run_sweep",
]

if TYPE_CHECKING:  # what type checkers and the API docs see; at run time `__getattr__` imports on use
    from .analysis.forecasts import Forecast, forecast
    from .analysis.hparam_fits import fit_measured_laws
    from .config.cells import Cell
    from .config.config import SweepConfig, config_from_dict, load_config
    from .engine.runner import Sweep
    from .engine.storage import mask_url
    from .launch.workers import run_sweep
    from .recipes import load_objective
    from .scale import Pruned, Scale, mup_kwargs


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name in _DEPRECATED:
        module, attr, instead = _DEPRECATED[name]
        warnings.warn(
            f"mutransfer.sweep.{name} is deprecated and will be removed in the next release; use {instead}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module, __name__), attr)
    else:
        raise AttributeError(f"module 'mutransfer.sweep' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
