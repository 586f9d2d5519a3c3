"""Forecast the target's loss from the sweep's width ladder, before the target is trained.

Under µP the hyperparameters tuned at the proxy stay near-optimal at every width, so the loss *at those
hyperparameters* is one smooth curve in width — the ladder a grid sweep already trained. The law fitted
to it (µScaling, Yao & Wang 2023, fits the same form on a µP width ladder; Cerebras-GPT's µP scaling laws)::

    L(w) = c + a·w^(−b),  a ≥ 0,  b in [0, 1]   (b → 0: the logarithmic limit c' − k·ln w)

and, in a sweep over depths, one more term e·d^(−g) for depth (its sign free: deeper is not always better
at a fixed horizon). Why this form, and the exponent's range: the expected loss approaches its
infinite-width limit as a power of the width, at most like 1/width — the rate once the width is large
against the data (Bahri et al. 2021, "Explaining neural scaling laws": the variance-limited regime, b = 1;
in Tensor Programs terms a network's outputs deviate from their limit by O(n^-½) with mean zero, so the
expected loss by O(1/n)) — and more slowly while the width still limits what the model resolves (Kaplan
et al. 2020 measure 0.076 per parameter, b ≈ 0.15 per width for N ∝ w²; Hoffmann et al. 2022, b ≈ 0.7).

Three widths and two seeds cannot pin three numbers by least squares alone (two widths cannot pin them
at all), and a bootstrap over two seeds has three distinct resamples. So the fit is Bayesian, and every
source of doubt stays in the interval:

- the seed noise: the loss of each seed is the law plus the seed's own offset (shared by every width: a
  seed fixes the data order and the init; the target's mean over the same seeds has the same offsets, so
  they sit in the law's constant) plus Gaussian noise of one variance σ² (estimated from what is left of
  the losses once each width's and each seed's mean are taken out, and from the law's misfit; a Jeffreys
  prior), so a width's mean of n seeds has variance σ²/n;
- the exponent: a uniform prior on [0, 1] (the grid `EXPONENTS`); its posterior weight is the marginal
  likelihood, the coefficients and σ integrated out (the law is linear in them once b is fixed, written
  through its values at the smallest and largest fitted widths so that a flat prior on them is the same
  for every b);
- the forecast: Monte Carlo draws of (b, σ², coefficients) from the posterior and of the target's own
  mean of its seeds — the 5 % and 95 % quantiles are the 90 % interval, their median the forecast.

Checks before any number: the largest proxy is held out and predicted by the law fitted on the others
(its measured loss inside that interval: *validated*); the loss must fall with width (posterior
probability ≥ 95 %) and follow the law (a lack-of-fit F test against the seed noise at 0.1 %), the
transferred point must not have diverged at any swept width; else there is no forecast, and the reason
says why. A target more than `MAX_FACTOR`× past the largest proxy is refused without `extrapolate`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .analysis import TrialResult, best, costs, in_cell, load_results, same_point
from .runner import Sweep
from .statistics import CONFIDENCE

__all__ = ["EXPONENTS", "MAX_FACTOR", "Forecast", "forecast", "law_draws", "target_flops"]

EXPONENTS = np.linspace(0.0, 1.0, 41)  # the exponent's grid (uniform prior); 0 is the logarithmic limit
MAX_FACTOR = 64.0  # how far past the largest proxy (in width, or depth) a forecast goes without extrapolate
DRAWS = 4000  # Monte Carlo draws of the posterior predictive
SEED = 0  # the forecast is a deterministic function of the trials
FALL_PROBABILITY = 0.95  # the posterior probability that the loss falls with width, at least
LACK_OF_FIT = 0.001  # the F test's level: the law is refused when its misfit is this unlikely under the seed noise


@dataclass(frozen=True)
class Forecast:
    """The target's forecast loss, or why there is none (`reason`). `as_dict` is transfer.json's "forecast".

    Attributes:
        parametrization: whose trials the law is fitted to ("mup").
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
        fit = _span(self.fit_widths) + ("" if self.fit_depths is None else f" × depths {_span(self.fit_depths)}")
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


