"""Gauss–Hermite expectations over 1-D and 2-D centred Gaussians, batched, in float64."""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .activations import Fn

# Elements of the (pairs × nodes²) work array per chunk: ~128 MB in float64.
_CHUNK_ELEMENTS = 16_000_000
MAX_ORDER = 200  # numpy's Hermite weights overflow beyond a few hundred nodes


@lru_cache(maxsize=16)
def nodes(order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilists' Gauss–Hermite nodes and weights normalised to a standard normal."""
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise ValueError(f"quad_order must be an integer in [1, {MAX_ORDER}], got {order!r}")
    z, w = np.polynomial.hermite_e.hermegauss(order)
    return torch.tensor(z, dtype=torch.float64), torch.tensor(w / math.sqrt(2 * math.pi), dtype=torch.float64)


def expect_1d(f: Fn, var: torch.Tensor, order: int) -> torch.Tensor:
    """E[f(u)] for u ~ N(0, var), elementwise over `var`."""
    z, w = nodes(order)
    u = torch.sqrt(var.clamp_min(0)).unsqueeze(-1) * z
    return (f(u) * w).sum(-1)


def expect_2d(f: Fn, g: Fn, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, order: int) -> torch.Tensor:
    """E[f(u) g(v)] for (u, v) ~ N(0, [[a, c], [c, b]]), elementwise over same-shape a, b, c."""
    z, w = nodes(order)
    shape = c.shape
    a, b, c = (t.reshape(-1) for t in torch.broadcast_tensors(a, b, c))
    out = torch.empty_like(c)
    ww = (w[:, None] * w[None, :]).reshape(-1)
    z1 = z[:, None].expand(order, order).reshape(-1)
    z2 = z[None, :].expand(order, order).reshape(-1)
    step = max(1, _CHUNK_ELEMENTS // (order * order))
    for s in range(0, c.numel(), step):
        ai, bi, ci = a[s:s + step, None], b[s:s + step, None], c[s:s + step, None]
        sa, sb = torch.sqrt(ai.clamp_min(0)), torch.sqrt(bi.clamp_min(0))
        rho = torch.where(sa * sb > 0, ci / (sa * sb).clamp_min(1e-300), torch.zeros_like(ci)).clamp(-1, 1)
        u = sa * z1
        v = sb * (rho * z1 + torch.sqrt(1 - rho * rho) * z2)
        out[s:s + step] = (f(u) * g(v) * ww).sum(-1)
    return out.reshape(shape)
