"""Measured rules: power laws of the optimal lr and weight decay in batch size and horizon.

A sweep with `batch_sizes` or `horizons` trains the proxy at several batch sizes (at the proxy's
steps) or step counts (at the proxy's batch size). Along each such axis and for each swept
log-scaled hyperparameter among ``lr`` and ``weight_decay``, `fit_measured_laws`:

1. locates the optimum at every axis value with the report's own machinery (`statistics.judge`:
   the sub-grid parabola, its bootstrap over seeds, the edge and flatness checks);
2. leaves the largest axis value out and fits log2 h* = a + b·log2 x to the rest by least squares,
   once on the data and once per bootstrap resample of the seeds (the same resample in every cell),
   which gives b's interval;
3. predicts h* at the held-out value, with an interval: the resampled fits' spread there and the
   held-out optimum's own interval, combined in quadrature; the law is *validated* when the
   held-out optimum lies inside it.

No law (a reason instead) when fewer than three optima enter the fit, when an optimum is not
located (grid edge, a gap, a flat curve), when the optima along the axis move both up and down by
more than their intervals, when the hyperparameter is not log-scaled, or with one seed (no
bootstrap). `mt.transfer_hparams(measured=...)` applies a validated law in place of the default rule.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..._core.measured_law import MEASURED_AXES, MEASURED_HPARAMS, MeasuredLaw
from ..config.space import LogUniform
from ..engine.runner import Sweep
from .analysis import TrialResult, cells_along, load_results
from .statistics import CONFIDENCE, EDGE_NAMES, HPVerdict, Optimum, interval, judge

__all__ = ["MIN_FIT_POINTS", "fit_measured_laws"]

MIN_FIT_POINTS = 3  # optima in the fit, the held-out one apart: two points always fit a line


def fit_measured_laws(
    sweep: Sweep, results: list[TrialResult] | None = None, parametrization: str = "mup"
) -> dict[str, dict[str, MeasuredLaw | str]]:
    """Fit the optimal ``lr`` and ``weight_decay`` as power laws along the sweep's batch sizes and horizons.

    Args:
        sweep: a sweep with `batch_sizes` and/or `horizons` (the extra axes of its config).
        results: its trials (`load_results(sweep)` when None).
        parametrization: whose trials: "mup" (default), "u-mup" or "sp".

    Returns:
        ``{hparam: {axis: law}}`` for every swept hyperparameter among "lr" and "weight_decay" and
        every extra axis ("batch_size", "steps"). A law is a `mt.MeasuredLaw` — check
        `law.validated` (its held-out check) — or, where no law can be fitted, a string: the
        reason and the fix. Pass the whole dict to `mt.transfer_hparams(measured=...)`, which
        applies the validated laws and records the reasons of the rest. Empty without extra axes
        or without lr / weight_decay in the space.

    Raises:
        ValueError: `parametrization` is not one the sweep ran.
    """
    cfg = sweep.config
    if parametrization not in cfg.parametrizations:
        raise ValueError(
            f"parametrization must be one the sweep ran ({', '.join(cfg.parametrizations)}), got {parametrization!r}"
        )
    if results is None:
        results = load_results(sweep)
    space = cfg.space_for(parametrization)
    hparams = [h for h in MEASURED_HPARAMS if h in space]
    out: dict[str, dict[str, MeasuredLaw | str]] = {h: {} for h in hparams}
    for axis in [a for a in cfg.axes if a in MEASURED_AXES]:
        verdict = None
        if len(cfg.axes[axis]) >= MIN_FIT_POINTS + 1:
            cells = cells_along(sweep, results, parametrization, axis)
            verdict = judge(parametrization, axis, cells, space, len(cfg.seeds), grid=cfg.sampler == "grid")
        for h in hparams:
            out[h][axis] = _fit(h, axis, cfg.axes[axis], verdict, len(cfg.seeds), space[h])
    return out


def _fit(hparam, axis, values, verdict, n_seeds, dim) -> MeasuredLaw | str:
    x = MEASURED_AXES[axis]
    head = f"{hparam} along {axis}"
    if not isinstance(dim, LogUniform):
        return (
            f"{head}: {hparam} is not log-scaled ({type(dim).__name__}); a power law is fitted in log2: sweep it "
            f'with type = "log"'
        )
    if len(values) < MIN_FIT_POINTS + 1:
        return (
            f"{head}: {len(values)} measured {axis} values ({_values(values)}); a fit needs {MIN_FIT_POINTS} located "
            f"optima plus the largest {axis}, held out to check it: sweep at least {MIN_FIT_POINTS + 1} values"
        )
    if n_seeds < 2:
        return f"{head}: one seed gives no bootstrap interval for the exponent: sweep with at least 2 seeds"
    if verdict is None or hparam not in verdict.hps:
        return f"{head}: no usable trial at the proxy cell ({x} = {values[0]}): run the sweep"
    h: HPVerdict = verdict.hps[hparam]
    optima = sorted(h.optima, key=lambda o: o.at)
    missing = [v for v in values if v not in {o.at for o in optima}]
    lost = [o for o in optima if not o.located]
    if missing or lost:
        what = [f"{x} = {v} (no usable trial)" for v in missing] + [f"{x} = {o.at} ({_why(o)})" for o in lost]
        return (
            f"{head}: {sum(o.located for o in optima[:-1])} located optima in the fit (it needs {MIN_FIT_POINTS}, "
            f"and the largest {axis} located); not located: {', '.join(what)}; "
            "widen the grid where the optimum sits on its edge, fill gaps, or drop that value"
        )
    fit, held = optima[:-1], optima[-1]
    turn = _turn(fit)
    if turn:
        return (
            f"{head}: the optima are not monotone in {axis}: {hparam} = "
            f"{', '.join(f'{2**o.x:.4g}' for o in fit)} at {x} = {_values([o.at for o in fit])} ({turn}); "
            "no power law fits them: measure more seeds, or keep the default rule"
        )
    lx = np.log2([float(o.at) for o in fit])
    ys = np.stack([h.samples[o.at] for o in fit], axis=1)  # (resamples, points), row 0: the data
    keep = np.isfinite(ys).all(axis=1)
    keep[0] = True
    ys = ys[keep]
    xc = lx - lx.mean()
    slope = (ys - ys.mean(axis=1, keepdims=True)) @ xc / float(xc @ xc)
    offset = ys.mean(axis=1) - slope * lx.mean()
    b_iv = interval(slope)
    x_h = math.log2(held.at)
    pred = offset + slope * x_h
    p_iv, h_iv = interval(pred), held.x_interval
    if b_iv is None or p_iv is None or h_iv is None:
        return f"{head}: the bootstrap over seeds gives no interval (seeds agree exactly?): sweep with more seeds"
    k = _small_sample(n_seeds)
    b_half = k * (b_iv[1] - b_iv[0]) / 2
    half = k * math.hypot((p_iv[1] - p_iv[0]) / 2, (h_iv[1] - h_iv[0]) / 2)
    lo, hi = float(pred[0]) - half, float(pred[0]) + half
    ref = float(values[0])
    return MeasuredLaw(
        hparam=hparam,
        axis=axis,
        exponent=float(slope[0]),
        exponent_interval=(float(slope[0]) - b_half, float(slope[0]) + b_half),
        reference=ref,
        value_at_reference=float(2 ** (offset[0] + slope[0] * math.log2(ref))),
        fit_range=(float(fit[0].at), float(fit[-1].at)),
        held_out=float(held.at),
        held_out_optimum=float(2**held.x),
        prediction_interval=(float(2**lo), float(2**hi)),
        validated=bool(lo <= held.x <= hi),
        n_points=len(fit),
    )


def _small_sample(n: int) -> float:
    """How much wider a bootstrap interval over `n` seeds must be to hold its confidence.

    A bootstrap over n seeds sees the spread of a mean as √((n−1)/n) of its sample estimate and
    with the normal's quantile where Student's t with n−1 degrees of freedom applies. Measured on
    the synthetic law of tests/sweep/test_hparam_fits.py (100 noise draws, 90 % intervals): the
    uncorrected exponent interval held the true exponent 75 times with 4 seeds, 85 with 8.
    """
    z = _normal_quantile(0.5 + CONFIDENCE / 2)
    nu = n - 1
    # Student's t quantile by its Cornish–Fisher expansion in 1/ν (within 0.3 % for ν ≥ 3 at 95 %)
    t = (
        z
        + (z**3 + z) / (4 * nu)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * nu**3)
    )
    return t / z * math.sqrt(n / nu)


def _normal_quantile(p: float) -> float:
    """The standard normal's p-quantile (bisection on erf; p in (0.5, 1))."""
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p else (lo, mid)
    return (lo + hi) / 2


def _turn(fit: list[Optimum]) -> str:
    """Where the optima move up and also down, each step beyond both optima's intervals ("" if not)."""
    ups, downs = [], []
    for a, b in itertools.pairwise(fit):
        ia = a.x_interval or (a.x, a.x)
        ib = b.x_interval or (b.x, b.x)
        if ib[0] > ia[1]:
            ups.append(f"up from {a.at} to {b.at}")
        elif ib[1] < ia[0]:
            downs.append(f"down from {a.at} to {b.at}")
    return ", ".join(ups + downs) if ups and downs else ""


def _why(o: Optimum) -> str:
    if o.flat:
        return "flat: the loss does not depend on it there"
    name = EDGE_NAMES.get(o.edge, "edge")
    return f"on the grid's {name} edge" if abs(o.edge) == 1 else name


def _values(values) -> str:
    return ", ".join(str(v) for v in values)
