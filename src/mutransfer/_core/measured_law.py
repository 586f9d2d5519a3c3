"""A power law of an optimal hyperparameter measured on a proxy sweep (`mt.MeasuredLaw`).

`mt.sweep.fit_measured_laws` fits log2 h* = a + b·log2 x (h = lr or weight decay, x = batch size or
training steps) to the located optima of a sweep's extra axes, with a bootstrap interval on b, and
checks the fit on the largest measured x, left out of it. `transfer_hparams(measured=)` applies a
law only when that check passed, and only within a decade of the measured range unless asked
(`extrapolate=True`). The law lives in the core because `transfer_hparams` reads it; the fit, which
needs the sweep's trials, lives in `sweep/hparam_fits`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import HParamTransferError, MuPWarning
from .scale import Scale

__all__ = [
    "DECADE",
    "MEASURED_AXES",
    "MEASURED_HPARAMS",
    "MEASURED_SOURCE",
    "MeasuredLaw",
    "MeasuredStep",
    "beyond_range",
    "check_measured",
]

MEASURED_SOURCE = "measured on this sweep"  # the `AppliedRule.source` of a step taken from a sweep's own runs
MEASURED_HPARAMS = {"lr": "η", "weight_decay": "λ"}
MEASURED_AXES = {"batch_size": "B", "steps": "S"}
DECADE = 10.0  # how far past the measured range a law may be applied without extrapolate=True


@dataclass(frozen=True)
class MeasuredLaw:
    """A measured power law h*(x) ∝ x^exponent of an optimal hyperparameter along one axis.

    Made by `mt.sweep.fit_measured_laws`; read by `mt.transfer_hparams(measured=...)`.

    Attributes:
        hparam: "lr" or "weight_decay".
        axis: "batch_size" or "steps" (training steps at the proxy's batch size).
        exponent: the fitted b of log2 h* = a + b·log2 x (least squares on the located optima).
        exponent_interval: b's bootstrap interval over seeds (the fit redone on resampled optima).
        reference: an axis value (the sweep's proxy value, the smallest measured).
        value_at_reference: the fitted h* at `reference`.
        fit_range: (smallest, largest) axis value in the fit.
        held_out: the largest measured axis value, left out of the fit.
        held_out_optimum: the optimum located there.
        prediction_interval: the fit's interval for h* at `held_out` (bootstrap of the fit and the
            held-out optimum's own interval, combined in quadrature).
        validated: whether `held_out_optimum` lies inside `prediction_interval`.
        n_points: the number of optima in the fit (the held-out one not counted).
    """

    hparam: str
    axis: str
    exponent: float
    exponent_interval: tuple[float, float]
    reference: float
    value_at_reference: float
    fit_range: tuple[float, float]
    held_out: float
    held_out_optimum: float
    prediction_interval: tuple[float, float]
    validated: bool
    n_points: int

    def __post_init__(self) -> None:
        if self.hparam not in MEASURED_HPARAMS:
            raise HParamTransferError(
                f"MeasuredLaw.hparam must be one of {', '.join(MEASURED_HPARAMS)}, got {self.hparam!r}"
            )
        if self.axis not in MEASURED_AXES:
            raise HParamTransferError(f"MeasuredLaw.axis must be one of {', '.join(MEASURED_AXES)}, got {self.axis!r}")
        numbers = [self.exponent, *self.exponent_interval]
        positive = [self.reference, self.value_at_reference, *self.fit_range, self.held_out, self.held_out_optimum]
        positive += list(self.prediction_interval)
        if not all(_finite(v) for v in numbers) or not all(_finite(v) and v > 0 for v in positive):
            raise HParamTransferError(
                f"MeasuredLaw for {self.hparam} along {self.axis}: every number must be finite (axis values and "
                "hyperparameter values positive); build it with mt.sweep.fit_measured_laws"
            )

    @property
    def measured_range(self) -> tuple[float, float]:
        """(smallest, largest) axis value measured, the held-out one included."""
        return min(self.fit_range[0], self.held_out), max(self.fit_range[1], self.held_out)

    @property
    def formula(self) -> str:
        """The law in words, e.g. "η ∝ B^0.43 [0.31, 0.55]"."""
        lo, hi = self.exponent_interval
        h, x = MEASURED_HPARAMS[self.hparam], MEASURED_AXES[self.axis]
        return f"{h} ∝ {x}^{self.exponent:.2f} [{lo:.2f}, {hi:.2f}]"

    @property
    def check(self) -> str:
        """The fit and its held-out check in words."""
        x = MEASURED_AXES[self.axis]
        lo, hi = self.prediction_interval
        where = "inside" if self.validated else "outside"
        return (
            f"fit on {x} = {_fmt(self.fit_range[0])}…{_fmt(self.fit_range[1])} ({self.n_points} optima), held-out "
            f"{x} = {_fmt(self.held_out)}: measured {_fmt(self.held_out_optimum)} {where} its interval "
            f"[{_fmt(lo)}, {_fmt(hi)}]"
        )

    def predict(self, x: float) -> float:
        """The law's h* at axis value `x`."""
        return self.value_at_reference * (x / self.reference) ** self.exponent

    def as_dict(self) -> dict[str, Any]:
        """The law as plain data (for JSON)."""
        return {
            "hparam": self.hparam,
            "axis": self.axis,
            "exponent": self.exponent,
            "exponent_interval": list(self.exponent_interval),
            "reference": self.reference,
            "value_at_reference": self.value_at_reference,
            "fit_range": list(self.fit_range),
            "held_out": self.held_out,
            "held_out_optimum": self.held_out_optimum,
            "prediction_interval": list(self.prediction_interval),
            "validated": self.validated,
            "n_points": self.n_points,
        }

    def __str__(self) -> str:
        return f"{self.hparam} along {self.axis}: {self.formula}, {self.check}"


def beyond_range(law: MeasuredLaw, x: float) -> float:
    """How many times `x` lies beyond the law's measured range (1.0 inside it)."""
    lo, hi = law.measured_range
    return max(1.0, x / hi, lo / x)


Laws = dict[tuple[str, str], "MeasuredLaw | str"]


def check_measured(measured: Any) -> Laws:
    """`transfer_hparams`' `measured=`: {(hparam, axis): law or the reason there is none}."""
    if measured is None:
        return {}
    out: Laws = {}
    if isinstance(measured, Mapping):
        for hparam, by_axis in measured.items():
            if not isinstance(by_axis, Mapping):
                raise TypeError(
                    f"measured[{hparam!r}] must be a dict {{axis: MeasuredLaw or reason}} (what "
                    f"mt.sweep.fit_measured_laws returns), got {by_axis!r}"
                )
            for axis, law in by_axis.items():
                if not isinstance(law, (MeasuredLaw, str)):
                    raise TypeError(f"measured[{hparam!r}][{axis!r}] must be a MeasuredLaw or a reason, got {law!r}")
                if isinstance(law, MeasuredLaw) and (law.hparam, law.axis) != (hparam, axis):
                    raise HParamTransferError(
                        f"measured[{hparam!r}][{axis!r}] holds the law of {law.hparam} along {law.axis}: "
                        "pass what mt.sweep.fit_measured_laws returns unchanged"
                    )
                out[(hparam, axis)] = law
        return out
    if isinstance(measured, (str, bytes)) or not isinstance(measured, Iterable):
        raise TypeError(
            f"measured must be what mt.sweep.fit_measured_laws returns or a list of MeasuredLaw, got {measured!r}"
        )
    for law in measured:
        if not isinstance(law, MeasuredLaw):
            raise TypeError(f"measured must hold MeasuredLaw objects, got {law!r}")
        if (law.hparam, law.axis) in out:
            raise HParamTransferError(
                f"measured holds two laws of {law.hparam} along {law.axis}: pass one (the sweep's fit)"
            )
        out[(law.hparam, law.axis)] = law
    return out


class MeasuredStep:
    """Which measured law `transfer_hparams` applies at a step, and what it gives."""

    def __init__(self, laws: Laws, proxy: Scale, target: Scale, extrapolate: bool) -> None:
        self.laws, self.extrapolate = laws, extrapolate
        bp, bt, dp, dt = proxy.batch_size, target.batch_size, proxy.tokens, target.tokens
        self.batch = (bp, bt) if bp is not None and bt is not None else None
        self.steps_ratio: float | None = None  # target steps / proxy steps
        if dp is not None and dt is not None:
            self.steps_ratio = (dt / dp) / (bt / bp) if self.batch is not None and bp and bt else dt / dp

    def law(self, hparam: str, axis: str, explicit: bool = False) -> tuple[MeasuredLaw | None, str]:
        """The validated law to apply, or None and why the measurement is not used ("" if none)."""
        entry = self.laws.get((hparam, axis))
        name = f"{MEASURED_HPARAMS[hparam]}*({MEASURED_AXES[axis]})"
        if entry is None:
            return None, ""
        if isinstance(entry, str):
            return None, f"measured {name} not used: {entry}"
        if explicit:
            return None, f"measured {entry.formula} not used: rules= chooses the rule"
        if not entry.validated:
            return None, f"measured {entry.formula} not used: it failed its held-out check ({entry.check})"
        return entry, ""

    def weight_decay_laws(self, explicit: bool) -> tuple[list[tuple[MeasuredLaw, str]], str]:
        """The λ laws replacing the τ rule — one for every axis that changes — or why not."""
        if not any(h == "weight_decay" for h, _ in self.laws):
            return [], ""
        changes = []
        if self.batch is not None and self.batch[0] != self.batch[1]:
            changes.append(("batch_size", "batch"))
        if self.steps_ratio not in (None, 1.0):
            changes.append(("steps", "horizon"))
        if not changes:
            return [], ""
        out = []
        for axis, what in changes:
            law, why = self.law("weight_decay", axis, explicit)
            if law is None:
                name = f"λ*({MEASURED_AXES[axis]})"
                return [], why or f"measured λ laws not used: {name} was not measured and {what} changes"
            out.append((law, what))
        return out, ""

    def apply(self, law: MeasuredLaw, value: float) -> tuple[float, str, tuple[float, float]]:
        """The value the law gives from the proxy's, the regime's words and the value's interval (the law's
        exponent interval over the same ratio); refuses past a decade."""
        x = MEASURED_AXES[law.axis]
        if law.axis == "batch_size":
            assert self.batch is not None  # only called when the batch size changes
            x_p, x_t = float(self.batch[0]), float(self.batch[1])
            where = f"target.batch_size {_fmt(x_t)}"
        else:
            assert self.steps_ratio is not None  # only called when the horizon changes
            x_p, x_t = law.reference, law.reference * self.steps_ratio
            where = (
                f"the target's horizon ≈ {_fmt(x_t)} steps (tokens ÷ batch size ×{_fmt(self.steps_ratio)} from the "
                f"proxy, taken at the sweep's proxy horizon S = {_fmt(law.reference)})"
            )
        lo, hi = law.measured_range
        factor = max(beyond_range(law, x_t), beyond_range(law, x_p))
        regime = f"{x} {_fmt(x_p)} → {_fmt(x_t)}; {law.check}"
        if factor > DECADE:
            text = (
                f"{where} is {factor:.3g}× beyond the measured range {x} = {_fmt(lo)}…{_fmt(hi)} of the measured "
                f"{law.formula} ({law.hparam})"
            )
            if not self.extrapolate:
                raise HParamTransferError(
                    f"{text}: a measured law is trusted to one decade past its range; measure {law.axis} closer "
                    "to the target, or pass extrapolate=True (mutransfer transfer --extrapolate) to apply it anyway"
                )
            warnings.warn(f"transfer_hparams: extrapolating: {text}", MuPWarning, stacklevel=5)
            regime += f"; extrapolated {factor:.3g}× beyond the measured range (extrapolate=True)"
        ratio = x_t / x_p
        ends = sorted(value * ratio**b for b in law.exponent_interval)
        regime += (
            f"; at {x} = {_fmt(x_t)} the exponent's interval gives {law.hparam} ∈ [{_fmt(ends[0])}, {_fmt(ends[1])}]"
        )
        return value * ratio**law.exponent, regime, (ends[0], ends[1])


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _fmt(v: float) -> str:
    return f"{v:.4g}"
