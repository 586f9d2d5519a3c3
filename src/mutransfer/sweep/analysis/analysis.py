"""Read a sweep's trials back and find what µTransfer needs: optima per width (and depth) and
their drift.

In a sweep over depths, a drift "along width" is measured at one depth (default: the smallest,
the proxy depth) and a drift "along depth" at one width (default: the smallest, the proxy width).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config.space import Choice, LogUniform
from ..engine.runner import Sweep
from ..engine.trials import trial_outcome
from .statistics import Verdict, interval, judge, resample_index

__all__ = [
    "AXES",
    "TrialResult",
    "along_cells",
    "axes",
    "best",
    "bigger_is_better",
    "cells_along",
    "costs",
    "counts",
    "deeper_is_better",
    "drift",
    "head_to_head",
    "in_cell",
    "load_results",
    "max_drift_steps",
    "optima",
    "placements",
    "proxy_verdict",
    "same_point",
    "transferred_hparams",
    "verdicts",
    "wider_is_better",
]

AXES = ("width", "depth")


@dataclass(frozen=True)
class TrialResult:
    parametrization: str
    width: int
    number: int
    params: dict
    loss: float  # NaN when diverged, failed or pruned
    diverged: bool
    seconds: float
    depth: int | None = None  # None when the sweep has no depths
    losses: tuple = ()  # one loss per seed (NaN where that seed diverged); () when not recorded
    failed: bool = False  # the objective raised (see `error`); loss is NaN
    error: str = ""
    cpu_seconds: float = 0.0  # process CPU time of the trial (all seeds); 0 when not recorded
    extra: tuple = ()  # ((axis, value),) in a cell of a further batch size or horizon; () otherwise
    pruned: bool = False  # stopped early by the sweep's pruner: worse than the study's finished trials
    pruned_step: int | None = None  # the last step reported before pruning (None: none reported)
    pruned_loss: float = math.nan  # the loss reported at `pruned_step` (a lower fidelity than `loss`)
    device: str = ""  # where it trained: "cpu", "cuda:0" ("" when not recorded: a sweep before devices)
    cuda_visible_devices: str | None = None  # its worker's CUDA_VISIBLE_DEVICES (None when unset)
    precision: str = ""  # "fp32" or "bf16" ("" when not recorded)
    flops: float = math.nan  # the FLOPs of the seeds that ran (`flops.FlopCount`); NaN when not recorded
    flops_measurement: float = 0.0  # … of which measurements after training (the gradient noise scale)

    @property
    def placed(self) -> str:
        """'cuda:0 (CUDA_VISIBLE_DEVICES=3)', 'cpu (CUDA_VISIBLE_DEVICES=1)', 'cpu', or '' if not recorded."""
        if not self.device:
            return ""
        return self.device + (
            "" if self.cuda_visible_devices is None else f" (CUDA_VISIBLE_DEVICES={self.cuda_visible_devices})"
        )

    @property
    def ok(self) -> bool:
        """Completed with a finite loss: usable for optima."""
        return not (self.diverged or self.failed or self.pruned)


def load_results(sweep: Sweep, failed: bool = True) -> list[TrialResult]:
    """Every finished trial of every (parametrization, width, depth) study: completed, diverged,
    pruned (loss NaN, `pruned` set) and (with `failed`) failed ones — a failed trial that was
    retried counts once, as its retry."""
    out = []
    for parametrization, width, depth, extra in sweep.config.all_cells:
        for t in sweep.study(parametrization, width, depth, extra).get_trials(deepcopy=False):
            kind = trial_outcome(t)  # the runner's rule: one home for what counts as a result
            if kind is None or (kind == "failed" and not failed):
                continue
            params = {
                name: t.params.get(name, t.system_attrs.get("fixed_params", {}).get(name))
                for name in sweep.config.space
            }
            losses = tuple(math.nan if v is None else float(v) for v in t.user_attrs.get("losses", ()))
            step, last = t.user_attrs.get("pruned_step"), t.user_attrs.get("pruned_loss")
            out.append(
                TrialResult(
                    parametrization,
                    width,
                    t.number,
                    params,
                    float(t.value) if kind == "complete" and t.value is not None else math.nan,
                    kind == "diverged",
                    float(t.user_attrs.get("seconds", 0.0)),
                    depth,
                    losses,
                    kind == "failed",
                    str(t.user_attrs.get("error", "")),
                    float(t.user_attrs.get("cpu_seconds", 0.0)),
                    extra,
                    kind == "pruned",
                    None if step is None else int(step),
                    math.nan if last is None else float(last),
                    str(t.user_attrs.get("device", "")),
                    t.user_attrs.get("cuda_visible_devices"),
                    str(t.user_attrs.get("precision", "")),
                    _flops(t.user_attrs.get("flops")),
                    _flops(t.user_attrs.get("flops_measurement", 0.0)),
                )
            )
    return out


def _flops(value: Any) -> float:
    """A trial's `flops` attribute as a float (NaN when not recorded or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def placements(results: list[TrialResult]) -> dict[str, dict[str, float]]:
    """Where the trials trained: per `TrialResult.placed` and precision, the trial count and seconds."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if not r.device:
            continue
        entry = out.setdefault(f"{r.placed}, {r.precision}", {"trials": 0, "seconds": 0.0})
        entry["trials"] += 1
        entry["seconds"] += r.seconds
    return dict(sorted(out.items()))


def counts(results: list[TrialResult], parametrization: str | None = None) -> dict[str, int]:
    """{"completed", "diverged", "failed", "pruned"} trial counts (of one parametrization, or all)."""
    rs = [r for r in results if parametrization is None or r.parametrization == parametrization]
    return {
        "completed": sum(r.ok for r in rs),
        "diverged": sum(r.diverged for r in rs),
        "failed": sum(r.failed for r in rs),
        "pruned": sum(r.pruned for r in rs),
    }


def in_cell(
    results: list[TrialResult], parametrization: str, width: int, depth: int | None = None, extra: tuple = ()
) -> list[TrialResult]:
    """The trials of one (parametrization, width, depth[, extra]) cell, whatever their outcome."""
    return [
        r
        for r in results
        if r.parametrization == parametrization and r.width == width and r.depth == depth and r.extra == tuple(extra)
    ]


def best(
    results: list[TrialResult], parametrization: str, width: int, depth: int | None = None, extra: tuple = ()
) -> TrialResult | None:
    """The lowest-loss trial of one cell; `depth` None matches a sweep without depths."""
    return min(
        (r for r in in_cell(results, parametrization, width, depth, extra) if r.ok), key=lambda r: r.loss, default=None
    )


def along_cells(sweep: Sweep, along: str, at: int | None = None) -> list[tuple[int, int | None]]:
    """The (width, depth) cells visited when moving along `along` with the other axis held `at`."""
    cfg = sweep.config
    if along == "width":
        depth = at if at is not None else cfg.proxy_depth
        return [(w, depth) for w in cfg.widths]
    if along == "depth":
        if cfg.depths is None:
            return []
        width = at if at is not None else cfg.proxy_width
        return [(width, d) for d in cfg.depths]
    raise ValueError(f"along must be one of {', '.join(AXES)}, got {along!r}")


def optima(
    sweep: Sweep, results: list[TrialResult], parametrization: str, along: str = "width", at: int | None = None
) -> list[TrialResult]:
    """The best trial of each cell along `along` (cells with no finished trial left out)."""
    return [b for w, d in along_cells(sweep, along, at) if (b := best(results, parametrization, w, d)) is not None]


def drift(
    sweep: Sweep,
    results: list[TrialResult],
    parametrization: str,
    name: str,
    along: str = "width",
    at: int | None = None,
) -> float | None:
    """How far the optimum of HP `name` moves from the smallest to the largest width (or depth,
    `along="depth"`): in octaves (log2 ratio) for a log-scaled HP, in units of the value
    otherwise; None for a choice."""
    dim = sweep.config.space_for(parametrization)[name]
    if isinstance(dim, Choice):
        return None
    opts = optima(sweep, results, parametrization, along, at)
    if len(opts) < 2:
        return None
    a, b = opts[0].params[name], opts[-1].params[name]
    return math.log2(b / a) if isinstance(dim, LogUniform) else b - a


def max_drift_steps(
    sweep: Sweep,
    results: list[TrialResult],
    parametrization: str,
    name: str,
    along: str = "width",
    at: int | None = None,
) -> float | None:
    """Largest move of the optimum between any two widths (or depths), in grid steps (log HPs on a grid)."""
    dim = sweep.config.space_for(parametrization)[name]
    if not isinstance(dim, LogUniform) or dim.grid < 2:
        return None
    step = math.log2(dim.high / dim.low) / (dim.grid - 1)
    opts = [math.log2(b.params[name]) for b in optima(sweep, results, parametrization, along, at)]
    return (max(opts) - min(opts)) / step if len(opts) >= 2 else None


def bigger_is_better(
    sweep: Sweep, results: list[TrialResult], parametrization: str, along: str = "width", at: int | None = None
) -> bool | None:
    """Does the best loss decrease as width (or depth) grows: lower at the largest than at the
    smallest, and never up by more than 1% from one to the next? (Exact ties are not "better".)"""
    losses = [b.loss for b in optima(sweep, results, parametrization, along, at)]
    if len(losses) < 2:
        return None
    return losses[-1] < losses[0] and all(b <= a + 0.01 * abs(a) for a, b in itertools.pairwise(losses))


def wider_is_better(
    sweep: Sweep, results: list[TrialResult], parametrization: str, depth: int | None = None
) -> bool | None:
    """Does the best loss decrease (not increase by more than 1%) as width grows (at `depth`)?"""
    return bigger_is_better(sweep, results, parametrization, "width", depth)


def deeper_is_better(
    sweep: Sweep, results: list[TrialResult], parametrization: str, width: int | None = None
) -> bool | None:
    """Does the best loss decrease (not increase by more than 1%) as depth grows (at `width`)?"""
    return bigger_is_better(sweep, results, parametrization, "depth", width)


def transferred_hparams(
    sweep: Sweep,
    results: list[TrialResult],
    width: int | None = None,
    parametrization: str | None = None,
    depth: int | None = None,
) -> dict[str, Any] | None:
    """The optimum found at the proxy `width` and `depth` (default: the smallest), with the [fixed] table;
    `parametrization` "mup", "u-mup" or "sp" (default: the transferred one, `SweepConfig.transferred`: µP when
    swept, else u-µP). None when it has no finished trial there (or, by default, when the sweep ran neither)."""
    width = width or sweep.config.proxy_width
    depth = depth or sweep.config.proxy_depth
    parametrization = parametrization or sweep.config.transferred
    if parametrization is None:
        return None
    b = best(results, parametrization, width, depth)
    return None if b is None else {**sweep.config.fixed, **b.params}


# ----------------------------------------------------------------------------- verdicts


def axes(sweep: Sweep) -> list[str]:
    """The axes a verdict is drawn along: width, depth, batch size and horizon (`batch_size`,
    `steps`), each when it has several values (none for a sweep that only tunes at one scale)."""
    cfg = sweep.config
    out = ["width"] if len(cfg.widths) > 1 else []
    out += ["depth"] if cfg.depths is not None and len(cfg.depths) > 1 else []
    return out + [axis for axis, values in cfg.axes.items() if len(values) > 1]


def cells_along(
    sweep: Sweep, results: list[TrialResult], parametrization: str, axis: str
) -> list[tuple[int, Sequence[TrialResult]]]:
    """[(axis value, that cell's trials)] along `axis`, proxy first: widths at the proxy depth,
    depths at the proxy width, batch sizes or horizons at the proxy width and depth."""
    cfg = sweep.config
    if axis in ("width", "depth"):
        return [
            (w if axis == "width" else _known(d), in_cell(results, parametrization, w, d))
            for w, d in along_cells(sweep, axis)
        ]
    if axis not in cfg.axes:
        raise ValueError(f"axis must be one of {', '.join(axes(sweep))}, got {axis!r}")
    values = cfg.axes[axis]
    return [
        (v, in_cell(results, parametrization, cfg.proxy_width, cfg.proxy_depth, () if v == values[0] else ((axis, v),)))
        for v in values
    ]


def _known(depth: int | None) -> int:
    """A depth along the depth axis (which exists only in a sweep over depths)."""
    if depth is None:
        raise ValueError("a verdict along depth needs a sweep over depths")
    return depth


def verdicts(sweep: Sweep, results: list[TrialResult]) -> dict[str, dict[str, Verdict]]:
    """{parametrization: {axis: Verdict}}: optima with intervals, moves, regret, transferred
    (see `verdict`); along width at the proxy depth, along depth at the proxy width."""
    cfg = sweep.config
    out: dict[str, dict] = {}
    for p in cfg.parametrizations:
        out[p] = {}
        for axis in axes(sweep):
            v = judge(
                p,
                axis,
                cells_along(sweep, results, p, axis),
                cfg.space_for(p),
                len(cfg.seeds),
                grid=cfg.sampler == "grid",
            )
            if v is not None:
                out[p][axis] = v
    return out


def proxy_verdict(sweep: Sweep, results: list[TrialResult], parametrization: str) -> Verdict | None:
    """The optima at the proxy cell alone: what a sweep at one scale finds (nothing to transfer yet).

    Args:
        sweep: the sweep.
        results: its trials (`load_results`).
        parametrization: "mup", "u-mup" or "sp".

    Returns:
        A `Verdict` with one cell per HP (its fitted optimum and interval), or None without a
        usable trial at the proxy.
    """
    cfg = sweep.config
    cells = [(cfg.proxy_width, in_cell(results, parametrization, cfg.proxy_width, cfg.proxy_depth))]
    return judge(
        parametrization, "width", cells, cfg.space_for(parametrization), len(cfg.seeds), grid=cfg.sampler == "grid"
    )


def same_point(
    results: list[TrialResult], parametrization: str, width: int, depth: int | None, params: dict
) -> TrialResult | None:
    """The finished trial of a cell at exactly `params` (a grid point evaluated in several cells)."""
    return next(
        (r for r in in_cell(results, parametrization, width, depth) if r.params == params and not r.failed), None
    )


def head_to_head(sweep: Sweep, results: list[TrialResult]) -> dict[str, Any] | None:
    """TP5 Fig. 1's promise at the largest swept width: µP with the proxy's HPs against SP re-tuned
    there (its own best); u-µP's in a sweep of u-µP and SP without µP (the transferred parametrization,
    `SweepConfig.transferred`: then "parametrization": "u-mup"; the "mup_*" keys hold its numbers). None unless
    both were swept on a grid point shared by the proxy and the largest width."""
    cfg = sweep.config
    p = cfg.transferred
    if p is None or "sp" not in cfg.parametrizations or len(cfg.widths) < 2:
        return None
    proxy, width, depth = cfg.proxy_width, max(cfg.widths), cfg.proxy_depth
    tuned = best(results, p, proxy, depth)
    sp = best(results, "sp", width, depth)
    if tuned is None or sp is None:
        return None
    at = same_point(results, p, width, depth, tuned.params)
    if at is None:
        return None
    mup_best = best(results, p, width, depth)
    worse = at.diverged or at.pruned  # pruned: stopped early as worse than that study's finished trials
    loss = math.inf if worse else at.loss
    out: dict[str, Any] = {
        "width": width,
        "proxy_width": proxy,
        "mup_transferred": None if worse else at.loss,
        "mup_pruned": at.pruned,
        "mup_best": None if mup_best is None else mup_best.loss,
        "sp_retuned": sp.loss,
        "relative": (loss - sp.loss) / abs(sp.loss) if sp.loss else None,
        "relative_interval": None,
    }
    n = len(cfg.seeds)
    rivals = [r.losses for r in in_cell(results, "sp", width, depth) if r.ok and len(r.losses) == n]
    if n > 1 and not worse and sp.loss and len(at.losses) == n and rivals:
        # The same bootstrap over seeds as the verdicts: µP's point and SP's re-selected best.
        idx = resample_index(n)
        mup = np.asarray(at.losses)[idx].mean(axis=1)
        sp_best = np.asarray(rivals)[:, idx].mean(axis=2).min(axis=0)
        out["relative_interval"] = interval((mup - sp_best) / np.abs(sp_best))
    if p != "mup":  # absent: µP (summary.json's head_to_head as it always was)
        out["parametrization"] = p
    return out


def costs(sweep: Sweep, results: list[TrialResult], transfer: dict | None = None) -> dict[str, Any]:
    """What the sweep cost: compute time and FLOPs of the whole sweep, of the transferred parametrization's proxy
    cell alone (what tuning costs: `SweepConfig.transferred`, µP's, else u-µP's; an SP-only sweep's SP cell), and
    against one target run of it from `transfer.json`.

    Args:
        sweep: the sweep.
        results: its trials (`load_results`).
        transfer: `transfer.json`'s content (None: no target run).

    Returns:
        "sweep_cpu_seconds" and "proxy_cpu_seconds" (CPU seconds; wall seconds where CPU time was not
        recorded); "sweep_flops" and "proxy_flops", the FLOPs of the trials that recorded a count (None
        when none did: a sweep from before FLOPs were counted); with a target run,
        "target_cpu_seconds", "proxy_over_target", "sweep_over_target", and, when the target run
        recorded its FLOPs (``transfer["mup"]["flops"]``, u-µP's without µP: one seed's), "target_flops",
        "proxy_flops_over_target" and "sweep_flops_over_target".
    """

    def spent(rs) -> float:
        return sum(r.cpu_seconds or r.seconds for r in rs)

    def flops(rs) -> float | None:
        counted = [r.flops for r in rs if math.isfinite(r.flops)]
        return float(sum(counted)) if counted else None

    cfg = sweep.config
    p = cfg.transferred
    proxy = list(in_cell(results, p or cfg.parametrizations[0], cfg.proxy_width, cfg.proxy_depth))
    out: dict[str, Any] = {
        "sweep_cpu_seconds": spent(results),
        "proxy_cpu_seconds": spent(proxy),
        "sweep_flops": flops(results),
        "proxy_flops": flops(proxy),
    }
    if transfer and p is not None and p in transfer:
        target = transfer[p].get("cpu_seconds") or transfer[p].get("seconds")
        if target:
            out.update(
                target_cpu_seconds=target,
                proxy_over_target=out["proxy_cpu_seconds"] / target,
                sweep_over_target=out["sweep_cpu_seconds"] / target,
            )
        target_flops = _flops(transfer[p].get("flops"))
        if math.isfinite(target_flops) and target_flops > 0:
            out["target_flops"] = target_flops
            out["proxy_flops_over_target"] = None if out["proxy_flops"] is None else out["proxy_flops"] / target_flops
            out["sweep_flops_over_target"] = None if out["sweep_flops"] is None else out["sweep_flops"] / target_flops
    return out