def _span(values: list[int]) -> str:
    return "…".join(str(v) for v in (values if len(values) <= 2 else [values[0], values[-1]]))


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


# ----------------------------------------------------------------------------- the law


@dataclass(frozen=True)
class _Data:
    """The fit's data: per point its axis values, seed mean and seed count; the seed noise's sum of squares and
    its degrees of freedom."""

    axes: tuple[str, ...]  # "width", and "depth" in a sweep over depths where depths vary
    values: np.ndarray  # (points, axes)
    mean: np.ndarray  # (points,)
    n: np.ndarray  # (points,) seeds per mean
    ss_within: float  # the seed noise's sum of squares (see `_data`)
    dof_within: int  # … and its degrees of freedom
    lo: np.ndarray  # (axes,) the smallest fitted value of each axis
    hi: np.ndarray  # (axes,) the largest
    seed_spread: float | None = None  # the sd of the seeds' own offsets (shared by every width), when paired

    @property
    def params(self) -> int:
        return 1 + len(self.axes)

    @property
    def dof(self) -> int:
        """σ²'s degrees of freedom: the seeds' own and the law's residual ones."""
        return self.dof_within + len(self.mean) - self.params


def _data(points: list[dict[str, Any]], axes: tuple[str, ...]) -> _Data:
    """Every point trained the same seeds (a sweep gives each trial the config's seeds, and a seed fixes the
    data order and the init at every width): then a seed's offset is shared by every width — the seeds'
    losses move together — and it is the same in the target's mean over those seeds, so it belongs to the
    law's constant, not to the noise. The noise is what is left of each loss once its width's mean and its
    seed's mean are taken out (a two-way layout: (points − 1)·(seeds − 1) degrees of freedom). Points with
    other seed counts fall back to the spread around each point's mean (Σ (seeds − 1) degrees of freedom)."""
    values = np.array([[p[a] for a in axes] for p in points], dtype=float).reshape(len(points), len(axes))
    counts = {len(p["losses"]) for p in points}
    spread = None
    if len(counts) == 1 and (s := counts.pop()) >= 2 and len(points) >= 2:
        Y = np.array([p["losses"] for p in points], dtype=float)  # (points, seeds)
        resid = Y - Y.mean(axis=1, keepdims=True) - Y.mean(axis=0, keepdims=True) + Y.mean()
        ss, dof = float(np.sum(resid**2)), (len(points) - 1) * (s - 1)
        offsets = Y.mean(axis=0) - Y.mean()  # each seed's own offset, shared by every point
        spread = float(np.sqrt(max(np.var(offsets, ddof=1) - ss / dof / len(points), 0.0))) if dof else None
    else:
        ss = sum(float(np.sum((np.asarray(p["losses"]) - p["loss"]) ** 2)) for p in points)
        dof = sum(len(p["losses"]) - 1 for p in points)
    return _Data(
        axes,
        values,
        np.array([p["loss"] for p in points], dtype=float),
        np.array([len(p["losses"]) for p in points], dtype=float),
        ss,
        dof,
        values.min(axis=0),
        values.max(axis=0),
        spread,
    )


def _phi(v: np.ndarray, lo: float, hi: float, b: float) -> np.ndarray:
    """The law's shape along one axis scaled to 0 at `lo` and 1 at `hi` (b = 0: the logarithm)."""
    v = np.asarray(v, dtype=float)
    if b == 0.0:
        return np.log(v / lo) / math.log(hi / lo)
    return (lo**-b - v**-b) / (lo**-b - hi**-b)


def _design(values: np.ndarray, data: _Data, exps: tuple[float, ...]) -> np.ndarray:
    cols = [np.ones(len(values))] + [_phi(values[:, j], data.lo[j], data.hi[j], b) for j, b in enumerate(exps)]
    return np.stack(cols, axis=1)


