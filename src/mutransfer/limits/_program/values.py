"""What flows along the graph besides width tensors (`Field`s): values computed from the inputs
alone, once per side (`Pair`), constants; and the small helpers on them the rules share."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from .._fields import Field, Layout

__all__ = ["Pair", "acc", "common_layout", "has", "ratio", "scalar", "side"]


@dataclass
class Pair:
    """A value computed from the inputs alone, once per side (x1 chunk, x2)."""

    a: Any
    b: Any


def side(v: Any, s: int) -> Any:
    """`v` with every `Pair` in it replaced by its side `s` (0: x1, 1: x2)."""
    if isinstance(v, Pair):
        return v.a if s == 0 else v.b
    if isinstance(v, (list, tuple)):
        return type(v)(side(u, s) for u in v)
    if isinstance(v, dict):
        return {k: side(u, s) for k, u in v.items()}
    if isinstance(v, slice):
        return slice(side(v.start, s), side(v.stop, s), side(v.step, s))
    return v


def has(v: Any, cls: type | tuple[type, ...]) -> bool:
    """Whether `v` (or anything in its lists, tuples, dicts and slices) is a `cls`."""
    if isinstance(v, cls):
        return True
    if isinstance(v, (list, tuple)):
        return any(has(u, cls) for u in v)
    if isinstance(v, dict):
        return any(has(u, cls) for u in v.values())
    if isinstance(v, slice):
        return any(has(u, cls) for u in (v.start, v.stop, v.step))
    return False


def scalar(v: Any) -> float | None:
    """`v` as a float if it is a number or a 0-d tensor without gradient, else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.requires_grad and v.ndim == 0:
        return float(v)
    return None


def ratio(combo: tuple, ref: tuple) -> float | None:
    """λ if the Gaussian combination `combo` is λ·`ref` (same layer outputs, proportional weights)."""
    d, r = dict(combo), dict(ref)
    if set(d) != set(r):
        return None
    lam = [d[j] / r[j] for j in d]
    return lam[0] if max(lam) - min(lam) <= 1e-12 * max(1.0, abs(max(lam))) else None


def common_layout(*fields: Field) -> Layout:
    """Where branches meet, the diagonal unless every branch kept the full spatial kernel (a branch
    that some other consumer needed in full may have it; the others need not)."""
    return replace(fields[0].layout, full=all(f.layout.full for f in fields))


def acc(total: Any, v: Any, w: float) -> Any:
    """total + w·v, out of place (v may be a stored kernel); `total` 0.0 means empty."""
    if isinstance(v, float) and v == 0.0:
        return total
    if isinstance(total, float):
        return v if w == 1.0 else v * w
    return total + (v if w == 1.0 else v * w)
