"""The law of the loss in width (and depth) behind `forecasts`, and its Bayesian fit.

    L(w) = c + a·w^(−b),  a ≥ 0,  b in [0, 1]   (b → 0: the logarithmic limit c' − k·ln w)

and, in a sweep over depths, one more term e·d^(−g) (its sign free: deeper is not always better at a fixed
horizon). Why this form and this range: the expected loss approaches its infinite-width limit as a power of
the width, at most like 1/width — the rate once the width is large against the data (Bahri et al. 2021,
"Explaining neural scaling laws": the variance-limited regime, b = 1; in Tensor Programs terms a network's
outputs deviate from their limit by O(n^-½) with mean zero, so the expected loss by O(1/n)) — and more slowly
while the width still limits what the model resolves (Kaplan et al. 2020 measure 0.076 per parameter,
b ≈ 0.15 per width for N ∝ w²; Hoffmann et al. 2022, b ≈ 0.7). µScaling (Yao & Wang 2023) fits the same form
on a µP width ladder.

Three widths and two seeds cannot pin three numbers by least squares alone (two widths cannot pin them at
all), and a bootstrap over two seeds has three distinct resamples. So the fit is Bayesian, and every source
of doubt stays in the interval:

- the seed noise: the loss of each seed is the law plus the seed's own offset (shared by every width: a
  seed fixes the data order and the init; the target's mean over the same seeds has the same offsets, so
  they sit in the law's constant) plus Gaussian noise of one variance σ² (estimated from what is left of
  the losses once each width's and each seed's mean are taken out, and from the law's misfit; a Jeffreys
  prior), so a width's mean of n seeds has variance σ²/n;
- the exponent: a uniform prior on [0, 1] (the grid `EXPONENTS`); its posterior weight is the marginal
  likelihood, the coefficients and σ integrated out (the law is linear in them once b is fixed, written
  through its values at the smallest and largest fitted widths so that a flat prior on them is the same
  for every b);
- the prediction: Monte Carlo draws of (b, σ², coefficients) from the posterior and of the target's own
  mean of its seeds — the 5 % and 95 % quantiles are the 90 % interval, their median the forecast.

A law is refused (`lack_of_fit`) when its misfit, against the seeds' own spread, fails an F test at
`LACK_OF_FIT`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .statistics import CONFIDENCE

__all__ = [
    "DRAWS",
    "EXPONENTS",
    "LACK_OF_FIT",
    "LawData",
    "Posterior",
    "band",
    "lack_of_fit",
    "law_data",
    "law_draws",
    "law_text",
    "posterior",
    "predict",
    "quantiles",
    "span",
]

EXPONENTS = np.linspace(0.0, 1.0, 41)  # the exponent's grid (uniform prior); 0 is the logarithmic limit
DRAWS = 4000  # Monte Carlo draws of the posterior predictive
LACK_OF_FIT = 0.001  # the F test's level: the law is refused when its misfit is this unlikely under the seed noise


@dataclass(frozen=True)
class LawData:
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


def law_data(points: list[dict[str, Any]], axes: tuple[str, ...]) -> LawData:
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
    return LawData(
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


def _design(values: np.ndarray, data: LawData, exps: tuple[float, ...]) -> np.ndarray:
    cols = [np.ones(len(values))] + [_phi(values[:, j], data.lo[j], data.hi[j], b) for j, b in enumerate(exps)]
    return np.stack(cols, axis=1)


@dataclass(frozen=True)
class Posterior:
    data: LawData
    exps: list[tuple[float, ...]]  # the exponent grid (one tuple per combination)
    weight: np.ndarray  # posterior weight per combination
    theta: np.ndarray  # (combos, params): the coefficients' posterior mean (weighted least squares)
    cov: np.ndarray  # (combos, params, params): their covariance per unit σ²
    rss: np.ndarray  # (combos,) the weighted residual sum of squares of the seed means
    dof: int  # σ²'s degrees of freedom (0: no noise estimate)

    def best(self) -> int:
        return int(np.argmax(self.weight))


def posterior(data: LawData) -> Posterior:
    """The posterior over the exponent grid, refined once: where the coarse grid (`EXPONENTS`) finds the
    likelihood non-negligible (weight ≥ 1e-6 of the largest, one coarse step of margin), a grid of as many
    points again, so that a posterior narrower than a coarse step is not read off one or two points."""
    coarse = _gridposterior(data, [EXPONENTS] * len(data.axes))
    step = float(EXPONENTS[1] - EXPONENTS[0])
    exps = np.asarray(coarse.exps)
    kept = exps[coarse.weight >= 1e-6 * coarse.weight.max()]
    grids = [
        np.linspace(
            max(EXPONENTS[0], kept[:, j].min() - step), min(EXPONENTS[-1], kept[:, j].max() + step), len(EXPONENTS)
        )
        for j in range(len(data.axes))
    ]
    return _gridposterior(data, grids)


def _gridposterior(data: LawData, grids: list[np.ndarray]) -> Posterior:
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
    return Posterior(data, exps, w / w.sum(), np.asarray(thetas), np.asarray(covs), np.asarray(rsss), dof)


def law_draws(post: Posterior, rng: np.random.Generator, draws: int = DRAWS) -> dict[str, np.ndarray]:
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


def predict(post: Posterior, draws: dict[str, np.ndarray], at: np.ndarray, seeds: int, rng) -> np.ndarray:
    """Draws of the mean over `seeds` seeds of the loss at each point of `at` (points, axes): (draws, points)."""
    out = np.empty((len(draws["k"]), len(at)))
    for c in np.unique(draws["k"]):
        rows = draws["k"] == c
        X = _design(at, post.data, post.exps[c])
        out[rows] = draws["theta"][rows] @ X.T
    noise = np.sqrt(draws["sigma2"] / seeds)[:, None] * rng.standard_normal(out.shape)
    return out + noise


def quantiles(samples: np.ndarray) -> tuple[float, float, float]:
    tail = (1 - CONFIDENCE) / 2
    lo, mid, hi = np.quantile(samples, [tail, 0.5, 1 - tail])
    return float(lo), float(mid), float(hi)


def law_text(post: Posterior) -> tuple[str, dict[str, Any]]:
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


def lack_of_fit(post: Posterior, rng: np.random.Generator) -> str | None:
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


def band(
    post: Posterior,
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
    pred = predict(post, draws, at, seeds, rng)
    q = np.quantile(pred, [(1 - CONFIDENCE) / 2, 0.5, 1 - (1 - CONFIDENCE) / 2], axis=0)
    return {"axis": axis, "values": xs.tolist(), "low": q[0].tolist(), "median": q[1].tolist(), "high": q[2].tolist()}


def span(values: list[int]) -> str:
    """ "32…256": the first and last of a sorted list (both when two or fewer)."""
    return "…".join(str(v) for v in (values if len(values) <= 2 else [values[0], values[-1]]))
