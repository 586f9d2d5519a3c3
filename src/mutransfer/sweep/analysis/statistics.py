"""The numbers behind the transfer verdicts, computed from a sweep's own trials, with uncertainty.

(Above 500 lines: one pipeline — loss matrices, optima, intervals, the decision — sharing one bootstrap.)
Numbers only: the sentences that state them are in `verdict`.

For each parametrization and hyperparameter, along one axis (width, or depth):

- **optimum per cell, below grid resolution**: the loss curve (the profile over the other HPs
  when several are swept) is fitted by a parabola through its best point and that point's two
  neighbours, in log2 for a log-scaled HP — the classic parabolic interpolation of a minimum.
  Its position is *unknown* when the best point is on the grid's **edge** (the optimum may lie
  beyond: "widen the grid"), beside a grid point that was not evaluated (failed, or not run yet),
  or when the curve is **flat** (a chi-square test finds its spread within seed noise — the noise
  of differences between its points: a seed's offset common to every trial is taken out — the HP has
  no measurable effect there). A diverged or pruned neighbour counts as evaluated and worse.
- **interval**: a bootstrap over seeds. Every trial trains once per seed; a resample draws the
  seeds with replacement (the same draw for every cell, since a seed fixes the data order in
  every cell), recomputes each trial's mean loss and refits. The interval is centred on the
  estimate from all seeds: ± the larger distance from it to either end of the central `CONFIDENCE`
  quantile range of the refitted values (with two seeds the bootstrap has three distinct draws, two
  of them single-seed fits that lean the same way, so a plain quantile range put the estimate on its
  own edge), widened to the midpoints with the
  neighbouring points where no parabola fits (a non-finite neighbour) and always for random/TPE
  samples (scattered points; the bootstrap only sees seed noise). With two seeds the bootstrap
  has three distinct draws, so the interval is coarse — more seeds tighten it.
- **move** of each cell's optimum from the proxy's (the smallest value on the axis), in octaves
  for a log HP; the **drift** is the move of the largest cell.
- **regret** at each cell: the loss there with the proxy's best trial's HPs (the same grid
  point) minus that cell's own best, relative to the best (absolute when the best loss is not
  positive); known wherever the proxy's point was also evaluated there (grid sweeps), with its
  own bootstrap interval. Each cell's best is picked on the same noisy data, so regret leans high
  under noise; the verdict only fails it when its whole interval lies above `MAX_REGRET`.
- **transferred**: every optimum located, and at every cell the proxy's HPs do not diverge, the
  regret is not significantly above `MAX_REGRET` (2%), and either the regret's interval lies
  below it or the move's interval within ±`tolerance` (1 octave for a log HP: a factor of 2).
  **Did not transfer**: the proxy's HPs diverge, the regret lies wholly above 2%, or the move
  lies wholly beyond the tolerance (and the regret is not small). Everything else is **cannot
  tell**, with the reason (edge, unevaluated neighbour, flat curve, intervals too wide).

Everything here reads the trials; no sentence of the report is written without a number behind it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config.space import Choice, Dimension, LogUniform, Uniform

__all__ = [
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "EDGE_NAMES",
    "MAX_REGRET",
    "N_BOOTSTRAP",
    "TOLERANCE_OCTAVES",
    "CellData",
    "Estimate",
    "HPVerdict",
    "Optimum",
    "Verdict",
    "cell_data",
    "coordinate",
    "interval",
    "judge",
    "parabolic_minimum",
    "profile",
    "resample_index",
    "resampled_means",
    "tolerance",
    "unit",
    "value_at",
]

CONFIDENCE = 0.90
N_BOOTSTRAP = 2000
TOLERANCE_OCTAVES = 1.0
MAX_REGRET = 0.02  # a relative regret this small does not matter in practice (≈ one grid step of lr off)
BOOTSTRAP_SEED = 0  # the report is a deterministic function of the trials
EDGE_NAMES = {-1: "low", 1: "high", -2: "unevaluated neighbour below", 2: "unevaluated neighbour above"}


# ----------------------------------------------------------------------------- HP coordinates


def coordinate(dim: Dimension, value) -> float:
    """Where a value sits on the axis the optimum is located along: log2 for a log HP, the value
    for a uniform one, the index for a choice."""
    if isinstance(dim, Choice):
        return float(list(dim.values).index(value))
    return math.log2(value) if isinstance(dim, LogUniform) else float(value)


def value_at(dim: Dimension, x: float):
    """The HP value at coordinate `x` (inverse of `coordinate`)."""
    if isinstance(dim, Choice):
        return list(dim.values)[round(x)]
    return 2.0**x if isinstance(dim, LogUniform) else x


def tolerance(dim: Dimension) -> float:
    """How far an optimum may move and still count as transferred, in `coordinate` units:
    1 octave for a log HP, one grid step for a uniform one, 0 (the same choice) for a choice."""
    if isinstance(dim, LogUniform):
        return TOLERANCE_OCTAVES
    if isinstance(dim, Uniform):
        return (dim.high - dim.low) / max(1, dim.grid - 1)
    return 0.0


def unit(dim: Dimension) -> str:
    return " octaves" if isinstance(dim, LogUniform) else ""


# ----------------------------------------------------------------------------- loss matrices


@dataclass
class CellData:
    """One cell's usable trials as arrays: HP coordinates per trial and losses per (trial, seed)."""

    x: dict[str, np.ndarray]  # HP name -> coordinate per trial
    losses: np.ndarray  # (n_trials, n_seeds); +inf for a diverged or pruned trial
    keys: list[tuple]  # each trial's HP values, to find the same point in another cell
    evaluated: dict[str, np.ndarray] = field(default_factory=dict)  # HP -> sorted coordinates tried

    @property
    def empty(self) -> bool:
        return not np.isfinite(self.losses).any()


