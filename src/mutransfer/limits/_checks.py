"""Argument checks shared by the limits: an integer with a lower bound, a positive finite number.
Both name the argument; a wrong type is a TypeError, a wrong value a ValueError."""

from __future__ import annotations

import math
import numbers


def integer(value, name: str, low: int = 1, hint: str = "") -> int:
    """`value` as an int ≥ `low` (Python or numpy integers; not bool); `hint` ends the ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer ≥ {low}, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an integer ≥ {low}, got {value!r}{hint}")
    return int(value)


def positive(value, name: str) -> float:
    """`value` as a positive finite float (any real number type; not bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive finite number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and float(value) > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
