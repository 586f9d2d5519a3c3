"""Activations for the kernel recursions: the function, its derivative, and closed forms.

For a centred 2-D Gaussian (u, v) with covariance [[a, c], [c, b]], the recursions need
E[φ(u)φ(v)] (NNGP) and E[φ'(u)φ'(v)] (NTK). relu, erf and the identity have them in closed
form; anything else (a name below or any elementwise callable) is integrated by Gauss–Hermite
quadrature, with φ' from autograd unless given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["Activation", "Fn", "Moments", "autograd_derivative", "get_activation"]

Fn = Callable[[torch.Tensor], torch.Tensor]
Moments = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (a, b, c) -> E[...]


def _relu_phi(a, b, c):
    """E[relu(u) relu(v)] = √(ab)/(2π) (sin θ + (π − θ) cos θ), cos θ = c/√(ab) (arc-cosine kernel)."""
    s = torch.sqrt(a * b)
    cos = torch.clamp(c / s, -1.0, 1.0)
    theta = torch.arccos(cos)
    return s / (2 * math.pi) * (torch.sqrt(1 - cos * cos) + (math.pi - theta) * cos)


def _relu_dphi(a, b, c):
    """E[1(u>0) 1(v>0)] = (π − θ)/(2π)."""
    cos = torch.clamp(c / torch.sqrt(a * b), -1.0, 1.0)
    return (math.pi - torch.arccos(cos)) / (2 * math.pi)


def _erf_phi(a, b, c):
    """E[erf(u) erf(v)] = (2/π) arcsin(2c / √((1 + 2a)(1 + 2b)))."""
    return (2 / math.pi) * torch.arcsin(torch.clamp(2 * c / torch.sqrt((1 + 2 * a) * (1 + 2 * b)), -1.0, 1.0))


def _erf_dphi(a, b, c):
    """E[erf'(u) erf'(v)] = (4/π) / √((1 + 2a)(1 + 2b) − 4c²)."""
    return (4 / math.pi) / torch.sqrt((1 + 2 * a) * (1 + 2 * b) - 4 * c * c)


@dataclass(frozen=True)
class Activation:
    name: str
    fn: Fn
    derivative: Fn
    phi_moment: Moments | None = None  # closed-form E[φ(u)φ(v)]
    dphi_moment: Moments | None = None  # closed-form E[φ'(u)φ'(v)]


def autograd_derivative(fn: Fn) -> Fn:
    def derivative(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            z = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(fn(z).sum(), z)
        return g.detach()

    return derivative


_NAMED: dict[str, Activation] = {
    "relu": Activation("relu", torch.relu, lambda x: (x > 0).to(x.dtype), _relu_phi, _relu_dphi),
    "erf": Activation("erf", torch.erf, lambda x: (2 / math.sqrt(math.pi)) * torch.exp(-x * x), _erf_phi, _erf_dphi),
    "identity": Activation(
        "identity", lambda x: x, torch.ones_like, lambda a, b, c: c, lambda a, b, c: torch.ones_like(c)
    ),
    "tanh": Activation("tanh", torch.tanh, lambda x: 1 - torch.tanh(x) ** 2),
    "gelu": Activation("gelu", F.gelu, autograd_derivative(F.gelu)),
    "sigmoid": Activation("sigmoid", torch.sigmoid, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x))),
    "softplus": Activation("softplus", F.softplus, torch.sigmoid),
    "silu": Activation("silu", F.silu, autograd_derivative(F.silu)),
}
_NAMED["linear"] = _NAMED["identity"]


def get_activation(activation: str | Fn, derivative: Fn | None = None) -> Activation:
    """A named activation (closed form where known) or any elementwise callable."""
    if isinstance(activation, str):
        key = activation.lower()
        if key not in _NAMED:
            raise ValueError(
                f"unknown activation '{activation}'; use one of {', '.join(sorted(_NAMED))} or pass "
                "an elementwise callable"
            )
        act = _NAMED[key]
        if derivative is not None:
            return Activation(act.name, act.fn, derivative, act.phi_moment, None)
        return act
    if not callable(activation):
        raise TypeError(f"activation must be a name or an elementwise callable, got {type(activation).__name__}")
    name = getattr(activation, "__name__", "callable")
    return Activation(name, activation, derivative or autograd_derivative(activation))