def cell_data(trials: Sequence, space: dict[str, Dimension], n_seeds: int) -> CellData:
    """Arrays of one cell's completed, diverged and pruned trials (failed ones were not evaluated).

    A pruned trial was stopped because it was worse, at the same step, than trials already finished
    in its study: it counts as evaluated and worse than any completed one (+inf, like a diverged
    one), so that it neither wins an optimum nor makes its neighbour a grid edge."""
    rows: list[list[float]] = []
    keys: list[tuple] = []
    xs: dict[str, list[float]] = {n: [] for n in space}
    for r in trials:
        if r.failed:
            continue
        if r.diverged or getattr(r, "pruned", False):
            row = [math.inf] * n_seeds
        elif len(r.losses) == n_seeds and all(math.isfinite(v) for v in r.losses):
            row = list(r.losses)
        else:  # per-seed losses not recorded: the mean stands for every seed (no spread)
            row = [r.loss] * n_seeds
        rows.append(row)
        keys.append(tuple(r.params[n] for n in space))
        for n, dim in space.items():
            xs[n].append(coordinate(dim, r.params[n]))
    x = {n: np.asarray(v, dtype=float) for n, v in xs.items()}
    losses = np.asarray(rows, dtype=float).reshape(len(rows), n_seeds)
    return CellData(x, losses, keys, {n: np.unique(v) for n, v in x.items()})


def resample_index(n_seeds: int, n: int = N_BOOTSTRAP) -> np.ndarray:
    """(n, n_seeds) seed indices drawn with replacement; row 0 is the data itself."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    idx = rng.integers(0, n_seeds, size=(n, n_seeds))
    idx[0] = np.arange(n_seeds)
    return idx


def resampled_means(cell: CellData, idx: np.ndarray) -> np.ndarray:
    """(n_resamples, n_trials) mean loss of every trial under each seed resample."""
    if not len(cell.keys):
        return np.zeros((len(idx), 0))
    return cell.losses[:, idx].mean(axis=2).T  # (trials, B, S) -> (B, trials)


# ----------------------------------------------------------------------------- locating an optimum


def profile(x: np.ndarray, means: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """(B, len(grid)): at each evaluated coordinate, the best mean loss over trials there (the
    profile over the other HPs)."""
    out = np.full((means.shape[0], len(grid)), np.inf)
    for j, g in enumerate(grid):
        cols = np.flatnonzero(x == g)
        if len(cols):
            out[:, j] = means[:, cols].min(axis=1)
    return out


def parabolic_minimum(grid: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of y (B, n): the fitted minimum's coordinate and its edge flag (-1 low, +1 high, 0).

    The best point and its two neighbours define a parabola whose vertex lies between the
    neighbours; a non-finite neighbour or a flat triple leaves the best point itself. A row with
    no finite value gives NaN.
    """
    n = len(grid)
    finite = np.isfinite(y).any(axis=1)
    i = np.where(finite, np.argmin(np.where(np.isfinite(y), y, np.inf), axis=1), 0)
    xs = grid[i].astype(float)
    edge = np.where(i == 0, -1, np.where(i == n - 1, 1, 0))
    if n == 1:
        edge[:] = 0
    inner = (i > 0) & (i < n - 1)
    if inner.any():
        r = np.flatnonzero(inner)
        ii = i[r]
        x0, x1, x2 = grid[ii - 1], grid[ii], grid[ii + 1]
        y0, y1, y2 = y[r, ii - 1], y[r, ii], y[r, ii + 1]
        ok = np.isfinite(y0) & np.isfinite(y2)
        with np.errstate(invalid="ignore", divide="ignore"):
            num = (x1 - x0) ** 2 * (y1 - y2) - (x1 - x2) ** 2 * (y1 - y0)
            den = (x1 - x0) * (y1 - y2) - (x1 - x2) * (y1 - y0)
            vertex = x1 - 0.5 * num / den
        good = ok & np.isfinite(vertex) & (den != 0)
        xs[r[good]] = np.clip(vertex[good], x0[good], x2[good])
    xs[~finite] = np.nan
    return xs, edge


