"""A sweep's cells: one Optuna study each, at one parametrization, width, depth and (optionally)
one further batch size or training horizon.

A `Cell` is a named tuple, so ``parametrization, width, depth, extra = cell`` and
``sweep.study(*cell)`` read as they did when cells were bare tuples; its properties are what was
recomputed from those tuples in several places (the study's name, the progress label, the
sampler's seed, the hyperparameters the cell sets).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Cell", "parametrization_hparams"]


def parametrization_hparams(parametrization: str) -> dict[str, str]:
    """What a cell of `parametrization` adds to its hyperparameters: ``{"parametrization": "u-mup"}`` for a
    u-µP cell (so `mup_kwargs`, and through it the recipes, parametrize the model as u-µP), else nothing
    (a µP cell keeps what [fixed] says; an SP cell builds the plain model).

    Args:
        parametrization: the cell's, one of `config.PARAMETRIZATIONS`.

    Returns:
        The hyperparameters to merge over the trial's.
    """
    return {"parametrization": "u-mup"} if parametrization == "u-mup" else {}


class Cell(NamedTuple):
    """Where one study of a sweep trains its trials.

    Attributes:
        parametrization: "mup", "u-mup" (unit-scaled µP) or "sp".
        width: the model width the objective builds (`Scale.width`).
        depth: the number of residual blocks in a sweep over ``depths``; None keeps the
            objective's own depth.
        extra: ``()`` for a cell of the width × depth grid (it runs at the proxy batch size and
            horizon); ``(("batch_size", 64),)`` or ``(("steps", 400),)`` for a further batch size
            or horizon, which runs at the proxy width and depth.
    """

    parametrization: str
    width: int
    depth: int | None = None
    extra: tuple[tuple[str, int], ...] = ()

    @property
    def label(self) -> str:
        """'mup width 32', 'mup width 32 depth 4' or 'mup width 32 batch_size 64', for progress lines."""
        return (
            f"{self.parametrization} width {self.width}"
            + ("" if self.depth is None else f" depth {self.depth}")
            + "".join(f" {axis} {value}" for axis, value in self.extra)
        )

    def study_name(self, sweep_name: str) -> str:
        """The Optuna study's name: `{sweep_name}/{parametrization}/w{width}`, plus `/d{depth}` in a
        sweep over depths and `/batch_size{b}` or `/steps{s}` for a further batch size or horizon.

        Args:
            sweep_name: the config's ``name``.

        Returns:
            The name the study is stored under (workers elsewhere find it by this name).
        """
        name = f"{sweep_name}/{self.parametrization}/w{self.width}" + ("" if self.depth is None else f"/d{self.depth}")
        return name + "".join(f"/{axis}{value}" for axis, value in self.extra)

    @property
    def sampler_seed(self) -> int:
        """The seed of the cell's random or TPE sampler: distinct per cell, the same on every run."""
        return (
            1000 * self.width
            + (self.parametrization == "sp")
            + 7919 * (self.depth or 0)
            + sum(104729 * v for _, v in self.extra)
        ) % 2**32

    @property
    def extra_hparams(self) -> dict[str, Any]:
        """The batch size or horizon this cell sets (``{}`` for a width × depth cell), and a u-µP cell's
        ``parametrization`` (`parametrization_hparams`)."""
        return {**dict(self.extra), **parametrization_hparams(self.parametrization)}
