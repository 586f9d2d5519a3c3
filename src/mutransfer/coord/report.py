"""The coordinate check's verdict: each recorded quantity against the exponent µP predicts.

For each (module, quantity, step), every (width, seed) measurement is fitted by least squares
as log(value) = slope · log(width) + c, and the slope is compared with µP's prediction:

- activations and their changes since init are Θ(1): slope 0;
- a readout's output at init shrinks like fan_in^-½ (Table 3 inits the readout ∝ 1/fan_in;
  Table 8 multiplies it by 1/m): slope −½·γ, γ the growth exponent of its fan_in (1 when the
  fan_in is the width); its bias is left out of the measurement;
- attention logits at init shrink like d^-½ (µP scales q·kᵀ by 1/d and q, k are independent at
  init): slope −½·γ_d, γ_d the growth exponent of the head dim (0 when heads are added).

A curve fails when it grows *significantly* faster than predicted: slope − 2·SE > prediction +
limit, the limit being log(max_growth)/log(16) (1.5× per 16× width by default) and SE the slope's
standard error from the scatter over seeds and widths; or when a change since init *vanishes*
significantly (slope + 2·SE < −½: the kernel regime, or Adam's ε swamping shrinking gradients).
The bound keeps finite-width noise from failing a correct model, while the power laws of real
mistakes (attention left at 1/√d keeps its logits Θ(1) at init where µP's shrink like d^-½; a
readout in SP; unscaled lrs, slope ½ to 2) fail clearly. With one point per width (one seed,
two widths) SE is 0 and the slope itself is compared. A run whose loss became NaN/inf fails.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import asdict, dataclass, field

from .._core.depth import in_numbered_block

__all__ = ["ATTN_SUFFIX", "VANISHING_SLOPE", "CoordCheckResult", "PathLike", "Record", "Trend"]

PathLike = str | os.PathLike
VANISHING_SLOPE = -0.5
ATTN_SUFFIX = " [attn logits]"  # attention logits' changes start as O(1/√d) cross terms: no warning


@dataclass(frozen=True)
class Record:
    module: str
    quantity: str  # "size" (mean |h|) or "change" (mean |h − h at init|)
    step: int
    width: int  # the swept size: the width, or the depth in a check across depth
    seed: int
    value: float


@dataclass(frozen=True)
class Trend:
    """How one (module, quantity, step) scales with width."""

    module: str
    quantity: str
    step: int
    widths: tuple[int, ...]
    means: tuple[float, ...]
    slope: float
    slope_se: float  # standard error of the slope
    growth: float  # fitted growth factor from the smallest to the largest width
    passed: bool
    expected: float = 0.0  # the slope µP predicts (0: Θ(1); −½: shrinks like 1/√width at init)
    reason: str = ""  # why it failed: "grows" (faster than predicted), "vanishes", "diverged"

    def __str__(self) -> str:
        return (
            f"{self.module} {self.quantity} at step {self.step}: ×{self.growth:.3g} from "
            f"{self.widths[0]} to {self.widths[-1]} (slope {self.slope:+.2f} ± {self.slope_se:.2f}, "
            f"µP predicts {self.expected:+.2f})"
        )


def _fit_slope(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least-squares slope of log(value) on log(width) and its standard error; None when fewer
    than two widths have a positive value."""
    pts = [(math.log(w), math.log(v)) for w, v in points if v > 0 and math.isfinite(v)]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    if n <= 2:
        return slope, 0.0
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts) / (n - 2)
    return slope, math.sqrt(residual / sxx)


def _excess(t: Trend) -> float:
    """How far a trend lies outside the rule, in slope units (inf for diverged runs)."""
    if t.reason == "vanishes":
        return VANISHING_SLOPE - (t.slope + 2 * t.slope_se)
    return t.slope - 2 * t.slope_se - t.expected


def _in_numbered_block(module: str) -> bool:
    """A module inside a block: across depth its own change is 1/L of the stream's (depth-µP)."""
    name = module.replace(ATTN_SUFFIX, "")
    return in_numbered_block(name) or "last" in name.split(".")[:-1]