def interval(samples: np.ndarray, center: float | None = None) -> tuple[float, float] | None:
    """The interval of bootstrap samples (row 0 excluded: it is the data itself).

    Args:
        samples: (n_resamples,) values, row 0 computed from the data.
        center: the estimate the interval is for; default `samples[0]`. The interval is
            `center ± d`, `d` the larger distance from `center` to either end of the central
            `CONFIDENCE` quantile range, so the estimate always sits in its middle.

    Returns:
        (low, high), or None when there is no spread to estimate (one seed) or no finite sample.
    """
    s = samples[1:]
    s = s[np.isfinite(s)]
    if len(s) < 2:
        return None
    a = (1 - CONFIDENCE) / 2
    lo, hi = (float(q) for q in np.quantile(s, [a, 1 - a]))
    c = float(samples[0]) if center is None else float(center)
    if not math.isfinite(c):
        return lo, hi
    d = max(abs(hi - c), abs(c - lo))
    return c - d, c + d


# ----------------------------------------------------------------------------- verdicts


@dataclass
class Optimum:
    """One cell's optimum of one HP: fitted coordinate, its interval, the best grid point, the edge."""

    at: int  # the axis value (width or depth)
    x: float  # fitted coordinate (log2 for a log HP)
    x_interval: tuple[float, float] | None
    grid_x: float  # the best evaluated coordinate
    edge: int  # -1/+1 on the grid's low/high edge, -2/+2 beside a grid point not evaluated, 0 inside
    loss: float  # best mean loss in the cell
    flat: bool = False  # the HP has no measurable effect on the loss in this cell

    @property
    def located(self) -> bool:
        """Is the optimum's position known (inside the evaluated range, the loss not flat)?"""
        return not self.edge and not self.flat

    def as_dict(self, dim: Dimension) -> dict:
        d = {
            "value": value_at(dim, self.x),
            "grid_value": value_at(dim, self.grid_x),
            "interval": None if self.x_interval is None else [value_at(dim, v) for v in self.x_interval],
            "edge": EDGE_NAMES.get(self.edge),
            "flat": self.flat,
            "loss": self.loss,
        }
        if isinstance(dim, LogUniform):
            d.update(log2=self.x, log2_interval=None if self.x_interval is None else list(self.x_interval))
        return d


@dataclass
class Estimate:
    value: float
    interval: tuple[float, float] | None

    def as_dict(self) -> dict:
        return {"value": self.value, "interval": None if self.interval is None else list(self.interval)}

    def within(self, bound: float) -> bool:
        """Does the interval (the value itself without one) lie within ±bound?"""
        lo, hi = self.interval if self.interval is not None else (self.value, self.value)
        return math.isfinite(self.value) and -bound - 1e-9 <= lo and hi <= bound + 1e-9


