"""The coordinate check's verdict: each curve, over the run, against what µP predicts, with a test against noise.

What µP predicts, per role (the `expected` slope of log(value) against log(width)):

- activations and their changes since init are Θ(1) over training: slope 0;
- a readout's output at init shrinks like fan_in^-½ (Table 3 inits the readout ∝ 1/fan_in;
  Table 8 multiplies it by 1/m): slope −½·γ, γ the growth exponent of its fan_in (1 when the
  fan_in is the width); its bias is left out of the measurement;
- attention logits at init shrink like d^-½ (µP scales q·kᵀ by 1/d and q, k are independent at
  init): slope −½·γ_d, γ_d the growth exponent of the head dim (0 when heads are added).

The statistical model. Every (width, seed) pair is one independently initialized model, so its
measurements are one independent draw (the steps of one model are not: they share its init). For a
window of steps (one step, or the last half of the run for vanishing), each model contributes y =
the mean over the window of log(value); y is fitted by
least squares as slope · log(width) + c, and the slope's standard error SE comes from the residual
scatter of the n models about the line, with n − 2 degrees of freedom. A curve breaks the rule only
when a one-sided Student-t test at 97.5 % (critical value t₀.₉₇₅(n − 2), 12.7 at one residual
degree of freedom, 2.2 at ten) says so:

- *grows*: slope − t·SE > expected + limit, the limit being log(max_growth)/log(16) (1.5× per 16×
  width by default: the finite-width corrections µP leaves). Tested on the size at init (step 0,
  against the role's prediction above) and at every training step 1…T (against 0), the worst step
  reported: a mistake may show at one step only (SP under Muon: readout slope +0.90 at step 1, +0.2
  after), so growth is not averaged over steps;
- *vanishes*: a change since init with slope + t·SE < −½ over the *last half* of the run (steps
  ⌈T/2⌉+… T; at T = 1 step 1): the kernel regime, or Adam's ε swamping shrinking gradients. Not at
  the first step alone: there, changes that are cross terms of random init (a router's or a gate's
  first Adam step, attention probabilities' consumers, attention logits) shrink like 1/√width in
  correct µP, and become Θ(1) as training aligns them.

Why not a rule per step: with 3–5 steps × 2 quantities × every module, a per-step 2·SE rule made
dozens of correlated tests, read the curvature of 3 points as noise (SE 0.02 at one residual
degree of freedom) and applied "vanishing" where µP predicts noise. Measured on the MLP recipe under
Adam (lr 1e-2, 4 steps, widths 64/128/256, 1 seed, 2-core CPU): the per-step rule failed correct µP
(readout size at step 1, slope +0.18 ± 0.02); the seed-to-seed scatter of that slope is 0.13 (6
seeds), so one residual degree of freedom cannot tell +0.18 from 0. With two widths and one seed
(no residual) the slope itself is compared, and the report says there is no estimate of noise.

False-alarm rate and power, measured (2-core CPU; the script is in docs/coord_check.md, "False alarms"). The
MLP recipe, Adam lr 1e-2, 4 steps, widths 64/128/256, 10 independent draws each:

| seeds | setting | per-step 2·SE rule (before) | this test |
|---|---|---|---|
| 1 | correct µP | 8/10 pass (20 % false alarms) | 10/10 pass |
| 1 | SP | 0/10 pass | 1/10 pass (power 90 %: one residual degree of freedom) |
| 2 | correct µP | 8/10 pass (the factory seeded itself: one model twice) | 10/10 pass |
| 2 | SP | 0/10 pass | 0/10 pass |

On the zoo (``benchmarks/coord_power.py``: correct µP, SP and single mistakes, repeated with
independent draws) the pass rates are in docs/benchmarks.md. One seed at three widths is the weak
spot: the report says so and asks for two seeds. Identical models never count as independent
(`coord_check` re-seeds a factory that seeds itself, or counts copies once).

A run whose loss became NaN/inf fails.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace

from .._core.atomic import atomic_path
from .._core.depth import in_numbered_block

__all__ = ["ATTN_SUFFIX", "VANISHING_SLOPE", "CoordCheckResult", "PathLike", "Record", "Trend"]

PathLike = str | os.PathLike
VANISHING_SLOPE = -0.5
ATTN_SUFFIX = " [attn logits]"  # attention logits' changes start as O(1/√d) cross terms: no warning


@dataclass(frozen=True)
class Record:
    """One measurement: a module's activation size or change at one step, width and seed."""

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
    steps: tuple[int, ...] = ()  # the window of steps pooled (empty: the one step `step`)
    crit: float = 2.0  # the critical value the slope's SE is multiplied by (Student t at n − 2 dof)
    test: str = ""  # the test this trend is ("grows" or "vanishes"); "" for a per-step description

    @property
    def where(self) -> str:
        """'at step 3', 'at step 1 (the worst of steps 1–4)' or 'over steps 3–4'."""
        if len(self.steps) > 1 and self.test == "grows":
            return f"at step {self.step} (the worst of steps {self.steps[0]}–{self.steps[-1]})"
        if len(self.steps) > 1:
            return f"over steps {self.steps[0]}–{self.steps[-1]}"
        return f"at step {self.step}"

    def __str__(self) -> str:
        return (
            f"{self.module} {self.quantity} {self.where}: ×{self.growth:.3g} from "
            f"{self.widths[0]} to {self.widths[-1]} (slope {self.slope:+.2f} ± {self.slope_se:.2f}, "
            f"µP predicts {self.expected:+.2f})"
        )