@dataclass(frozen=True)
class _Posterior:
    data: _Data
    exps: list[tuple[float, ...]]  # the exponent grid (one tuple per combination)
    weight: np.ndarray  # posterior weight per combination
    theta: np.ndarray  # (combos, params): the coefficients' posterior mean (weighted least squares)
    cov: np.ndarray  # (combos, params, params): their covariance per unit σ²
    rss: np.ndarray  # (combos,) the weighted residual sum of squares of the seed means
    dof: int  # σ²'s degrees of freedom (0: no noise estimate)

    def best(self) -> int:
        return int(np.argmax(self.weight))


def _posterior(data: _Data) -> _Posterior:
    """The posterior over the exponent grid, refined once: where the coarse grid (`EXPONENTS`) finds the
    likelihood non-negligible (weight ≥ 1e-6 of the largest, one coarse step of margin), a grid of as many
    points again, so that a posterior narrower than a coarse step is not read off one or two points."""
    coarse = _grid_posterior(data, [EXPONENTS] * len(data.axes))
    step = float(EXPONENTS[1] - EXPONENTS[0])
    exps = np.asarray(coarse.exps)
    kept = exps[coarse.weight >= 1e-6 * coarse.weight.max()]
    grids = [
        np.linspace(
            max(EXPONENTS[0], kept[:, j].min() - step), min(EXPONENTS[-1], kept[:, j].max() + step), len(EXPONENTS)
        )
        for j in range(len(data.axes))
    ]
    return _grid_posterior(data, grids)


def _grid_posterior(data: _Data, grids: list[np.ndarray]) -> _Posterior:
    exps = [tuple(float(x) for x in e) for e in np.array(np.meshgrid(*grids, indexing="ij")).reshape(len(grids), -1).T]
    dof = data.dof
    thetas, covs, rsss, logml = [], [], [], []
    for e in exps:
        X = _design(data.values, data, e)
        A = X.T @ (data.n[:, None] * X)
        A_inv = np.linalg.pinv(A)
        theta = A_inv @ (X.T @ (data.n * data.mean))
        rss = float(np.sum(data.n * (data.mean - X @ theta) ** 2))
        _, logdet = np.linalg.slogdet(A)
        total = data.ss_within + rss
        ll = -0.5 * logdet - (0.5 * dof * math.log(total) if dof > 0 and total > 0 else 0.0)
        thetas.append(theta)
        covs.append(A_inv)
        rsss.append(rss)
        logml.append(ll)
    lm = np.asarray(logml)
    w = np.exp(lm - lm.max())
    return _Posterior(data, exps, w / w.sum(), np.asarray(thetas), np.asarray(covs), np.asarray(rsss), dof)


def law_draws(post: _Posterior, rng: np.random.Generator, draws: int = DRAWS) -> dict[str, np.ndarray]:
    """Posterior draws: combination index, σ and coefficients (the width term's gain clipped at ≤ 0: the loss
    cannot rise with width under the law); `falls`: whether the unclipped draw fell with width."""
    k = rng.choice(len(post.exps), size=draws, p=post.weight)
    if post.dof > 0:
        sigma2 = (post.data.ss_within + post.rss[k]) / rng.chisquare(post.dof, size=draws)
    else:
        sigma2 = np.zeros(draws)
    z = rng.standard_normal((draws, post.data.params))
    chol = np.stack([np.linalg.cholesky(c + 1e-15 * np.eye(len(c))) for c in post.cov])
    theta = post.theta[k] + np.einsum("nij,nj->ni", chol[k], z) * np.sqrt(sigma2)[:, None]
    falls = np.ones(draws, dtype=bool)
    if "width" in post.data.axes:
        w = post.data.axes.index("width") + 1
        falls = theta[:, w] < 0
        theta[:, w] = np.minimum(theta[:, w], 0.0)
    return {"k": k, "sigma2": sigma2, "theta": theta, "falls": falls}