@dataclass
class HPVerdict:
    name: str
    dim: Dimension
    optima: list[Optimum]
    moves: dict[int, Estimate]  # axis value -> move of the optimum from the proxy's
    transferred: bool
    reasons: list[str]
    samples: dict[int, np.ndarray] = field(
        default_factory=dict, repr=False
    )  # axis value -> bootstrap optima (row 0: data)

    @property
    def drift(self) -> Estimate | None:
        return self.moves.get(self.optima[-1].at) if len(self.optima) >= 2 else None


@dataclass
class Verdict:
    """One parametrization along one axis: every HP's optima and moves, regret per cell."""

    parametrization: str
    axis: str
    proxy: int
    hps: dict[str, HPVerdict]
    regret: dict[int, tuple[Estimate, Estimate]]  # axis value -> (absolute, relative) regret
    counts: dict[str, int]

    @property
    def transferred(self) -> bool:
        return bool(self.hps) and all(h.transferred for h in self.hps.values())

    def as_dict(self) -> dict:
        return {
            "axis": self.axis,
            "proxy": self.proxy,
            "transferred": self.transferred,
            "hparams": {
                n: {
                    "optimum": {str(o.at): o.as_dict(h.dim) for o in h.optima},
                    "move": {
                        str(k): dict(v.as_dict(), unit=unit(h.dim).strip() or "value") for k, v in h.moves.items()
                    },
                    "drift": None if h.drift is None else dict(h.drift.as_dict(), unit=unit(h.dim).strip() or "value"),
                    "tolerance": tolerance(h.dim),
                    "transferred": h.transferred,
                    "reasons": h.reasons,
                }
                for n, h in self.hps.items()
            },
            "regret": {
                str(k): {
                    "loss": a.value,
                    "relative": r.value,
                    "relative_interval": None if r.interval is None else list(r.interval),
                }
                for k, (a, r) in self.regret.items()
            },
            "counts": self.counts,
        }


def _regret(
    proxy: CellData, proxy_means: np.ndarray, cell: CellData, cell_means: np.ndarray
) -> tuple[Estimate, Estimate] | None:
    """Loss in `cell` at the proxy's best point minus the cell's best, per resample."""
    index = {k: j for j, k in enumerate(cell.keys)}
    match = np.array([index.get(k, -1) for k in proxy.keys])
    if not len(match) or not np.isfinite(proxy_means).any() or not np.isfinite(cell_means).any():
        return None
    jstar = np.argmin(np.where(np.isfinite(proxy_means), proxy_means, np.inf), axis=1)
    k = match[jstar]
    if k[0] < 0:
        return None
    rows = np.arange(len(k))
    at = np.where(k >= 0, cell_means[rows, np.maximum(k, 0)], np.nan)
    best = np.min(np.where(np.isfinite(cell_means), cell_means, np.inf), axis=1)
    absolute = at - best
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(best > 0, absolute / best, np.nan)
    absolute = np.where(np.isinf(at), np.inf, absolute)
    relative = np.where(np.isinf(at), np.inf, relative)
    return (_nonnegative(absolute), _nonnegative(relative))


def _nonnegative(samples: np.ndarray) -> Estimate:
    """A regret's estimate with its interval, clipped at 0 (a cell's own best is never beaten)."""
    iv = interval(samples)
    return Estimate(float(samples[0]), None if iv is None else (max(0.0, iv[0]), iv[1]))


