"""Adam in the limit (Tensor Programs IVb): the nonlinear outer product of a hidden matrix's update.

torch.optim.Adam updates each entry of a hidden matrix W (r_out·n × r_in·n) from that entry's own
gradients. At step s the gradient is G_s = (1/n) Σ_b ĝ_{s,b} x_{s,b}ᵀ: entry (i, j) is γ_{s,ij}/n with
γ_{s,ij} = Σ_b ĝ_{s,b,i} x_{s,b,j}, Θ(1), a function of out-coordinate i's backward history and
in-coordinate j's forward history alone. Adam is invariant to scaling a gradient and ε together, so
after t steps

    W_t = W₀ − (κ̃/n) Ψ_t,    Ψ_t,ij = Σ_{τ ≤ t} m̂_τ / (√v̂_τ + ε̃),   m, v: Adam's moments of γ_{·,ij},

with κ̃ = lr·n (µP's Adam lr ∝ 1/fan_in) and ε̃ = n·ε (µP's ε ∝ 1/n). Ψ is not a sum of outer products
(the square root and ε mix the steps), so ΔW_t v does not reduce to a few inner products as under
SGD: (ΔW_t v)_i = −κ̃ · (1/n) Σ_j Ψ_t(ĝ_i, x_j) v_j — for every particle i an expectation over the
other side's particles j (`NonlinearOuter`: E over J of them, the first J — particles are i.i.d.,
J = `OTHER` at most, its Monte Carlo error O(J^-½) per particle, far under the finite widths' here).
The transposed product ΔW_tᵀ g is the same with the roles of the two sides exchanged.

In the autograd graph particle i's value depends on its own history only (the other side enters
through an expectation: deterministic in the limit, detached), so the Ż partials stay per-particle
gradients. The product is a custom autograd Function that recomputes in its backward, in chunks of
particles: nothing of size particles × J is kept between steps.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OTHER", "NonlinearOuter", "adam_psi"]

OTHER = 2048  # particles of the other side each expectation averages over (all when fewer)
_CHUNK = 2**21  # entries of one (G, I, J) block


def adam_psi(gammas: list[torch.Tensor], betas: tuple[float, float], eps: float) -> torch.Tensor:
    """Ψ = Σ_τ m̂_τ/(√v̂_τ + ε): the sum of Adam's bias-corrected steps over the gradients γ_1, γ_2, …"""
    b1, b2 = betas
    m = v = psi = None
    for tau, g in enumerate(gammas, start=1):
        m = (1 - b1) * g if m is None else b1 * m + (1 - b1) * g
        v = (1 - b2) * g * g if v is None else b2 * v + (1 - b2) * g * g
        step = (m / (1 - b1**tau)) / ((v / (1 - b2**tau)).sqrt() + eps)
        psi = step if psi is None else psi + step
    assert psi is not None
    return psi


def _product(
    own: torch.Tensor, other: torch.Tensor, v: torch.Tensor, lengths: list[int], betas: tuple[float, float], eps: float
) -> torch.Tensor:
    """Σ_j Ψ(own_i, other_j) v_j for one chunk of own particles: own (G, I, S), other (G, J, S), v (G, J, B)."""
    gammas, lo = [], 0
    for length in lengths:
        gammas.append(torch.einsum("gim,gjm->gij", own[:, :, lo : lo + length], other[:, :, lo : lo + length]))
        lo += length
    return torch.einsum("gij,gjb->gib", adam_psi(gammas, betas, eps), v)


class NonlinearOuter(torch.autograd.Function):
    """scale · Σ_j Ψ(own_i, other_j) v_j per own particle i (see the module doc); differentiable in
    `own` only (the other side and v are expectations' inputs)."""

    @staticmethod
    def forward(
        ctx: Any,
        own: torch.Tensor,
        other: torch.Tensor,
        v: torch.Tensor,
        lengths: list[int],
        betas: tuple[float, float],
        eps: float,
        scale: float,
    ) -> torch.Tensor:
        ctx.save_for_backward(own, other, v)
        ctx.lengths, ctx.betas, ctx.eps, ctx.scale = lengths, betas, eps, scale
        g, p, _ = own.shape
        out = own.new_empty(g, p, v.shape[2])
        step = max(1, _CHUNK // max(1, g * other.shape[1]))
        for i in range(0, p, step):
            out[:, i : i + step] = _product(own[:, i : i + step], other, v, lengths, betas, eps) * scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        own, other, v = ctx.saved_tensors
        g, p, _ = own.shape
        out = torch.zeros_like(own)
        step = max(1, _CHUNK // max(1, g * other.shape[1]))
        with torch.enable_grad():
            for i in range(0, p, step):
                chunk = own[:, i : i + step].detach().requires_grad_(True)
                value = _product(chunk, other, v, ctx.lengths, ctx.betas, ctx.eps) * ctx.scale
                (out[:, i : i + step],) = torch.autograd.grad(value, chunk, grad[:, i : i + step])
        return out, None, None, None, None, None, None