def _predict(post: _Posterior, draws: dict[str, np.ndarray], at: np.ndarray, seeds: int, rng) -> np.ndarray:
    """Draws of the mean over `seeds` seeds of the loss at each point of `at` (points, axes): (draws, points)."""
    out = np.empty((len(draws["k"]), len(at)))
    for c in np.unique(draws["k"]):
        rows = draws["k"] == c
        X = _design(at, post.data, post.exps[c])
        out[rows] = draws["theta"][rows] @ X.T
    noise = np.sqrt(draws["sigma2"] / seeds)[:, None] * rng.standard_normal(out.shape)
    return out + noise


def _quantiles(samples: np.ndarray) -> tuple[float, float, float]:
    tail = (1 - CONFIDENCE) / 2
    lo, mid, hi = np.quantile(samples, [tail, 0.5, 1 - tail])
    return float(lo), float(mid), float(hi)


def _law_text(post: _Posterior) -> tuple[str, dict[str, Any]]:
    """The law at the posterior median exponent(s), in plain form, with each exponent's interval."""
    data = post.data
    exps = np.asarray(post.exps)
    terms: dict[str, Any] = {}
    median_e = []
    for j, axis in enumerate(data.axes):
        order = np.argsort(exps[:, j], kind="stable")
        cdf = np.cumsum(post.weight[order])
        tail = (1 - CONFIDENCE) / 2
        pick = [float(exps[order][np.searchsorted(cdf, q)][j]) for q in (tail, 0.5, 1 - tail)]
        median_e.append(pick[1])
        terms[axis] = {"b_interval": [pick[0], pick[2]], "b": pick[1]}
    c_idx = min(
        range(len(post.exps)), key=lambda i: sum(abs(post.exps[i][j] - median_e[j]) for j in range(len(median_e)))
    )
    theta = post.theta[c_idx]
    c = float(theta[0])
    pieces = []
    for j, axis in enumerate(data.axes):
        b, lo, hi, delta = median_e[j], float(data.lo[j]), float(data.hi[j]), float(theta[j + 1])
        sym = "w" if axis == "width" else "d"
        if b == 0.0:  # δ·ln(v/lo)/ln(hi/lo) = −k·ln v + const
            k = -delta / math.log(hi / lo)
            c += k * math.log(lo)
            terms[axis]["k"] = k
            pieces.append(f"− {k:.3g}·ln {sym}")
        else:  # δ·(lo^-b − v^-b)/(lo^-b − hi^-b) = const − a·v^-b
            a = -delta / (lo**-b - hi**-b)
            c += delta * lo**-b / (lo**-b - hi**-b)
            terms[axis]["a"] = a
            pieces.append(f"{'+' if a >= 0 else '−'} {abs(a):.3g}·{sym}^−{b:.2g}")
    ivs = ", ".join(
        f"{'b' if axis == 'width' else 'g'} {t['b']:.2g} [{t['b_interval'][0]:.2g}, {t['b_interval'][1]:.2g}]"
        for axis, t in terms.items()
    )
    return f"L = {c:.4g} {' '.join(pieces)}; {ivs}", {"c": c, "terms": terms}


def _f_pvalue(f: float, d1: int, d2: int, rng: np.random.Generator) -> float:
    """P(F(d1, d2) ≥ f), by simulation (numpy only)."""
    sims = (rng.chisquare(d1, 200_000) / d1) / (rng.chisquare(d2, 200_000) / d2)
    return float(np.mean(sims >= f))


# ----------------------------------------------------------------------------- the forecast


