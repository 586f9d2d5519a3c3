"""Deprecated: renamed `mutransfer.sweep.scale` (what an objective receives); removed in the next release."""

import warnings

from .scale import MULTIPLIER_NAMES, Objective, Pruned, Reporter, Scale, mup_kwargs

__all__ = ["MULTIPLIER_NAMES", "Objective", "Pruned", "Reporter", "Scale", "mup_kwargs"]

warnings.warn(
    "mutransfer.sweep.objective was renamed mutransfer.sweep.scale and will be removed in the next "
    "release; import Scale, Pruned and mup_kwargs from mutransfer.sweep",
    DeprecationWarning,
    stacklevel=2,
)
