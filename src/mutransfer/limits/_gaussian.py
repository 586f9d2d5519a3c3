"""Expectations over centred Gaussians in float64: 1-D Gauss–Hermite, and the 2-D moments
E[f(u) g(v)] that the kernel recursions need, for whole matrices at once.

E[f(u) g(v)] with Var u = a, Var v = b, corr ρ is computed two ways:

- Mehler's series (default): with ĉ_k(a) = E[f(√a z) He_k(z)]/√k! (1-D quadrature, once per
  input), E[f(u) g(v)] = Σ_k ĉ_k^f(a) ĉ_k^g(b) ρ^k — a few hundred (n1 × n2) multiply-adds,
  accurate to ~1e-10 for smooth functions (analytic ones: erf, tanh, gelu, their derivatives);
- 2-D tensor Gauss–Hermite quadrature, the fallback when the Hermite coefficients do not decay
  (kinks and jumps: relu by quadrature, its step derivative), good to ~1e-3 there.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from ._activations import Fn

__all__ = [
    "MAX_ORDER",
    "converged",
    "expect_1d",
    "expect_2d",
    "hermite_coefficients",
    "mehler",
    "nodes",
    "weighted_hermite",
]

# Elements of the (pairs × nodes²) work array per chunk: ~128 MB in float64.
_CHUNK_ELEMENTS = 16_000_000
MAX_ORDER = 400


@lru_cache(maxsize=16)
def nodes(order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilists' Gauss–Hermite nodes and weights for a standard normal.

    Nodes: eigenvalues of the Jacobi matrix (Golub–Welsch). Weights: w_j = 1/(n·h_{n−1}(z_j)²)
    with h_k = He_k/√k!, evaluated by the three-term recurrence in log scale, so that the tiny
    weights of the outer nodes are accurate (eigenvector-based weights are not, and high-degree
    Hermite moments need them)."""
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise ValueError(f"quad_order must be an integer in [1, {MAX_ORDER}], got {order!r}")
    off = torch.sqrt(torch.arange(1, order, dtype=torch.float64))
    z = torch.linalg.eigvalsh(torch.diag(off, 1) + torch.diag(off, -1))
    prev, cur = torch.zeros_like(z), torch.ones_like(z)  # h_{-1}, h_0
    log_scale = torch.zeros_like(z)
    for k in range(order - 1):
        prev, cur = cur, (z * cur - math.sqrt(k) * prev) / math.sqrt(k + 1)
        big = cur.abs() > 1e100
        prev, cur = torch.where(big, prev / 1e100, prev), torch.where(big, cur / 1e100, cur)
        log_scale = log_scale + big.to(z.dtype) * math.log(1e100)
    log_w = -math.log(order) - 2 * (torch.log(cur.abs()) + log_scale)
    w = torch.exp(log_w - log_w.max())
    return z, w / w.sum()


def _nodes_on(order: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`nodes(order)` (computed on the CPU: eigvalsh of a tiny matrix) moved to `device`."""
    z, w = nodes(order)
    return z.to(device), w.to(device)


def expect_1d(f: Fn, var: torch.Tensor, order: int) -> torch.Tensor:
    """E[f(u)] for u ~ N(0, var), elementwise over `var`."""
    z, w = _nodes_on(order, var.device)
    u = torch.sqrt(var.clamp_min(0)).unsqueeze(-1) * z
    return (f(u) * w).sum(-1)


@lru_cache(maxsize=16)
def weighted_hermite(order: int, terms: int) -> torch.Tensor:
    """√w_j · He_k(z_j)/√k! at the `order` nodes, (terms, order). The √w factor rides along the
    three-term recurrence (it is linear), so nothing overflows at high orders."""
    z, w = nodes(order)
    h = torch.empty(terms, order, dtype=torch.float64)
    h[0] = torch.sqrt(w)
    if terms > 1:
        h[1] = z * h[0]
    for k in range(1, terms - 1):
        h[k + 1] = (z * h[k] - math.sqrt(k) * h[k - 1]) / math.sqrt(k + 1)
    return h


def hermite_coefficients(f: Fn, var: torch.Tensor, terms: int, order: int = MAX_ORDER) -> torch.Tensor:
    """ĉ_k = E[f(√var z) He_k(z)]/√k! for every entry of the vector `var`, (n, terms)."""
    z, w = _nodes_on(order, var.device)
    vals = f(torch.sqrt(var.clamp_min(0))[:, None] * z)
    return (vals * torch.sqrt(w)) @ weighted_hermite(order, terms).to(var.device).T


def converged(coeffs: torch.Tensor, tol: float = 1e-4) -> bool:
    """Do the Hermite coefficients decay (the last tenth below `tol` × the norm)? The series' error
    is about the square of the tail (≲1e-7 relative at the default); kinks fail this."""
    tail = coeffs[:, -max(2, coeffs.shape[1] // 10) :].abs().amax(1)
    norm = coeffs.norm(dim=1).clamp_min(1e-300)
    return bool((tail <= tol * norm).all())


def mehler(ca: torch.Tensor, cb: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """Σ_k ca[i, k] cb[j, k] ρ[i, j]^k by Horner's rule, (n1, n2)."""
    out = torch.zeros_like(rho)
    for k in range(ca.shape[1] - 1, -1, -1):
        out.mul_(rho).add_(ca[:, k, None] * cb[None, :, k])
    return out


def expect_2d(f: Fn, g: Fn, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, order: int) -> torch.Tensor:
    """E[f(u) g(v)] for (u, v) ~ N(0, [[a, c], [c, b]]), elementwise over same-shape a, b, c."""
    z, w = _nodes_on(order, c.device)
    shape = c.shape
    a, b, c = (t.reshape(-1) for t in torch.broadcast_tensors(a, b, c))
    out = torch.empty_like(c)
    ww = (w[:, None] * w[None, :]).reshape(-1)
    z1 = z[:, None].expand(order, order).reshape(-1)
    z2 = z[None, :].expand(order, order).reshape(-1)
    step = max(1, _CHUNK_ELEMENTS // (order * order))
    for s in range(0, c.numel(), step):
        ai, bi, ci = a[s : s + step, None], b[s : s + step, None], c[s : s + step, None]
        sa, sb = torch.sqrt(ai.clamp_min(0)), torch.sqrt(bi.clamp_min(0))
        rho = torch.where(sa * sb > 0, ci / (sa * sb).clamp_min(1e-300), torch.zeros_like(ci)).clamp(-1, 1)
        u = sa * z1
        v = sb * (rho * z1 + torch.sqrt(1 - rho * rho) * z2)
        out[s : s + step] = (f(u) * g(v) * ww).sum(-1)
    return out.reshape(shape)
