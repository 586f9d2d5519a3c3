"""Hyperparameter search spaces: log-uniform, uniform and choice, with their grids."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["SPACE_KEYS", "Choice", "Dimension", "LogUniform", "Uniform", "dimension_from_dict"]


@dataclass(frozen=True)
class LogUniform:
    """Log-uniform on [low, high]; its grid is `grid` points evenly spaced in log2."""

    low: float
    high: float
    grid: int = 8

    def grid_points(self) -> list[float]:
        if self.grid == 1:
            return [math.sqrt(self.low * self.high)]
        a, b = math.log2(self.low), math.log2(self.high)
        return [2 ** (a + (b - a) * i / (self.grid - 1)) for i in range(self.grid)]


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float
    grid: int = 8

    def grid_points(self) -> list[float]:
        if self.grid == 1:
            return [(self.low + self.high) / 2]
        return [self.low + (self.high - self.low) * i / (self.grid - 1) for i in range(self.grid)]


@dataclass(frozen=True)
class Choice:
    values: tuple

    def grid_points(self) -> list[Any]:
        return list(self.values)


Dimension = LogUniform | Uniform | Choice
SPACE_KEYS = {"type", "low", "high", "grid", "values"}


def _number(name: str, key: str, value) -> float:
    if isinstance(value, str):  # "2**-10" and "1e-3" are convenient in TOML
        text = value.replace(" ", "")
        try:
            if "**" in text:
                base, exp = text.split("**", 1)
                return float(base) ** float(exp)
            return float(text)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"space.{name}.{key} must be a number, got {value!r}")
    return float(value)


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
        _check_distinct(name, values)
        return Choice(tuple(values))
    if kind not in ("log", "uniform"):
        raise ConfigError(f'space.{name}.type must be "log", "uniform" or "choice", got {kind!r}')
    for key in ("low", "high"):
        if key not in spec:
            raise ConfigError(f"space.{name}.{key} is missing")
    low, high = _number(name, "low", spec["low"]), _number(name, "high", spec["high"])
    grid = spec.get("grid", 8)
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ConfigError(f"space.{name}.grid must be a positive integer, got {grid!r}")
    if not low < high:
        raise ConfigError(f"space.{name}: low ({low:g}) must be less than high ({high:g})")
    if kind == "log":
        if low <= 0:
            raise ConfigError(f"space.{name}: a log range needs low > 0, got {low:g}")
        return LogUniform(low, high, grid)
    return Uniform(low, high, grid)


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