def _locate(
    coords: np.ndarray, prof: np.ndarray, dim: Dimension, grid: np.ndarray | None, noise: float
) -> tuple[np.ndarray, int, float, float, bool]:
    """Per resample, the fitted optimum; for the data (row 0): its edge code, the quantisation
    extents (how far below/above the fitted point the optimum may lie given the points evaluated)
    and whether the loss is flat in this HP."""
    xs, edges = parabolic_minimum(coords, prof)
    row = prof[0]
    finite = row[np.isfinite(row)]
    i = int(np.argmin(np.where(np.isfinite(row), row, np.inf)))
    spread = float(finite.max() - finite.min()) if len(finite) else 0.0
    flat = len(finite) >= 2 and (
        spread <= 1e-9 * (1.0 + abs(float(finite.min()))) or (noise > 0 and _within_noise(finite, noise))
    )
    if isinstance(dim, Choice):  # no interpolation between choices
        xs = coords[np.argmin(np.where(np.isfinite(prof), prof, np.inf), axis=1)]
        return xs, 0, 0.0, 0.0, flat
    edge = int(edges[0])
    if grid is not None and len(grid) > 1:  # a grid sampler: edges are the grid's, gaps are points not evaluated
        g = int(np.argmin(np.abs(grid - coords[i])))
        if g == 0 or g == len(grid) - 1:
            edge = -1 if g == 0 else 1
        else:
            below, above = grid[g - 1], grid[g + 1]
            edge = -2 if not np.isclose(coords, below).any() else 2 if not np.isclose(coords, above).any() else 0
    if flat:
        edge = 0
    fitted = (
        0 < i < len(coords) - 1
        and np.isfinite(row[i - 1])
        and np.isfinite(row[i + 1])
        and (row[i - 1] != row[i] or row[i + 1] != row[i])
    )
    q_lo = q_hi = 0.0
    if not fitted or grid is None:  # the best point alone, or scattered samples: up to the neighbours' midpoints
        left = (coords[i - 1] + coords[i]) / 2 if i > 0 else coords[i]
        right = (coords[i] + coords[i + 1]) / 2 if i < len(coords) - 1 else coords[i]
        q_lo, q_hi = float(xs[0] - left), float(right - xs[0])
    return xs, edge, max(0.0, q_lo), max(0.0, q_hi), bool(flat)


def _within_noise(y: np.ndarray, se: float) -> bool:
    """Could the curve's values differ by seed noise alone? A chi-square test of equal means (each
    with standard error `se`) at the 1% level; its quantile by Wilson–Hilferty."""
    chi2 = float(((y - y.mean()) ** 2).sum()) / se**2
    return chi2 < _chi2_quantile(len(y) - 1, 2.326)


def _chi2_quantile(k: int, z: float) -> float:
    """The quantile of χ² with k degrees of freedom at the standard normal quantile z (Wilson–Hilferty:
    z = 0 the median, 2.326 the 99th percentile)."""
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def _hull(iv: tuple[float, float] | None, lo: float, hi: float, point: float) -> tuple[float, float] | None:
    """The bootstrap interval widened to [point - lo, point + hi] (None when neither says anything)."""
    if iv is None and lo == 0 and hi == 0:
        return None
    a, b = iv if iv is not None else (point, point)
    return min(a, point - lo), max(b, point + hi)


def _noise(d: CellData) -> float:
    """The standard error of a trial's mean loss over seeds, as the flatness test compares points of
    one curve (0 with one seed or one trial). A seed fixes the data order and the init of every trial
    in the cell, so a seed that is worse everywhere moves every point alike and tells nothing about
    the HP: each seed's typical offset (the median over trials of its loss minus the trial's mean) is
    taken out, and the variance is the median over trials of the residuals' variance, scaled by the
    median of χ² with seeds − 1 degrees of freedom (Wilson–Hilferty) to estimate σ². Medians: one run
    blown up to a huge loss without diverging must not make every curve of its cell look flat."""
    n_seeds = d.losses.shape[1]
    finite = d.losses[np.isfinite(d.losses).all(axis=1)]
    if n_seeds < 2 or len(finite) < 2:
        return 0.0
    deviation = finite - finite.mean(axis=1, keepdims=True)
    residual = deviation - np.median(deviation, axis=0)
    variance = float(np.median((residual**2).sum(axis=1))) / _chi2_quantile(n_seeds - 1, 0.0)
    return math.sqrt(variance / n_seeds)


PASS, FAIL, UNSURE = "pass", "fail", "unsure"


def _status(est: Estimate | None, low: float, high: float) -> str:
    """PASS when the interval (the value without one) lies in [low, high], FAIL when it lies
    wholly outside, UNSURE otherwise or without an estimate."""
    if est is None or not math.isfinite(est.value):
        return UNSURE
    a, b = est.interval if est.interval is not None else (est.value, est.value)
    if low - 1e-12 <= a and b <= high + 1e-12:
        return PASS
    return FAIL if b < low or a > high else UNSURE


