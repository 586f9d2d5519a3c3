"""Hyperparameter search spaces: log-uniform, uniform and choice, with their grids (and the
`default` the independent sampler holds a hyperparameter at while it sweeps the others)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

__all__ = ["SPACE_KEYS", "Choice", "Dimension", "LogUniform", "Uniform", "default_value", "dimension_from_dict"]


@dataclass(frozen=True)
class LogUniform:
    """Log-uniform on [low, high]; its grid is `grid` points evenly spaced in log2."""

    low: float
    high: float
    grid: int = 8
    default: float | None = None  # None: the grid point nearest the range's log-centre (`default_value`)

    def grid_points(self) -> list[float]:
        if self.grid == 1:
            return [math.sqrt(self.low * self.high)]
        a, b = math.log2(self.low), math.log2(self.high)
        inner = [2 ** (a + (b - a) * i / (self.grid - 1)) for i in range(1, self.grid - 1)]
        # the ends exactly as written: 2**log2(0.1) is 0.10000000000000005, outside Optuna's range
        return [self.low, *(min(max(v, self.low), self.high) for v in inner), self.high]


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float
    grid: int = 8
    default: float | None = None  # None: the grid point nearest the range's middle

    def grid_points(self) -> list[float]:
        if self.grid == 1:
            return [(self.low + self.high) / 2]
        inner = [self.low + (self.high - self.low) * i / (self.grid - 1) for i in range(1, self.grid - 1)]
        return [self.low, *(min(max(v, self.low), self.high) for v in inner), self.high]


@dataclass(frozen=True)
class Choice:
    values: tuple
    default: Any = None  # None: the first value

    def grid_points(self) -> list[Any]:
        return list(self.values)


Dimension = LogUniform | Uniform | Choice
SPACE_KEYS = {"type", "low", "high", "grid", "values", "default"}


def default_value(dim: Dimension) -> Any:
    """The value the independent sampler holds `dim` at while it sweeps other hyperparameters: its
    ``default`` when given; else a choice's first value, or the grid point nearest the range's centre
    (in log2 for a log range)."""
    if dim.default is not None:
        return dim.default
    points = dim.grid_points()
    if isinstance(dim, Choice):
        return points[0]
    if isinstance(dim, LogUniform):
        centre = (math.log2(dim.low) + math.log2(dim.high)) / 2
        return min(points, key=lambda v: abs(math.log2(v) - centre))
    return min(points, key=lambda v: abs(v - (dim.low + dim.high) / 2))


MAX_GRID = 1_000_000  # grid points per study: a grid sweep enqueues them all up front


def _number(name: str, key: str, value) -> float:
    """A range end as a finite float ("2**-10" and "1e-3" are read as numbers); ConfigError naming
    ``space.NAME.KEY`` for anything else, infinite, NaN, or too large for a float ("10**400")."""
    number: float | None = None
    if isinstance(value, str):  # "2**-10" and "1e-3" are convenient in TOML
        text = value.replace(" ", "")
        try:
            if "**" in text:
                base, exp = text.split("**", 1)
                number = float(base) ** float(exp)
            else:
                number = float(text)
        except ValueError:
            pass
        except OverflowError:
            number = math.inf
    elif not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int beyond a float's range
            number = math.inf
    if number is None or isinstance(number, complex):  # (-8) ** 0.5 is complex
        raise ConfigError(f"space.{name}.{key} must be a number, got {_short(value)}")
    if not math.isfinite(number):
        raise ConfigError(
            f"space.{name}.{key} must be a finite number (at most about 1.8e308), got {_short(value)}; "
            "give the range's end as a finite number"
        )
    return number


def _short(value) -> str:
    """repr(value), cut to 80 characters for a message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def dimension_from_dict(name: str, spec: dict) -> Dimension:
    """Parse one entry of the config's [space] table, naming the key at fault on error."""
    if not isinstance(spec, dict):
        raise ConfigError(f'space.{name} must be a table with type = "log" | "uniform" | "choice"')
    unknown = set(spec) - SPACE_KEYS
    if unknown:
        raise ConfigError(
            f"space.{name}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(SPACE_KEYS))}"
        )
    kind = spec.get("type", "log")
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"space.{name}.values must be a non-empty list")
        for v in values:
            if isinstance(v, float) and math.isnan(v):
                raise ConfigError(f"space.{name}.values holds nan, which equals no value (not even itself); remove it")
        _check_distinct(name, values)
        default = spec.get("default")
        if default is not None and default not in values:
            raise ConfigError(f"space.{name}.default must be one of its values {values!r}, got {_short(default)}")
        return Choice(tuple(values), default)
    if kind not in ("log", "uniform"):
        raise ConfigError(f'space.{name}.type must be "log", "uniform" or "choice", got {kind!r}')
    for key in ("low", "high"):
        if key not in spec:
            raise ConfigError(f"space.{name}.{key} is missing")
    low, high = _number(name, "low", spec["low"]), _number(name, "high", spec["high"])
    grid = spec.get("grid", 8)
    if isinstance(grid, bool) or not isinstance(grid, int) or not 1 <= grid <= MAX_GRID:
        raise ConfigError(f"space.{name}.grid must be an integer from 1 to {MAX_GRID:,}, got {_short(grid)}")
    if not low < high:
        raise ConfigError(f"space.{name}: low ({low:g}) must be less than high ({high:g})")
    if not math.isfinite(high - low):
        raise ConfigError(f"space.{name}: the range {low:g} … {high:g} is wider than a float holds; narrow it")
    default = None
    if "default" in spec:
        default = _number(name, "default", spec["default"])
        if not low <= default <= high:
            raise ConfigError(
                f"space.{name}.default ({default:g}) must lie in the range {low:g} … {high:g}; widen the range or move it"
            )
    if kind == "log":
        if low <= 0:
            raise ConfigError(f"space.{name}: a log range needs low > 0, got {low:g}")
        return LogUniform(low, high, grid, default)
    return Uniform(low, high, grid, default)


def _check_distinct(name: str, values: list) -> None:
    """Each choice once: a repeated value (1 and 1.0, true and 1 count as the same, as in Python)
    would be one grid point for Optuna but two for the sweep's count, which then never finishes."""
    for i, a in enumerate(values):
        for b in values[:i]:
            if a == b:
                ta, tb = _toml(a), _toml(b)
                same = (
                    ""
                    if type(a) is type(b)
                    else (f' ({tb} == {ta} in Python; if both are meant, write them as strings: "{tb}", "{ta}")')
                )
                raise ConfigError(
                    f"space.{name}.values has duplicates: {tb} and {ta} are the same choice{same}; list each value once"
                )


def _toml(value) -> str:
    """A value as written in TOML (true, "a", 1.5), for messages."""
    return json.dumps(value, default=repr)
