"""µTransfer sweeps on proxy models: Optuna studies per (parametrization, width[, depth]), report, transfer."""
from .config import SweepConfig, config_from_dict, load_config
from .objective import Pruned, Scale, mup_kwargs
from .runner import Sweep
from .workers import run_sweep
from .storage import mask_url

__all__ = ["SweepConfig", "config_from_dict", "load_config", "Pruned", "Scale", "mup_kwargs", "Sweep", "run_sweep", "mask_url"]
