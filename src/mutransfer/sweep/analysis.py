"""Read a sweep's trials back and find what µTransfer needs: optima per width and their drift."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from optuna.trial import TrialState

from .runner import Sweep
from .space import Choice, LogUniform


@dataclass(frozen=True)
class TrialResult:
    parametrization: str
    width: int
    number: int
    params: dict
    loss: float  # NaN when diverged
    diverged: bool
    seconds: float


def load_results(sweep: Sweep) -> list[TrialResult]:
    """Every finished trial (completed or diverged) of every (parametrization, width) study."""
    out = []
    for parametrization, width in sweep.config.cells:
        for t in sweep.study(parametrization, width).get_trials(deepcopy=False):
            diverged = t.state == TrialState.FAIL and bool(t.user_attrs.get("diverged"))
            if t.state != TrialState.COMPLETE and not diverged:
                continue
            params = {name: t.params.get(name, t.system_attrs.get("fixed_params", {}).get(name))
                      for name in sweep.config.space}
            out.append(TrialResult(parametrization, width, t.number, params,
                                   math.nan if diverged else float(t.value), diverged,
                                   float(t.user_attrs.get("seconds", 0.0))))
    return out


def best(results: list[TrialResult], parametrization: str, width: int) -> Optional[TrialResult]:
    cell = [r for r in results if r.parametrization == parametrization and r.width == width and not r.diverged]
    return min(cell, key=lambda r: r.loss, default=None)


def drift(sweep: Sweep, results: list[TrialResult], parametrization: str, name: str) -> Optional[float]:
    """How far the optimum of HP `name` moves from the smallest to the largest width: in octaves
    (log2 ratio) for a log-scaled HP, in units of the value otherwise; None for a choice."""
    dim = sweep.config.space[name]
    if isinstance(dim, Choice):
        return None
    ws = [w for w in sweep.config.widths if best(results, parametrization, w) is not None]
    if len(ws) < 2:
        return None
    a, b = best(results, parametrization, ws[0]).params[name], best(results, parametrization, ws[-1]).params[name]
    return math.log2(b / a) if isinstance(dim, LogUniform) else b - a


def max_drift_steps(sweep: Sweep, results: list[TrialResult], parametrization: str, name: str) -> Optional[float]:
    """Largest move of the optimum between any two widths, in grid steps (log HPs on a grid)."""
    dim = sweep.config.space[name]
    if not isinstance(dim, LogUniform) or dim.grid < 2:
        return None
    step = math.log2(dim.high / dim.low) / (dim.grid - 1)
    opts = [math.log2(b.params[name]) for w in sweep.config.widths
            if (b := best(results, parametrization, w)) is not None]
    return (max(opts) - min(opts)) / step if len(opts) >= 2 else None


def wider_is_better(sweep: Sweep, results: list[TrialResult], parametrization: str) -> Optional[bool]:
    """Does the best loss decrease (not increase by more than 1%) as width grows?"""
    losses = [b.loss for w in sweep.config.widths if (b := best(results, parametrization, w)) is not None]
    if len(losses) < 2:
        return None
    return all(b <= a * 1.01 for a, b in zip(losses, losses[1:]))


def transferred_hparams(sweep: Sweep, results: list[TrialResult], width: Optional[int] = None,
                        parametrization: str = "mup") -> Optional[dict]:
    """The optimum found at the proxy `width` (default: the smallest), with the [fixed] table."""
    width = width or min(sweep.config.widths)
    b = best(results, parametrization, width)
    return None if b is None else {**sweep.config.fixed, **b.params}
