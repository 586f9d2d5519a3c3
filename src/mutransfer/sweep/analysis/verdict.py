"""Did the hyperparameters transfer? The verdict sentences of the report, `mutransfer report` and the demo.

Wording only: every number is computed in `statistics` (optima, bootstrap intervals, moves,
regret, the transferred / did not transfer / cannot tell decision); this module states them.
Its statistics names (`judge`, `Verdict`, `parabolic_minimum`, …) are re-exported here, where
they lived before the split.
"""

from __future__ import annotations

import math

from ..config.space import Choice, LogUniform
from .statistics import (
    BOOTSTRAP_SEED,
    CONFIDENCE,
    EDGE_NAMES,
    MAX_REGRET,
    N_BOOTSTRAP,
    TOLERANCE_OCTAVES,
    CellData,
    Estimate,
    HPVerdict,
    Optimum,
    Verdict,
    cell_data,
    coordinate,
    interval,
    judge,
    parabolic_minimum,
    profile,
    resample_index,
    resampled_means,
    tolerance,
    unit,
    value_at,
)

__all__ = [
    "AXIS_NAMES",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "EDGE_NAMES",
    "LABEL",
    "MAX_REGRET",
    "N_BOOTSTRAP",
    "TOLERANCE_OCTAVES",
    "CellData",
    "Estimate",
    "HPVerdict",
    "Optimum",
    "Verdict",
    "axis_name",
    "cell_data",
    "coordinate",
    "interval",
    "judge",
    "optima_sentence",
    "parabolic_minimum",
    "profile",
    "resample_index",
    "resampled_means",
    "short_label",
    "tolerance",
    "unit",
    "value_at",
    "verdict_sentence",
]

AXIS_NAMES = {
    "width": ("width", "widths"),
    "depth": ("depth", "depths"),
    "batch_size": ("batch size", "batch sizes"),
    "steps": ("steps", "training horizons"),
}
LABEL = {"mup": "µP", "u-mup": "u-µP", "sp": "SP (standard)"}


def axis_name(axis: str, plural: bool = False) -> str:
    """An axis's name in a sentence.

    Args:
        axis: "width", "depth", "batch_size" or "steps".
        plural: the plural ("batch sizes").

    Returns:
        "batch size" / "batch sizes" for "batch_size"; the axis itself when unknown.
    """
    return AXIS_NAMES.get(axis, (axis, axis + "s"))[plural]


def short_label(parametrization: str) -> str:
    """'µP' or 'SP': the parametrization's name at the head of a sentence."""
    return LABEL.get(parametrization, parametrization).split(" ")[0]


def _num(v: float, unit_: str = "") -> str:
    return f"{v:+.2f}{unit_}"


def _ci(iv: tuple[float, float] | None, fmt) -> str:
    return "" if iv is None else f" ({round(100 * CONFIDENCE)}% CI {fmt(iv[0])} … {fmt(iv[1])})"


def _pct(v: float) -> str:
    return "∞" if math.isinf(v) else f"{100 * v:.1f}%"


def _where_unknown(h: HPVerdict, o: Optimum, axis: str) -> str | None:
    """Why an optimum's position is unknown (edge, unevaluated neighbour, flat loss), or None."""
    at = f"{axis_name(axis)} {o.at}"
    if o.flat:
        return f"{h.name} has no measurable effect on the loss at {at} (the curve is flat within seed noise)"
    if abs(o.edge) == 1:
        return (
            f"{h.name} optimum at {at} is on the grid's {'high' if o.edge > 0 else 'low'} edge "
            f"({value_at(h.dim, o.grid_x):.3g}): widen the grid"
        )
    if abs(o.edge) == 2:
        return (
            f"{h.name} optimum at {at} ({value_at(h.dim, o.grid_x):.3g}) is next to a grid point not evaluated "
            f"(failed or not run yet): retry or finish the sweep"
        )
    return None