# one-sided 97.5 % quantiles of Student's t, 1…30 degrees of freedom
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_critical(dof: int) -> float:
    """The one-sided 97.5 % quantile of Student's t with `dof` degrees of freedom (0 when dof < 1:
    no residual, no estimate of noise; above 30 dof, 1.96 + 2.4/dof, within 0.002 of the exact value)."""
    if dof < 1:
        return 0.0
    return _T975[dof - 1] if dof <= len(_T975) else 1.96 + 2.4 / dof


def _fit_log(points: list[tuple[float, float]]) -> tuple[float, float, int] | None:
    """Least-squares slope of y on x (x = log width, y = a log value), its standard error and the
    residual degrees of freedom; None when fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    if n <= 2:
        return slope, 0.0, 0
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in points) / (n - 2)
    return slope, math.sqrt(residual / sxx), n - 2


def _excess(t: Trend) -> float:
    """How far a trend lies outside the rule, in slope units (inf for diverged runs)."""
    if t.reason == "vanishes":
        return VANISHING_SLOPE - (t.slope + t.crit * t.slope_se)
    return t.slope - t.crit * t.slope_se - t.expected


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
    notes: list[str] = field(default_factory=list)  # what the check did that the user should know
    # modules whose change the parametrization's rules shrink like width^-½ (u-µP's embeddings): not held to Θ(1)
    slow_changes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.max_slope = math.log(self.max_growth) / math.log(16)
        self.step_trends: list[Trend] = []  # one per (module, quantity, step): what the plot and rows show
        self.trends = self._trends()  # the tests of the verdict: one per (module, quantity, window)

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

    def _exempt_from_vanishing(self, module: str) -> bool:
        """Changes that µP does not hold to Θ(1) at these steps: attention logits and their
        consumers (cross terms at first), and blocks across depth (1/L of the stream's)."""
        return (
            module.endswith(ATTN_SUFFIX)
            or module in self.attention_probs
            or module in self.slow_changes
            or (self.axis == "depth" and _in_numbered_block(module))
        )

    def _windows(self, quantity: str, steps: list[int]) -> list[tuple[str, tuple[int, ...]]]:
        """The tests a curve gets: (what is tested, the steps pooled)."""
        training = tuple(t for t in steps if t > 0)
        out: list[tuple[str, tuple[int, ...]]] = []
        if quantity != "change" and 0 in steps:
            out.append(("grows", (0,)))
        if training:
            out.append(("grows", training))
            if quantity == "change":
                out.append(("vanishes", training[len(training) // 2 :]))
        return out

    def _trend(self, module, quantity, kind, window, by_step, expected) -> Trend | None:
        """One test of one curve over a window of steps (see the module docstring)."""
        span = math.log(self.widths[-1] / self.widths[0])
        models: dict[tuple[int, int], list[float]] = {}
        for t in window:
            for (w, seed), v in by_step.get(t, {}).items():
                models.setdefault((w, seed), []).append(v)
        models = {k: vs for k, vs in models.items() if len(vs) == len(window)}
        by_width: dict[int, list[float]] = {}
        for (w, _), vs in models.items():
            by_width.setdefault(w, []).append(sum(vs) / len(vs))
        ws = sorted(by_width)
        means = tuple(sum(by_width[w]) / len(by_width[w]) for w in ws)
        step = window[0]
        if any(not math.isfinite(m) for m in means):
            return Trend(
                module, quantity, step, tuple(ws), means, math.inf, 0.0, math.inf, False, expected, "diverged",
                window, 0.0, kind,
            )  # fmt: skip
        if len(ws) < 2 or max(means) <= 1e-30:
            return None  # exactly zero everywhere (e.g. a zero-initialized readout at step 0)
        points = [(math.log(w), sum(math.log(v) for v in vs) / len(vs)) for (w, _), vs in models.items() if min(vs) > 0]
        fit = _fit_log(points)
        if fit is None:
            return None
        slope, se, dof = fit
        crit = t_critical(dof)
        if kind == "grows":
            failed = slope - crit * se > expected + self.max_slope
        else:
            failed = slope + crit * se < VANISHING_SLOPE and not self._exempt_from_vanishing(module)
        return Trend(
            module, quantity, step, tuple(ws), means, slope, se, math.exp(slope * span), not failed,
            expected, kind if failed else "", window, crit, kind,
        )  # fmt: skip

    def _trends(self) -> list[Trend]:
        grouped: dict[tuple[str, str], dict[int, dict[tuple[int, int], float]]] = {}
        for r in self.records:
            grouped.setdefault((r.module, r.quantity), {}).setdefault(r.step, {})[(r.width, r.seed)] = r.value
        trends: list[Trend] = []
        for (module, quantity), by_step in grouped.items():
            for kind, window in self._windows(quantity, sorted(by_step)):
                expected = self.expected.get(module, 0.0) if window == (0,) else 0.0
                if kind == "grows" and len(window) > 1:
                    # growth is tested at every step (a mistake may show at one step only, e.g. SP under
                    # Muon at step 1); the trend reported is the worst step of the window
                    steps = [self._trend(module, quantity, kind, (s,), by_step, expected) for s in window]
                    found = [x for x in steps if x is not None]
                    worst = max(found, key=_excess, default=None)
                    t = None if worst is None else replace(worst, steps=window)
                else:
                    t = self._trend(module, quantity, kind, window, by_step, expected)
                if t is not None:
                    trends.append(t)
        failed = {
            (t.module, t.quantity, s)
            for t in trends
            if not t.passed
            for s in (t.steps if t.test == "vanishes" else (t.step,))
        }
        self.step_trends = []
        for (module, quantity), by_step in grouped.items():
            for step in sorted(by_step):
                expected = self.expected.get(module, 0.0) if (quantity == "size" and step == 0) else 0.0
                t = self._trend(module, quantity, "grows", (step,), by_step, expected)
                if t is not None:
                    self.step_trends.append(
                        replace(t, passed=(module, quantity, step) not in failed, reason="", steps=(), test="")
                    )
        self.step_trends.sort(key=lambda t: (t.module, t.quantity, t.step))
        return sorted(trends, key=lambda t: (t.module, t.quantity, t.step, len(t.steps)))

    @property
    def passed(self) -> bool:
        """True when no run diverged and every trend is within what µP allows."""
        return not self.diverged and all(t.passed for t in self.trends)

    @property
    def failures(self) -> list[Trend]:
        """Every (module, quantity, step) that grows faster than µP predicts or whose change vanishes, worst first."""
        return sorted((t for t in self.trends if not t.passed), key=lambda t: -_excess(t))

    @property
    def warnings(self) -> list[Trend]:
        """Changes that seem to vanish with width over the last steps (slope < −0.5) without significance."""
        return sorted(
            (
                t
                for t in self.trends
                if t.passed
                and t.quantity == "change"
                and t.slope < VANISHING_SLOPE
                and t.test == "vanishes"
                and not self._exempt_from_vanishing(t.module)
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
        by_key = {(t.module, t.quantity, t.step): t for t in self.step_trends}
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
        """Write the records as CSV, one row per record.

        Args:
            path: the file to write.
        """
        rows = self.rows()
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["module"])
            writer.writeheader()
            writer.writerows(rows)

    def to_dict(self) -> dict:
        """The result as plain data: verdict, axis, trends and records (what `to_json` writes)."""
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
            "notes": list(self.notes),
            "slow_changes": list(self.slow_changes),
            "diverged": [{"width": w, "seed": s, "step": t} for w, s, t in self.diverged],
            "failures": [asdict(t) for t in self.failures],
            "warnings": [asdict(t) for t in self.warnings],
            "rows": self.rows(),
        }

    def to_json(self, path: PathLike) -> None:
        """Write `to_dict` as JSON (NaN and infinities as null).

        Args:
            path: the file to write.
        """
        with atomic_path(path) as tmp, open(tmp, "w") as f:
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
            f"rule: each curve's slope of log size vs log {ax} (at init and at every training step) is "
            f"compared with the exponent µP predicts (0 for activations and their changes; −½·γ for readout "
            f"outputs and attention logits at init, γ the growth exponent of their fan_in or head dim): it fails "
            f"when slope − t·SE exceeds the prediction by more than {self.max_slope:.3f} ({self.max_growth:g}× per "
            f"16× {ax}; over {w0}→{w1} ×{(w1 / w0) ** self.max_slope:.2f}), or when a change vanishes over the "
            f"last half of the steps (slope + t·SE < {VANISHING_SLOPE}); SE from the scatter of the "
            f"{len(self.widths)}×{self.seeds} independent models, t Student's at 97.5 %"
        )
        lines = [head, rule] + [f"note: {n}" for n in self.notes]
        if self.seeds * len(self.widths) <= 2:
            lines.append("note: one seed at two widths gives no estimate of noise; use ≥ 3 widths or ≥ 2 seeds")
        elif self.seeds == 1 and len(self.widths) == 3:
            lines.append(
                "note: one seed at three widths leaves one degree of freedom for noise (t = 12.7); use ≥ 2 seeds"
            )
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
        out = [f"  {'module':<{wm}}  {'quantity':<8}  {'step':>5}  {'growth':>9}  {'slope':>13}  {'µP':>5}  why"]
        for t in trends:
            growth = "inf" if t.growth == math.inf else f"×{t.growth:.3g}"
            slope = f"{t.slope:+.2f} ± {t.slope_se:.2f}"
            steps = f"{t.steps[0]}–{t.steps[-1]}" if len(t.steps) > 1 and t.test == "vanishes" else str(t.step)
            out.append(
                f"  {t.module:<{wm}}  {t.quantity:<8}  {steps:>5}  {growth:>9}  {slope:>13}  "
                f"{t.expected:>+5.2f}  {t.reason}".rstrip()
            )
        return out

    # ------------------------------------------------------------------ plot

    def plot(self, path: PathLike, max_legend: int = 12) -> None:
        """Log-log curves of every module against width: one panel for the size at init, one per
        step for the change since init. Failing curves are drawn thick and named in the legend."""
        from .plot import plot_result

        plot_result(self, path, max_legend=max_legend)
