"""µTransfer sweeps on proxy models: Optuna studies per (parametrization, width[, depth]), report, transfer."""

from .config import SweepConfig, config_from_dict, load_config
from .objective import Pruned, Scale, mup_kwargs
from .runner import Sweep
from .storage import mask_url
from .workers import run_sweep

__all__ = [
    "Pruned",
    "Scale",
    "Sweep",
    "SweepConfig",
    "config_from_dict",
    "load_config",
    "mask_url",
    "mup_kwargs",
    "run_sweep",
]
