"""Deprecated: renamed `mutransfer.sweep.recipes` (the built-in objectives); removed in the next release."""

import warnings

from .recipes import OPTIMIZER_HPS, SWEEP_RECIPES, TASKS, Builder, load_objective, train_gpt, train_mlp, train_resmlp

__all__ = [
    "OPTIMIZER_HPS",
    "SWEEP_RECIPES",
    "TASKS",
    "Builder",
    "load_objective",
    "train_gpt",
    "train_mlp",
    "train_resmlp",
]

warnings.warn(
    "mutransfer.sweep.objectives was renamed mutransfer.sweep.recipes and will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
