"""Read a sweep's trials back and find what µTransfer needs: optima per width (and depth) and
their drift.

In a sweep over depths, a drift "along width" is measured at one depth (default: the smallest,
the proxy depth) and a drift "along depth" at one width (default: the smallest, the proxy width).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from optuna.trial import TrialState

from .runner import Sweep
from .space import Choice, LogUniform

AXES = ("width", "depth")


@dataclass(frozen=True)
class TrialResult:
    parametrization: str
    width: int
    number: int
    params: dict
    loss: float  # NaN when diverged
    diverged: bool
    seconds: float
    depth: Optional[int] = None  # None when the sweep has no depths


def load_results(sweep: Sweep) -> list[TrialResult]:
    """Every finished trial (completed or diverged) of every (parametrization, width, depth) study."""
    out = []
    for parametrization, width, depth in sweep.config.cells:
        for t in sweep.study(parametrization, width, depth).get_trials(deepcopy=False):
            diverged = t.state == TrialState.FAIL and bool(t.user_attrs.get("diverged"))
            if t.state != TrialState.COMPLETE and not diverged:
                continue
            params = {name: t.params.get(name, t.system_attrs.get("fixed_params", {}).get(name))
                      for name in sweep.config.space}
            out.append(TrialResult(parametrization, width, t.number, params,
                                   math.nan if diverged else float(t.value), diverged,
                                   float(t.user_attrs.get("seconds", 0.0)), depth))
    return out


def best(results: list[TrialResult], parametrization: str, width: int,
         depth: Optional[int] = None) -> Optional[TrialResult]:
    """The lowest-loss trial of one cell; `depth` None matches a sweep without depths."""
    cell = [r for r in results if r.parametrization == parametrization and r.width == width and r.depth == depth
            and not r.diverged]
    return min(cell, key=lambda r: r.loss, default=None)


def _along(sweep: Sweep, along: str, at: Optional[int]) -> list[tuple[int, Optional[int]]]:
    """The (width, depth) cells visited when moving along `along` with the other axis held `at`."""
    cfg = sweep.config
    if along == "width":
        depth = at if at is not None else cfg.proxy_depth
        return [(w, depth) for w in cfg.widths]
    if along == "depth":
        if cfg.depths is None:
            return []
        width = at if at is not None else min(cfg.widths)
        return [(width, d) for d in cfg.depths]
    raise ValueError(f"along must be one of {', '.join(AXES)}, got {along!r}")


def optima(sweep: Sweep, results: list[TrialResult], parametrization: str, along: str = "width",
           at: Optional[int] = None) -> list[TrialResult]:
    """The best trial of each cell along `along` (cells with no finished trial left out)."""
    return [b for w, d in _along(sweep, along, at) if (b := best(results, parametrization, w, d)) is not None]


def drift(sweep: Sweep, results: list[TrialResult], parametrization: str, name: str, along: str = "width",
          at: Optional[int] = None) -> Optional[float]:
    """How far the optimum of HP `name` moves from the smallest to the largest width (or depth,
    `along="depth"`): in octaves (log2 ratio) for a log-scaled HP, in units of the value
    otherwise; None for a choice."""
    dim = sweep.config.space[name]
    if isinstance(dim, Choice):
        return None
    opts = optima(sweep, results, parametrization, along, at)
    if len(opts) < 2:
        return None
    a, b = opts[0].params[name], opts[-1].params[name]
    return math.log2(b / a) if isinstance(dim, LogUniform) else b - a


def max_drift_steps(sweep: Sweep, results: list[TrialResult], parametrization: str, name: str,
                    along: str = "width", at: Optional[int] = None) -> Optional[float]:
    """Largest move of the optimum between any two widths (or depths), in grid steps (log HPs on a grid)."""
    dim = sweep.config.space[name]
    if not isinstance(dim, LogUniform) or dim.grid < 2:
        return None
    step = math.log2(dim.high / dim.low) / (dim.grid - 1)
    opts = [math.log2(b.params[name]) for b in optima(sweep, results, parametrization, along, at)]
    return (max(opts) - min(opts)) / step if len(opts) >= 2 else None


def bigger_is_better(sweep: Sweep, results: list[TrialResult], parametrization: str, along: str = "width",
                     at: Optional[int] = None) -> Optional[bool]:
    """Does the best loss decrease (not increase by more than 1%) as width (or depth) grows?"""
    losses = [b.loss for b in optima(sweep, results, parametrization, along, at)]
    if len(losses) < 2:
        return None
    return all(b <= a * 1.01 for a, b in zip(losses, losses[1:]))


def wider_is_better(sweep: Sweep, results: list[TrialResult], parametrization: str,
                    depth: Optional[int] = None) -> Optional[bool]:
    """Does the best loss decrease (not increase by more than 1%) as width grows (at `depth`)?"""
    return bigger_is_better(sweep, results, parametrization, "width", depth)


def deeper_is_better(sweep: Sweep, results: list[TrialResult], parametrization: str,
                     width: Optional[int] = None) -> Optional[bool]:
    """Does the best loss decrease (not increase by more than 1%) as depth grows (at `width`)?"""
    return bigger_is_better(sweep, results, parametrization, "depth", width)


def transferred_hparams(sweep: Sweep, results: list[TrialResult], width: Optional[int] = None,
                        parametrization: str = "mup", depth: Optional[int] = None) -> Optional[dict[str, Any]]:
    """The optimum found at the proxy `width` and `depth` (default: the smallest), with the [fixed] table."""
    width = width or min(sweep.config.widths)
    depth = depth or sweep.config.proxy_depth
    b = best(results, parametrization, width, depth)
    return None if b is None else {**sweep.config.fixed, **b.params}