def forecast(
    run: Sweep | str | os.PathLike,
    width: int | None = None,
    depth: int | None = None,
    parametrization: str = "mup",
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
        parametrization: whose transferred point: "mup" (default) or "sp" (SP's usually has no law: its
            optimum moves with width).
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
    data = _data(points, axes)
    if len(points) < data.params:
        return replace(base, reason=f"{len(points)} points for a law of {data.params} numbers: sweep more widths")
    post = _posterior(data)
    draws = law_draws(post, rng)
    falls = float(np.mean(draws["falls"]))
    if falls < FALL_PROBABILITY:
        return replace(
            base,
            reason=f"the loss at the transferred hyperparameters does not fall with width ({_losses_text(points)}; "
            f"probability it falls {falls:.0%}): no law to extrapolate",
        )
    lack = _lack_of_fit(post, rng)
    if lack is not None:
        return replace(base, reason=f"the losses do not follow c + a·w^−b ({_losses_text(points)}): {lack}")
    law, params = _law_text(post)
    at = np.array([[targets[a] for a in axes]], dtype=float)
    pred = _predict(post, draws, at, n_target, rng)[:, 0]
    fitted_seeds = int(data.n[0])
    if data.seed_spread is not None and n_target != fitted_seeds:  # other seeds: their own offsets too
        pred = pred + data.seed_spread * math.sqrt(1 / n_target + 1 / fitted_seeds) * rng.standard_normal(len(pred))
        notes.append(
            f"the interval is for {n_target} seed{'s' if n_target > 1 else ''} other than the sweep's {fitted_seeds}: "
            f"it holds their own offsets (the seeds' spread, {data.seed_spread:.2g})"
        )
    lo, mid, hi = _quantiles(pred)
    held = _held_out(points, axes, rng)
    if post.dof <= 0:
        notes.append("one seed and no misfit to measure: the interval holds the exponent's doubt only, not seed noise")
    if held is None:
        notes.append(f"no held-out check: it needs {data.params + 1} points or more with the largest left out")
    band = _band(post, draws, points, axes, targets, n_target, rng)
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
        band=band,
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


def _lack_of_fit(post: _Posterior, rng: np.random.Generator) -> str | None:
    """A misfit the seed noise cannot explain (F test at `LACK_OF_FIT`, the best exponent), else None."""
    data = post.data
    d1 = len(data.mean) - data.params
    d2 = data.dof_within  # the seeds' own degrees of freedom
    if d1 < 1 or d2 < 1 or data.ss_within <= 0:
        return None
    f = (post.rss[post.best()] / d1) / (data.ss_within / d2)
    p = _f_pvalue(f, d1, d2, rng)
    if p >= LACK_OF_FIT:
        return None
    return f"its misfit is {math.sqrt(f):.3g}× the seed noise (F test p = {p:.2g})"


def _held_out(points: list[dict[str, Any]], axes: tuple[str, ...], rng: np.random.Generator) -> dict[str, Any] | None:
    """The largest proxy predicted by the law fitted on the other points (None when too few remain)."""
    top = max(points, key=lambda p: (p["width"], p["depth"] or 0))
    rest = [p for p in points if p is not top]
    if any(len({p[a] for p in rest}) < 2 for a in axes) or len(rest) < 1 + len(axes):
        return None
    data = _data(rest, axes)
    post = _posterior(data)
    draws = law_draws(post, rng)
    at = np.array([[top[a] for a in axes]], dtype=float)
    lo, mid, hi = _quantiles(_predict(post, draws, at, len(top["losses"]), rng)[:, 0])
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


def _band(
    post: _Posterior,
    draws: dict[str, np.ndarray],
    points: list[dict[str, Any]],
    axes: tuple[str, ...],
    targets: dict[str, Any],
    seeds: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The law's median and 90 % band along its first axis (width, or depth in a depth-only law), from the
    smallest swept value to the target (log-spaced), the other axis at the target's value."""
    axis = axes[0]
    values = [p[axis] for p in points]
    xs = np.unique(np.geomspace(min(values), max(max(values), targets[axis]), 48).round(6))
    at = np.stack([xs if a == axis else np.full_like(xs, float(targets[a])) for a in axes], axis=1)
    pred = _predict(post, draws, at, seeds, rng)
    q = np.quantile(pred, [(1 - CONFIDENCE) / 2, 0.5, 1 - (1 - CONFIDENCE) / 2], axis=0)
    return {"axis": axis, "values": xs.tolist(), "low": q[0].tolist(), "median": q[1].tolist(), "high": q[2].tolist()}


def target_flops(
    sweep: Sweep, results: list[TrialResult], width: int, depth: int | None = None
) -> dict[str, Any] | None:
    """One run's FLOPs at (`width`, `depth`), estimated from the FLOPs the sweep's µP trials counted.

    At a fixed batch and horizon a model's matmul FLOPs are a polynomial in width — quadratic (the hidden
    matmuls), linear (a readout or attention scores over a fixed length), and a constant for matmuls that do
    not grow — times the number of blocks in depth. The per-seed counts of the cells (the median over each
    cell's completed trials) are fitted by least squares on relative error: 1, w, w² with three widths or
    more, w and w² with two (× 1, d in a sweep over depths); `misfit` is the largest relative residual.

    Args:
        sweep: the sweep.
        results: its trials.
        width: the run's width.
        depth: its depth (sweeps over depths).

    Returns:
        ``{"target", "fit", "misfit", "proxy_flops", "sweep_flops"}`` (the last two: what tuning and the whole
        sweep counted), or None when no trial recorded its FLOPs. "target" is None (and "fit" says why) when
        the widths (depths) the counts span cannot reach the run.
    """
    cfg = sweep.config
    parametrization = "mup" if "mup" in cfg.parametrizations else cfg.parametrizations[0]
    cost = costs(sweep, results)
    if cost["sweep_flops"] is None:
        return None
    out: dict[str, Any] = {
        "target": None,
        "fit": "",
        "misfit": None,
        "proxy_flops": cost["proxy_flops"],
        "sweep_flops": cost["sweep_flops"],
    }
    cells = []
    for w in cfg.widths:
        for d in list(cfg.depths) if cfg.depths is not None else [None]:
            per_seed = [  # training alone: the noise-scale measurement runs in the proxy cell only
                (r.flops - (r.flops_measurement if math.isfinite(r.flops_measurement) else 0.0)) / len(r.losses)
                for r in in_cell(results, parametrization, w, d)
                if r.ok and math.isfinite(r.flops) and r.losses
            ]
            if per_seed:
                cells.append((w, d, float(np.median(per_seed))))
    if cells and all(f == 0 for _, _, f in cells):
        out.update(target=0.0, fit="no FLOPs counted at any width (no torch matmul, convolution or attention)")
        return out
    cells = [c for c in cells if c[2] > 0]
    widths = sorted({w for w, _, _ in cells})
    depths = sorted({d for _, d, _ in cells if d is not None})
    if not cells:
        out["fit"] = "no completed µP trial recorded its FLOPs"
        return out
    if len(widths) < 2 and width not in widths:
        out["fit"] = "the counts span one width: no law in width"
        return out
    if depth is not None and len(depths) < 2 and depth not in depths:
        out["fit"] = "the counts span one depth: no law in depth"
        return out
    powers = [0, 1, 2] if len(widths) >= 3 else [1, 2] if len(widths) == 2 else [0]
    in_depth = depth is not None and len(depths) >= 2
    columns = [(p, q) for p in powers for q in ([0, 1] if in_depth else [0])]

    def row(w: float, d: float | None) -> np.ndarray:
        return np.array([w**p * ((d or 1.0) ** q) for p, q in columns], dtype=float)

    X = np.stack([row(w, d) for w, d, _ in cells])
    y = np.array([f for _, _, f in cells])
    coef = np.linalg.lstsq(X / y[:, None], np.ones(len(y)), rcond=None)[0]  # least squares on relative error
    fitted = X @ coef
    out["target"] = float(row(width, depth) @ coef)
    out["misfit"] = float(np.max(np.abs(fitted / y - 1)))
    names = {0: "1", 1: "w", 2: "w²"}
    terms = ", ".join(names[p] + ("·d" if q else "") for p, q in columns)
    out["fit"] = f"a sum of {terms} fitted to the per-seed training counts at widths {_span(widths)}" + (
        f" × depths {_span(depths)}" if in_depth else ""
    )
    return out
