"""Forecast the target's loss from the sweep's width ladder, before the target is trained.

Under µP the hyperparameters tuned at the proxy stay near-optimal at every width, so the loss *at those
hyperparameters* is one smooth curve in width — the ladder a grid sweep already trained (`_ladder`: the
proxy's grid point at every swept width and depth, each seed; each cell's own best for a random/TPE
sweep). `loss_law` fits the law to it (c + a·w^−b, + e·d^−g in a sweep over depths: its form, sources and
Bayesian interval are told there); `flop_law` estimates one target run's FLOPs from the trials' counts.

Checks before any number: the largest proxy is held out and predicted by the law fitted on the others
(its measured loss inside that interval: *validated*); the loss must fall with width (posterior
probability ≥ `FALL_PROBABILITY`) and follow the law (`loss_law.lack_of_fit`), the transferred point must
not have diverged at any swept width; else there is no forecast, and the reason says why. A target more
than `MAX_FACTOR`× past the largest proxy is refused without `extrapolate`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..engine.runner import Sweep
from .analysis import TrialResult, best, in_cell, load_results, same_point
from .flop_law import target_flops
from .loss_law import band, lack_of_fit, law_data, law_draws, law_text, posterior, predict, quantiles, span
from .statistics import CONFIDENCE

__all__ = ["MAX_FACTOR", "Forecast", "forecast"]

MAX_FACTOR = 64.0  # how far past the largest proxy (in width, or depth) a forecast goes without extrapolate
SEED = 0  # the forecast is a deterministic function of the trials
FALL_PROBABILITY = 0.95  # the posterior probability that the loss falls with width, at least


@dataclass(frozen=True)
class Forecast:
    """The target's forecast loss, or why there is none (`reason`). `as_dict` is transfer.json's "forecast".

    Attributes:
        parametrization: whose trials the law is fitted to ("mup", or "u-mup" in a sweep without µP).
        width: the target's width.
        depth: the target's depth (None without a sweep over depths).
        loss: the forecast (the posterior median of the target's mean loss over its seeds); None with a reason.
        interval: its 90 % interval (`CONFIDENCE`).
        law: the law as text, with the exponent's interval.
        law_params: ``{"c", "terms": {axis: {"a", "b", "b_interval"}}}`` at the posterior median exponent.
        fit_widths: the widths the final law was fitted on (fit_depths: the depths).
        fit_depths: the depths (None without a sweep over depths).
        points: one entry per swept cell: width, depth, loss (seed mean), losses, spread (seed sd), trial.
        missing: cells with no usable point and why (``{"width", "depth", "why"}``).
        held_out: the largest proxy predicted by the law fitted without it: ``{"width", "depth",
            "measured", "loss", "interval", "inside", "fit_widths"}``; None when too few points remain.
        regime: "extrapolated 4× past the largest proxy", "interpolated …", or "at a swept width".
        source: which trials: "the transferred point" or each width's best trial.
        reason: why there is no forecast (then `loss` is None).
        notes: what else the user must know (one seed: no noise estimate; missing widths).
        actual: the target's measured loss once trained (``{"loss", "inside"}``), else None.
        seeds: how many seeds the target's mean loss averages (the interval includes that mean's noise).
        band: the law's 90 % band and median along its first axis for the figure (``{"axis", "values", "low",
            "median", "high"}``).
        flops: one target run's FLOPs estimated from the sweep's counts (`target_flops`), with the tuning's and
            the whole sweep's: ``{"target", "fit", "misfit", "proxy_flops", "sweep_flops", …}``; None uncounted.
    """

    parametrization: str
    width: int
    depth: int | None
    loss: float | None
    interval: tuple[float, float] | None
    law: str
    law_params: dict[str, Any] | None
    fit_widths: list[int]
    fit_depths: list[int] | None
    points: list[dict[str, Any]]
    missing: list[dict[str, Any]]
    held_out: dict[str, Any] | None
    regime: str
    source: str
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    actual: dict[str, Any] | None = None
    seeds: int = 1
    band: dict[str, Any] | None = None
    flops: dict[str, Any] | None = None

    @classmethod
    def refused(cls, parametrization: str, width: int, depth: int | None, reason: str) -> Forecast:
        """No forecast, for `reason` (e.g. the target trains at a batch size the sweep's ladder did not)."""
        return cls(parametrization, width, depth, None, None, "", None, [], None, [], [], None, "", "", reason)

    @property
    def ok(self) -> bool:
        """A forecast was made (no `reason`)."""
        return self.reason is None

    @property
    def validated(self) -> bool | None:
        """The held-out largest proxy fell inside its interval (None when there was no held-out check)."""
        return None if self.held_out is None else bool(self.held_out["inside"])

    def with_actual(self, loss: float | None) -> Forecast:
        """This forecast with the target's measured mean loss beside it (None: the target diverged)."""
        inside = None if loss is None or self.interval is None else self.interval[0] <= loss <= self.interval[1]
        return replace(self, actual={"loss": loss, "inside": inside})

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (transfer.json's "forecast")."""
        return {
            "parametrization": self.parametrization,
            "width": self.width,
            "depth": self.depth,
            "loss": self.loss,
            "interval": None if self.interval is None else list(self.interval),
            "confidence": CONFIDENCE,
            "law": self.law,
            "law_params": self.law_params,
            "fit_widths": self.fit_widths,
            "fit_depths": self.fit_depths,
            "points": self.points,
            "missing": self.missing,
            "held_out": self.held_out,
            "regime": self.regime,
            "source": self.source,
            "reason": self.reason,
            "notes": self.notes,
            "actual": self.actual,
            "seeds": self.seeds,
            "band": self.band,
            "flops": self.flops,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Forecast:
        """The inverse of `as_dict` (transfer.json read back)."""
        iv = d.get("interval")
        return cls(
            d["parametrization"],
            d["width"],
            d.get("depth"),
            d.get("loss"),
            None if iv is None else (float(iv[0]), float(iv[1])),
            d.get("law", ""),
            d.get("law_params"),
            list(d.get("fit_widths") or []),
            d.get("fit_depths"),
            list(d.get("points") or []),
            list(d.get("missing") or []),
            d.get("held_out"),
            d.get("regime", ""),
            d.get("source", ""),
            d.get("reason"),
            list(d.get("notes") or []),
            d.get("actual"),
            int(d.get("seeds", 1)),
            d.get("band"),
            d.get("flops"),
        )

    def line(self) -> str:
        """One line: "forecast: loss 2.41 [2.38, 2.45] at width 512 (law …, fit on 32…128, held-out 256 inside
        its interval)", or "no forecast: <reason>"; with the actual loss once the target was trained."""
        where = _where(self.width, self.depth)
        if self.reason is not None:
            return f"no forecast at {where}: {self.reason}"
        assert self.loss is not None and self.interval is not None  # a forecast without a reason has both
        lo, hi = self.interval
        fit = span(self.fit_widths) + ("" if self.fit_depths is None else f" × depths {span(self.fit_depths)}")
        h = self.held_out
        if h is None:
            check = "no held-out check: too few widths"
        else:
            check = (
                f"held-out {_where(h['width'], h['depth'])} {'inside' if h['inside'] else 'OUTSIDE'} its interval "
                f"({h['measured']:.4g} vs {h['loss']:.4g} [{h['interval'][0]:.4g}, {h['interval'][1]:.4g}])"
            )
        text = f"forecast: loss {self.loss:.4g} [{lo:.4g}, {hi:.4g}] at {where} ({self.law}, fit on {fit}, {check}"
        text += f"; {self.regime})" if self.regime else ")"
        if self.actual is not None:
            a = self.actual["loss"]
            text += (
                "; actual: diverged"
                if a is None
                else f"; actual {a:.4g}, {'inside' if self.actual['inside'] else 'OUTSIDE'} the interval"
            )
        return text


def _where(width: int, depth: int | None) -> str:
    return f"width {width}" + ("" if depth is None else f", depth {depth}")


# ----------------------------------------------------------------------------- the ladder


def _ladder(
    sweep: Sweep, results: list[TrialResult], parametrization: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The loss at the transferred point in every (width, depth) cell: (points, missing, source)."""
    cfg = sweep.config
    depths: list[int | None] = list(cfg.depths) if cfg.depths is not None else [None]
    tuned = best(results, parametrization, cfg.proxy_width, cfg.proxy_depth)
    grid = cfg.sampler == "grid"
    source = (
        "the transferred point (the proxy's optimum) at every width"
        if grid
        else "each width's own best trial (the sampler is not a grid: the proxy's point was trained at the proxy only)"
    )
    points, missing = [], []
    for w in cfg.widths:
        for d in depths:
            if tuned is None:
                r = None
            elif grid:
                r = same_point(results, parametrization, w, d, tuned.params) or next(
                    (t for t in in_cell(results, parametrization, w, d) if t.params == tuned.params), None
                )  # a failed trial there, to say so
            else:
                r = best(results, parametrization, w, d)
            why = _why_missing(r, results, parametrization, w, d)
            if why is not None:
                missing.append({"width": w, "depth": d, "why": why})
                continue
            assert r is not None
            losses = [x for x in r.losses if math.isfinite(x)] if r.losses else [r.loss]
            if len(losses) != len(r.losses or [r.loss]):
                missing.append({"width": w, "depth": d, "why": "a seed diverged"})
                continue
            points.append(
                {
                    "width": w,
                    "depth": d,
                    "loss": float(np.mean(losses)),
                    "losses": [float(x) for x in losses],
                    "spread": float(np.std(losses, ddof=1)) if len(losses) > 1 else None,
                    "trial": r.number,
                }
            )
    return points, missing, source


def _why_missing(
    r: TrialResult | None, results: list[TrialResult], parametrization: str, width: int, depth: int | None
) -> str | None:
    if r is None:
        done = [t for t in in_cell(results, parametrization, width, depth) if not t.failed]
        return "no finished trial at the transferred point" + ("" if done else " (the cell has none)")
    if r.diverged:
        return "diverged"
    if r.failed:
        return f"failed ({r.error.splitlines()[0][:120] if r.error else 'the objective raised'})"
    if r.pruned:
        return "pruned (worse early on than that width's other trials)"
    return None


# ----------------------------------------------------------------------------- the forecast


def forecast(
    run: Sweep | str | os.PathLike,
    width: int | None = None,
    depth: int | None = None,
    parametrization: str | None = None,
    extrapolate: bool = False,
    results: list[TrialResult] | None = None,
    seeds: int | None = None,
) -> Forecast:
    """The target's loss at the transferred hyperparameters, forecast from the sweep's width (and depth) ladder.

    Args:
        run: a `Sweep` or its run directory.
        width: the target's width (default: the config's `target_width`, else the largest swept width).
        depth: the target's depth in a sweep over depths (default: the config's `target_depth`, else the
            largest swept depth).
        parametrization: whose transferred point: "mup", "u-mup" or "sp" (SP's usually has no law: its
            optimum moves with width); default the transferred one (`SweepConfig.transferred`: "mup" when
            swept, else "u-mup").
        extrapolate: forecast more than `MAX_FACTOR`× past the largest proxy anyway.
        results: the sweep's trials when already loaded.
        seeds: how many seeds the target's mean loss averages. Default: the sweep's own seeds, as
            `mutransfer transfer` trains it (a seed's offset, shared by every width, is then known); another
            number means other seeds, and the interval also holds their own offsets (one run: ``seeds=1``).

    Returns:
        A `Forecast`: the loss and its 90 % interval, the law, the held-out check; or, with `reason` set and
        no number, why there is none (one width, a loss that does not fall with width or does not follow the
        law, a transferred point that diverged at a swept width).

    Raises:
        ValueError: a bad target (not a positive integer; a depth without a sweep over depths), a
            parametrization the sweep did not run, or a target more than `MAX_FACTOR`× past the largest
            proxy without `extrapolate`.
    """
    sweep = run if isinstance(run, Sweep) else Sweep(run)
    cfg = sweep.config
    if parametrization is None:
        if cfg.transferred is None:
            raise ValueError(
                f"{sweep.run_dir} swept neither µP nor u-µP (it ran {', '.join(cfg.parametrizations)}): no "
                "transferred point to forecast; pass parametrization='sp' for SP's"
            )
        parametrization = cfg.transferred
    if parametrization not in cfg.parametrizations:
        raise ValueError(
            f"parametrization {parametrization!r} was not swept in {sweep.run_dir} (it ran "
            f"{', '.join(cfg.parametrizations)})"
        )
    width = _target("width", width, cfg.target_width or max(cfg.widths))
    if cfg.depths is None:
        if depth is not None:
            raise ValueError(f"depth needs a sweep over depths; {sweep.run_dir}'s config has no depths")
    else:
        depth = _target("depth", depth, cfg.target_depth or max(cfg.depths))
    n_target = int(seeds) if seeds is not None else len(cfg.seeds)
    if n_target < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    results = load_results(sweep) if results is None else results
    points, missing, source = _ladder(sweep, results, parametrization)
    notes = [
        f"missing: {_where(m['width'], m['depth'])} ({m['why']})"
        for m in missing
        if not m["why"].startswith("diverged")
    ]
    base = Forecast(parametrization, width, depth, None, None, "", None, [], None, points, missing, None, "", source)
    base = replace(base, notes=notes, seeds=n_target)

    fc = _fit(base, points, missing, width, depth, n_target, extrapolate)
    return replace(fc, flops=target_flops(sweep, results, width, depth))


def _fit(
    base: Forecast,
    points: list[dict[str, Any]],
    missing: list[dict[str, Any]],
    width: int,
    depth: int | None,
    n_target: int,
    extrapolate: bool,
) -> Forecast:
    """The law fitted to `points` (the ladder), checked, held out, and evaluated at the target."""
    notes = list(base.notes)
    diverged = [m for m in missing if m["why"] == "diverged" or m["why"] == "a seed diverged"]
    if diverged:
        where = ", ".join(_where(m["width"], m["depth"]) for m in diverged)
        return replace(
            base,
            reason=f"the transferred hyperparameters diverged at {where}: the loss there follows no law in width",
        )
    widths = sorted({p["width"] for p in points})
    if not points:
        return replace(base, reason=f"no usable point at the transferred hyperparameters ({_missing_text(missing)})")
    targets = {"width": width, "depth": depth}
    axes: tuple[str, ...] = ()
    for axis in ("width", "depth"):
        target = targets[axis]
        if target is None:
            continue
        values = sorted({p[axis] for p in points})
        if len(values) >= 2:
            axes += (axis,)
            _check_factor(axis, target, max(values), extrapolate)
        elif targets[axis] != values[0]:
            swept = {p[axis] for p in points} | {m[axis] for m in missing}
            why = f"one {axis} ({values[0]})" if len(swept) < 2 else f"usable points at one {axis} only ({values[0]})"
            return replace(
                base,
                reason=f"{why}: a law in {axis} needs losses at two {axis}s or more to reach {axis} {targets[axis]}",
            )
    if not axes:
        return replace(base, reason="nothing to forecast: the target is the one swept cell, measured")

    rng = np.random.default_rng(SEED)
    data = law_data(points, axes)
    if len(points) < data.params:
        return replace(base, reason=f"{len(points)} points for a law of {data.params} numbers: sweep more widths")
    post = posterior(data)
    draws = law_draws(post, rng)
    falls = float(np.mean(draws["falls"]))
    if falls < FALL_PROBABILITY:
        return replace(
            base,
            reason=f"the loss at the transferred hyperparameters does not fall with width ({_losses_text(points)}; "
            f"probability it falls {falls:.0%}): no law to extrapolate",
        )
    lack = lack_of_fit(post, rng)
    if lack is not None:
        return replace(base, reason=f"the losses do not follow c + a·w^−b ({_losses_text(points)}): {lack}")
    law, params = law_text(post)
    at = np.array([[targets[a] for a in axes]], dtype=float)
    pred = predict(post, draws, at, n_target, rng)[:, 0]
    fitted_seeds = int(data.n[0])
    if data.seed_spread is not None and n_target != fitted_seeds:  # other seeds: their own offsets too
        pred = pred + data.seed_spread * math.sqrt(1 / n_target + 1 / fitted_seeds) * rng.standard_normal(len(pred))
        notes.append(
            f"the interval is for {n_target} seed{'s' if n_target > 1 else ''} other than the sweep's {fitted_seeds}: "
            f"it holds their own offsets (the seeds' spread, {data.seed_spread:.2g})"
        )
    lo, mid, hi = quantiles(pred)
    held = _held_out(points, axes, rng)
    if post.dof <= 0:
        notes.append("one seed and no misfit to measure: the interval holds the exponent's doubt only, not seed noise")
    if held is None:
        notes.append(f"no held-out check: it needs {data.params + 1} points or more with the largest left out")
    along = band(post, draws, points, axes, targets, n_target, rng)
    return replace(
        base,
        loss=mid,
        interval=(lo, hi),
        law=law,
        law_params=params,
        fit_widths=widths,
        fit_depths=None if depth is None else sorted({p["depth"] for p in points}),
        held_out=held,
        regime=_regime(targets, axes, points),
        notes=notes,
        band=along,
    )


def _target(axis: str, value: Any, default: int) -> int:
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{axis} must be a positive integer, got {value!r}")
    return int(value)


def _check_factor(axis: str, target: int, largest: int, extrapolate: bool) -> None:
    factor = target / largest
    if factor > MAX_FACTOR and not extrapolate:
        raise ValueError(
            f"the target {axis} {target} is {factor:.3g}× the largest proxy's ({largest}), past the {MAX_FACTOR:g}× a "
            f"forecast goes by default: sweep a larger proxy, or pass extrapolate=True to forecast anyway"
        )


def _missing_text(missing: list[dict[str, Any]]) -> str:
    return "; ".join(f"{_where(m['width'], m['depth'])}: {m['why']}" for m in missing) or "none missing"


def _losses_text(points: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{_where(p['width'], p['depth']).replace('width ', '')}: {p['loss']:.4g}"
        + (f" ± {p['spread']:.2g}" if p.get("spread") is not None else "")
        for p in points
    )


def _held_out(points: list[dict[str, Any]], axes: tuple[str, ...], rng: np.random.Generator) -> dict[str, Any] | None:
    """The largest proxy predicted by the law fitted on the other points (None when too few remain)."""
    top = max(points, key=lambda p: (p["width"], p["depth"] or 0))
    rest = [p for p in points if p is not top]
    if any(len({p[a] for p in rest}) < 2 for a in axes) or len(rest) < 1 + len(axes):
        return None
    data = law_data(rest, axes)
    post = posterior(data)
    draws = law_draws(post, rng)
    at = np.array([[top[a] for a in axes]], dtype=float)
    lo, mid, hi = quantiles(predict(post, draws, at, len(top["losses"]), rng)[:, 0])
    return {
        "width": top["width"],
        "depth": top["depth"],
        "measured": top["loss"],
        "loss": mid,
        "interval": [lo, hi],
        "inside": bool(lo <= top["loss"] <= hi),
        "fit_widths": sorted({p["width"] for p in rest}),
    }


def _regime(targets: dict[str, Any], axes: tuple[str, ...], points: list[dict[str, Any]]) -> str:
    """Where the target lies against the swept cells: at one, within them, or how far past the largest."""
    if any(p["width"] == targets["width"] and p["depth"] == targets["depth"] for p in points):
        return "at a swept cell: the sweep measured it"
    past = []
    for axis in axes:
        largest = max(p[axis] for p in points)
        if targets[axis] > largest:
            past.append(f"{targets[axis] / largest:.3g}× past the largest proxy ({axis} {largest})")
    if past:
        return "extrapolated " + " and ".join(past)
    return "interpolated: within the swept " + " and ".join(f"{a}s" for a in axes)