def judge(
    parametrization: str,
    axis: str,
    cells: Sequence[tuple[int, Sequence]],
    space: dict[str, Dimension],
    n_seeds: int,
    n_bootstrap: int = N_BOOTSTRAP,
    grid: bool = True,
) -> Verdict | None:
    """The verdict along `axis`: optima, intervals, moves, regret and the decision.

    Args:
        parametrization: "mup", "u-mup" or "sp".
        axis: "width", "depth", "batch_size" or "steps".
        cells: [(axis value, that cell's trials)]; the smallest value is the proxy.
        space: the swept hyperparameters.
        n_seeds: seeds per trial.
        n_bootstrap: bootstrap resamples.
        grid: the trials sit on the space's grid (edges are the grid's own; the parabolic fit is
            trusted); otherwise intervals also span half the distance to the neighbouring samples.

    Returns:
        The `Verdict`, or None when the proxy cell has no usable trial.
    """
    cells = sorted(cells, key=lambda c: c[0])
    idx = resample_index(n_seeds, n_bootstrap if n_seeds > 1 else 1)
    datas = [(at, cell_data(trials, space, n_seeds)) for at, trials in cells]
    datas = [(at, d) for at, d in datas if not d.empty]
    n_counts = {"completed": 0, "diverged": 0, "failed": 0, "pruned": 0}
    for _, trials in cells:
        for r in trials:
            pruned = getattr(r, "pruned", False)
            n_counts["failed" if r.failed else "diverged" if r.diverged else "pruned" if pruned else "completed"] += 1
    if not datas or datas[0][0] != cells[0][0]:
        return None
    means = {at: resampled_means(d, idx) for at, d in datas}
    proxy_at, proxy = datas[0]
    regret = {}
    for at, d in datas:
        r = _regret(proxy, means[proxy_at], d, means[at])
        if r is not None:
            regret[at] = r
    hps = {}
    for name, dim in space.items():
        grid_coords = (
            np.array([coordinate(dim, v) for v in dim.grid_points()]) if grid and not isinstance(dim, Choice) else None
        )
        optima, samples, quant = [], {}, {}
        for at, d in datas:
            coords = d.evaluated[name]
            prof = profile(d.x[name], means[at], coords)
            xs, edge, q_lo, q_hi, flat = _locate(coords, prof, dim, grid_coords, _noise(d))
            samples[at], quant[at] = xs, (q_lo, q_hi)
            grid_x = float(coords[int(np.argmin(np.where(np.isfinite(prof[0]), prof[0], np.inf)))])
            located = not edge and not flat
            iv = _hull(interval(xs), q_lo, q_hi, float(xs[0])) if located else None
            optima.append(Optimum(at, float(xs[0]), iv, grid_x, edge, float(np.min(prof[0])), flat))
        by_at = {o.at: o for o in optima}
        moves = {}
        for at, _ in datas[1:]:
            m = float(samples[at][0] - samples[proxy_at][0])
            if by_at[at].located and by_at[proxy_at].located:
                (wl, wh), (pl, ph) = quant[at], quant[proxy_at]
                moves[at] = Estimate(m, _hull(interval(samples[at] - samples[proxy_at]), wl + ph, wh + pl, m))
            else:
                moves[at] = Estimate(m, None)  # an optimum without a position: no interval
        reasons, tol = [], tolerance(dim)
        for o in optima:
            if o.flat:
                reasons.append(f"flat at {axis} {o.at}")
            elif o.edge:
                reasons.append(f"{'edge' if abs(o.edge) == 1 else 'gap'} at {axis} {o.at}")
        for at, move in moves.items():
            a_r = regret.get(at)
            rel = a_r[1] if a_r is not None else None
            if a_r is not None and math.isinf(a_r[0].value):
                reasons.append(f"diverges at {axis} {at}")
                continue
            regret_status = (
                _status(rel, -math.inf, MAX_REGRET)
                if rel is not None and math.isfinite(rel.value)
                else (PASS if a_r is not None and a_r[0].value == 0 else UNSURE)
            )
            located = by_at[at].located and by_at[proxy_at].located
            move_status = _status(move, -tol, tol) if located else UNSURE
            if regret_status == FAIL:
                reasons.append(f"regret at {axis} {at}")
            elif regret_status == PASS or move_status == PASS:
                continue
            elif move_status == FAIL:
                reasons.append(f"moved at {axis} {at}")
            else:
                reasons.append(f"uncertain at {axis} {at}")
        if len(optima) < 2:
            reasons.append(f"fewer than two {axis}s with results")
        hps[name] = HPVerdict(name, dim, optima, moves, not reasons, reasons, samples)
    return Verdict(parametrization, axis, proxy_at, hps, regret, n_counts)