def verdict_sentence(v: Verdict, label: str) -> str:
    """One sentence: did `label`'s optimum transfer along the axis, by how much, at what regret.

    The head is "transferred", "did not transfer" (the optimum moved beyond the tolerance and the
    regret is not small, the regret is significantly above `MAX_REGRET`, or the proxy's HPs
    diverge), or "cannot tell" (an optimum's position unknown, or intervals too wide).

    Args:
        v: the verdict (`statistics.judge`).
        label: who it is about, at the head of the sentence ("µP across widths").

    Returns:
        The sentence, ending with a full stop.
    """
    parts = []
    for h in v.hps.values():
        first, last = h.optima[0], h.optima[-1]
        u = unit(h.dim)
        if isinstance(h.dim, Choice):
            chosen = ", ".join(str(value_at(h.dim, o.x)) for o in h.optima)
            parts.append(f"best {h.name} per {axis_name(v.axis)}: {chosen}")
        elif h.drift is not None and first.located and last.located:
            d = h.drift
            parts.append(
                f"{h.name} optimum moved {_num(d.value, u)}{_ci(d.interval, lambda t: _num(t))} "
                f"from {axis_name(v.axis)} {first.at} to {last.at}"
            )
        parts += [text for o in h.optima if (text := _where_unknown(h, o, v.axis))]
    last_at = max(v.regret) if v.regret else None
    if last_at is not None and last_at != v.proxy:
        a, r = v.regret[last_at]
        if math.isinf(a.value):
            parts.append(
                f"the proxy's HPs diverge{' or were pruned' if v.counts.get('pruned') else ''} "
                f"at {axis_name(v.axis)} {last_at}"
            )
        elif math.isfinite(r.value):
            parts.append(f"regret at {axis_name(v.axis)} {last_at}: {_pct(r.value)}{_ci(r.interval, _pct)}")
        else:
            parts.append(
                f"regret at {axis_name(v.axis)} {last_at}: {a.value:+.4g} in loss units (a relative "
                f"regret needs a positive best loss)"
            )
    if v.counts.get("pruned"):
        parts.append(
            f"{v.counts['diverged']} diverged, {v.counts['failed']} failed, {v.counts['pruned']} pruned trial(s)"
        )
    elif v.counts["failed"] or v.counts["diverged"]:
        parts.append(f"{v.counts['diverged']} diverged, {v.counts['failed']} failed trial(s)")
    reasons = [r for h in v.hps.values() for r in h.reasons]
    if v.transferred:
        head = f"{label} transferred"
    elif any(r.split(" ")[0] in ("moved", "regret", "diverges") for r in reasons):
        head = f"{label} did not transfer"
    else:
        if any(r.startswith("fewer") for r in reasons):
            why = f"results at one {axis_name(v.axis)} only"
        elif any(r.startswith("flat") for r in reasons):
            why = "a hyperparameter without measurable effect"
        elif any(r.startswith("edge") for r in reasons):
            why = "an optimum on the grid's edge"
        elif any(r.startswith("gap") for r in reasons):
            why = "an optimum next to a point not evaluated"
        else:
            why = "intervals too wide to decide: add seeds"
        head = f"{label}: cannot tell ({why})"
    return head + (": " + "; ".join(parts) if parts else "") + "."


def optima_sentence(v: Verdict, label: str) -> str:
    """One sentence for a sweep at one scale (nothing to transfer yet): each HP's fitted optimum,
    its interval, and a grid-edge warning.

    Args:
        v: the verdict at the proxy alone (`analysis.proxy_verdict`).
        label: who it is about ("µP").

    Returns:
        The sentence, ending with a full stop.
    """
    parts = []
    for h in v.hps.values():
        o = h.optima[0]
        if isinstance(h.dim, Choice):
            parts.append(f"best {h.name} {value_at(h.dim, o.x)}")
            continue
        if isinstance(h.dim, LogUniform):
            text = f"{h.name} optimum 2^{o.x:.2f}" + _ci(o.x_interval, lambda t: f"2^{t:.2f}")
        else:
            text = f"{h.name} optimum {o.x:.4g}" + _ci(o.x_interval, lambda t: f"{t:.4g}")
        unknown = _where_unknown(h, o, v.axis)
        parts.append(text if unknown is None else f"{text} — {unknown}")
    return f"{label} at {axis_name(v.axis)} {v.proxy}: " + "; ".join(parts) + "."


_RENAMED = {"describe": "verdict_sentence", "describe_optima": "optima_sentence"}


def __getattr__(name: str) -> object:
    """The 0.1 names (`describe`: the word is `mt.describe`'s) warn and give the new functions."""
    if name in _RENAMED:
        import warnings

        warnings.warn(
            f"mutransfer.sweep.analysis.verdict.{name} is now {_RENAMED[name]}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
