"""The ``"independent"`` sampler: u-µP's search (Blake et al., 2025), lr first, then each other
hyperparameter alone.

u-µP's hyperparameters are near-optimal at their defaults and nearly independent of each other,
so instead of searching them jointly the paper sweeps them one at a time. Per study (one cell):

1. **lr**: every point of ``[space.lr]``'s grid, every other hyperparameter at its `default`
   (`space.default_value`: the ``default`` key, else the grid point nearest the range's centre).
2. **each other hyperparameter, alone** (once every stage-1 trial is done): every point of its grid
   at stage 1's best lr, the others at their defaults. Its default itself is not run again when it
   is a grid point: stage 1's best trial is that point. These trials may run in parallel.
3. **the combination** (once stage 2 is done; only when the space has more than lr): one trial at
   stage 1's best lr with each hyperparameter at the best value of its own stage-2 sweep (its
   default when no swept value beat stage 1's best).

A trial that diverged or failed counts as done, with no loss; if every lr of stage 1 diverged, stage
2 runs at lr's default. The study runs ``len(lr grid) + Σ (len(grid) − [default on grid]) + 1``
trials (no `n_trials`).

This is a study driver, not an Optuna sampler object: the points of each stage are queued as
WAITING trials (`enqueue_due`, called under the sweep's claim lock before each claim), then claimed
like a grid's. What is due is recomputed from the study's trials each time, matched by their
values, so the search is resumable: a killed worker's trial is queued again with the same values
(`storage`'s retry), a finished trial is never rerun, and a stage starts as soon as the one before
it is done, whichever worker finishes it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ...errors import ConfigError
from ..config.space import Dimension, default_value
from .storage import enqueue_many, study_id
from .trials import trial_outcome

__all__ = ["LR", "Plan", "enqueue_due", "plan", "plan_size", "require_lr"]

LR = "lr"


def require_lr(space: dict[str, Dimension]) -> None:
    """A ConfigError unless `space` sweeps ``lr`` (the independent sampler's first stage)."""
    if LR not in space:
        raise ConfigError(
            f'sampler "independent" sweeps lr first, then each other hyperparameter: add a [space.lr] table '
            f"(swept now: {', '.join(space) or 'nothing'}), or use another sampler"
        )


def _others(space: dict[str, Dimension]) -> list[str]:
    return [name for name in space if name != LR]


def _alone(dim: Dimension) -> list[Any]:
    """Stage 2's points of one hyperparameter: its grid without its default."""
    default = default_value(dim)
    return [v for v in dim.grid_points() if v != default]


def plan_size(space: dict[str, Dimension]) -> int:
    """How many trials the independent search runs per study on `space`."""
    require_lr(space)
    others = _others(space)
    return len(space[LR].grid_points()) + sum(len(_alone(space[n])) for n in others) + (1 if others else 0)


@dataclass(frozen=True)
class Plan:
    """What the independent search has settled so far on one study.

    Attributes:
        points: every point due so far, stage by stage (a point is a dict of every swept value).
        stages: the stage of each point: ``"lr"``, a hyperparameter's name, or ``"combined"``.
        best: the best value found per hyperparameter so far (lr after stage 1; the others after stage 2).
        complete: every stage is known (`points` holds the whole search).
    """

    points: list[dict[str, Any]]
    stages: list[str]
    best: dict[str, Any]
    complete: bool


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


def _params(t: FrozenTrial) -> dict[str, Any]:
    return dict(t.params) if t.params else dict(t.system_attrs.get("fixed_params") or {})


def _done(t: FrozenTrial) -> bool:
    return trial_outcome(t) is not None


def _taken(t: FrozenTrial) -> bool:
    """Holds its point: waiting, running or done (a FAIL that was interrupted or retried has a
    replacement in the queue, which holds it instead)."""
    return t.state in (TrialState.WAITING, TrialState.RUNNING) or _done(t)


def _value(t: FrozenTrial) -> float | None:
    if t.state != TrialState.COMPLETE or t.value is None or not math.isfinite(t.value):
        return None
    return float(t.value)


def plan(space: dict[str, Dimension], trials: list[FrozenTrial]) -> Plan:
    """The points of the independent search on `space`, as far as `trials` (the study's) settle them.

    Args:
        space: the study's search space (lr among it).
        trials: every trial of the study, in any state.

    Returns:
        The `Plan`: stage 1's points always; stage 2's once every stage-1 point is done; the
        combination once every stage-2 point is done.
    """
    require_lr(space)
    defaults = {name: default_value(dim) for name, dim in space.items()}
    done: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        if _done(t):
            done.setdefault(_key(_params(t)), []).append(t)

    def results(point: dict[str, Any]) -> list[FrozenTrial]:
        return done.get(_key(point), [])

    def best_of(points: list[dict[str, Any]]) -> dict[str, Any] | None:
        scored = [(v, i) for i, p in enumerate(points) for t in results(p) if (v := _value(t)) is not None]
        return points[min(scored)[1]] if scored else None

    points = [{**defaults, LR: lr} for lr in space[LR].grid_points()]
    stages = [LR] * len(points)
    others = _others(space)
    if not others or not all(results(p) for p in points):
        return Plan(points, stages, {}, complete=not others)
    stage1 = best_of(points)
    best_lr = stage1[LR] if stage1 is not None else defaults[LR]
    best: dict[str, Any] = {LR: best_lr}
    anchor = {**defaults, LR: best_lr}  # each hyperparameter at its default: stage 1's best point
    stage2: dict[str, list[dict[str, Any]]] = {n: [{**anchor, n: v} for v in _alone(space[n])] for n in others}
    for name, own in stage2.items():
        points += own
        stages += [name] * len(own)
    if not all(results(p) for p in points):
        return Plan(points, stages, best, complete=False)
    for name, own in stage2.items():
        winner = best_of([anchor, *own])
        best[name] = winner[name] if winner is not None else defaults[name]
    points.append({**defaults, **best})
    stages.append("combined")
    return Plan(points, stages, best, complete=True)


def enqueue_due(storage: optuna.storages.RDBStorage, study: optuna.Study, space: dict[str, Dimension]) -> int:
    """Queue every point of the independent search that is due and held by no trial. Call under the
    sweep's claim lock (two workers would queue a point twice).

    Args:
        storage: the sweep's storage.
        study: one cell's study.
        space: its search space (`SweepConfig.space_for` its parametrization).

    Returns:
        How many trials were queued.
    """
    trials = storage.get_all_trials(study_id(study), deepcopy=False)
    held = Counter(_key(_params(t)) for t in trials if _taken(t))
    missing = []
    for point in plan(space, trials).points:
        key = _key(point)
        if held[key] > 0:
            held[key] -= 1
        else:
            missing.append(point)
    if missing:
        enqueue_many(storage, study_id(study), missing)
    return len(missing)