@dataclass
class CoordCheckResult:
    """Result of `mt.coord_check`: `.passed`, `.failures`, exports, `.plot(path)`, `print(result)`."""

    records: list[Record]
    widths: list[int]
    steps: int
    seeds: int
    optimizer: str
    lr: float
    max_growth: float = 1.5
    parametrization: str = ""
    diverged: list[tuple[int, int, int]] = field(default_factory=list)  # (width, seed, step)
    axis: str = "width"  # "depth": `widths` and Record.width hold depths, at `fixed_width`
    fixed_width: int | None = None
    expected: dict[str, float] = field(default_factory=dict)  # module → predicted slope of its size at init
    # modules fed attention probabilities: their early changes are cross terms, like the logits'
    attention_probs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.max_slope = math.log(self.max_growth) / math.log(16)
        self.trends = self._trends()

    @property
    def sizes(self) -> list[int]:
        """The sizes checked along `axis`: widths, or depths (at `fixed_width`) for a depth check.
        (`widths` holds the same list, under its first name.)"""
        return self.widths

    @property
    def depths(self) -> list[int] | None:
        """The depths of a depth check, else None."""
        return self.widths if self.axis == "depth" else None

    # ------------------------------------------------------------------ verdict

    def _trends(self) -> list[Trend]:
        grouped: dict[tuple[str, str, int], dict[int, list[float]]] = {}
        for r in self.records:
            grouped.setdefault((r.module, r.quantity, r.step), {}).setdefault(r.width, []).append(r.value)
        span = math.log(self.widths[-1] / self.widths[0])
        trends = []
        for (module, quantity, step), by_width in grouped.items():
            ws = sorted(by_width)
            means = [sum(by_width[w]) / len(by_width[w]) for w in ws]
            expected = self.expected.get(module, 0.0) if (quantity == "size" and step == 0) else 0.0
            if any(not math.isfinite(m) for m in means):
                trends.append(
                    Trend(
                        module,
                        quantity,
                        step,
                        tuple(ws),
                        tuple(means),
                        math.inf,
                        0.0,
                        math.inf,
                        False,
                        expected,
                        "diverged",
                    )
                )
                continue
            if len(ws) < 2 or max(means) <= 1e-30:
                continue  # exactly zero everywhere (e.g. a zero-initialized readout at step 0)
            fit = _fit_slope([(w, v) for w in ws for v in by_width[w]])
            if fit is None:
                continue
            slope, se = fit
            grows = slope - 2 * se > expected + self.max_slope
            vanishes = (
                quantity == "change"
                and step > 0
                and slope + 2 * se < VANISHING_SLOPE
                and not module.endswith(ATTN_SUFFIX)
                and module not in self.attention_probs
                and not (self.axis == "depth" and _in_numbered_block(module))
            )
            trends.append(
                Trend(
                    module,
                    quantity,
                    step,
                    tuple(ws),
                    tuple(means),
                    slope,
                    se,
                    math.exp(slope * span),
                    not (grows or vanishes),
                    expected,
                    "grows" if grows else "vanishes" if vanishes else "",
                )
            )
        return sorted(trends, key=lambda t: (t.module, t.quantity, t.step))

    @property
    def passed(self) -> bool:
        return not self.diverged and all(t.passed for t in self.trends)

    @property
    def failures(self) -> list[Trend]:
        """Every (module, quantity, step) that grows faster than µP predicts or whose change vanishes, worst first."""
        return sorted((t for t in self.trends if not t.passed), key=lambda t: -_excess(t))

    @property
    def warnings(self) -> list[Trend]:
        """Changes that seem to vanish with width (slope < −0.5) without significance."""
        return sorted(
            (
                t
                for t in self.trends
                if t.passed
                and t.quantity == "change"
                and t.step > 0
                and t.slope < VANISHING_SLOPE
                and not t.module.endswith(ATTN_SUFFIX)
                and not (self.axis == "depth" and _in_numbered_block(t.module))
            ),
            key=lambda t: t.slope,
        )

    def failing_modules(self) -> list[str]:
        """Modules with at least one failure, worst first."""
        seen: list[str] = []
        for t in self.failures:
            if t.module not in seen:
                seen.append(t.module)
        return seen

    # ------------------------------------------------------------------ tables

    def rows(self) -> list[dict]:
        """One row per (module, quantity, step, width): mean and spread over seeds, plus the verdict."""
        by_key = {(t.module, t.quantity, t.step): t for t in self.trends}
        grouped: dict[tuple, list[float]] = {}
        for r in self.records:
            grouped.setdefault((r.module, r.quantity, r.step, r.width), []).append(r.value)
        out = []
        for (module, quantity, step, width), vals in sorted(grouped.items()):
            mean = sum(vals) / len(vals)
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
            t = by_key.get((module, quantity, step))
            out.append(
                {
                    "module": module,
                    "quantity": quantity,
                    "step": step,
                    "width": width,
                    "mean": mean,
                    "std": std,
                    "slope": None if t is None else t.slope,
                    "slope_se": None if t is None else t.slope_se,
                    "growth": None if t is None else t.growth,
                    "passed": True if t is None else t.passed,
                    "expected": None if t is None else t.expected,
                }
            )
        return out

    def to_csv(self, path: PathLike) -> None:
        rows = self.rows()
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["module"])
            writer.writeheader()
            writer.writerows(rows)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "parametrization": self.parametrization,
            "axis": self.axis,
            "fixed_width": self.fixed_width,
            "sizes": self.sizes,
            "widths": self.widths,
            "optimizer": self.optimizer,
            "lr": self.lr,
            "steps": self.steps,
            "seeds": self.seeds,
            "max_growth": self.max_growth,
            "max_slope": self.max_slope,
            "expected": dict(self.expected),
            "diverged": [{"width": w, "seed": s, "step": t} for w, s, t in self.diverged],
            "failures": [asdict(t) for t in self.failures],
            "warnings": [asdict(t) for t in self.warnings],
            "rows": self.rows(),
        }

    def to_json(self, path: PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1, default=lambda x: None if x != x or abs(x) == math.inf else x)

    # ------------------------------------------------------------------ text

    def __str__(self) -> str:
        w0, w1 = self.widths[0], self.widths[-1]
        ax = self.axis
        where = f", width {self.fixed_width}" if self.fixed_width is not None else ""
        head = (
            f"Coordinate check ({self.parametrization}, {self.optimizer} lr={self.lr:g}, {ax}s "
            f"{', '.join(map(str, self.widths))}{where}, {self.steps} steps × {self.seeds} seeds): "
            f"{'PASS' if self.passed else 'FAIL'}"
        )
        rule = (
            f"rule: each curve's slope of log size vs log {ax} is compared with the exponent µP predicts "
            f"(0 for activations and their changes; −½ per doubling of fan_in or head dim for readout outputs "
            f"and attention logits at init): it fails when slope − 2·SE exceeds the prediction by more than "
            f"{self.max_slope:.3f} ({self.max_growth:g}× per 16× {ax}; over {w0}→{w1} ×"
            f"{(w1 / w0) ** self.max_slope:.2f}), or when a change vanishes (slope + 2·SE < {VANISHING_SLOPE})"
        )
        lines = [head, rule]
        if self.seeds * len(self.widths) <= 2:
            lines.append("note: one seed at two widths gives no estimate of noise; use ≥ 3 widths or ≥ 2 seeds")
        for w, s, t in self.diverged:
            lines.append(f"  diverged: {ax} {w}, seed {s}: loss not finite at step {t}")
        fails = self.failures
        if fails:
            lines.append(f"{len(fails)} of {len(self.trends)} curves break the rule; worst per module:")
            lines += self._table(self._worst_per_module(fails))
        else:
            worst = max(self.trends, key=_excess, default=None)
            if worst is not None:
                lines.append(f"all {len(self.trends)} curves within the rule; steepest: {worst}")
        if self.warnings:
            lines.append(
                f"{len(self.warnings)} changes shrink with {ax} (slope < {VANISHING_SLOPE}, not significant); "
                "µP keeps them Θ(1). Steepest:"
            )
            lines += self._table(self._worst_per_module(self.warnings, worst_is_low=True)[:5])
        return "\n".join(lines)

    @staticmethod
    def _worst_per_module(trends: list[Trend], worst_is_low: bool = False) -> list[Trend]:
        best: dict[str, Trend] = {}
        for t in trends:
            cur = best.get(t.module)
            if cur is None or (t.slope < cur.slope if worst_is_low else _excess(t) > _excess(cur)):
                best[t.module] = t
        return sorted(best.values(), key=lambda t: t.slope if worst_is_low else -_excess(t))

    def _table(self, trends: list[Trend]) -> list[str]:
        wm = max([len("module")] + [len(t.module) for t in trends])
        out = [f"  {'module':<{wm}}  {'quantity':<8}  {'step':>4}  {'growth':>9}  {'slope':>13}  {'µP':>5}  why"]
        for t in trends:
            growth = "inf" if t.growth == math.inf else f"×{t.growth:.3g}"
            slope = f"{t.slope:+.2f} ± {t.slope_se:.2f}"
            out.append(
                f"  {t.module:<{wm}}  {t.quantity:<8}  {t.step:>4}  {growth:>9}  {slope:>13}  "
                f"{t.expected:>+5.2f}  {t.reason}".rstrip()
            )
        return out

    # ------------------------------------------------------------------ plot

    def plot(self, path: PathLike, max_legend: int = 12) -> None:
        """Log-log curves of every module against width: one panel for the size at init, one per
        step for the change since init. Failing curves are drawn thick and named in the legend."""
        from .plot import plot_result

        plot_result(self, path, max_legend=max_legend)
