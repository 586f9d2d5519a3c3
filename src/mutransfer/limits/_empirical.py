"""Kernels of finite networks: the empirical NTK (torch.func) and a Monte Carlo NNGP, and the
finite fully-connected network in the NTK parametrization that `kernels` describes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import nn

from ._activations import Fn, get_activation
from ._arrays import ArrayLike, as_inputs

__all__ = ["NTKMLP", "NTKLinear", "empirical_nngp", "empirical_ntk"]


class NTKLinear(nn.Module):
    """h = σ_w · W x / √fan_in + σ_b · b with W, b ~ N(0, 1) (NTK parametrization)."""

    def __init__(self, fan_in: int, fan_out: int, weight_var: float, bias_var: float):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(fan_out, fan_in))
        self.bias = nn.Parameter(torch.randn(fan_out)) if bias_var > 0 else None
        self.w_scale = math.sqrt(weight_var / fan_in)
        self.b_scale = math.sqrt(bias_var)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.w_scale * (x @ self.weight.T)
        return out if self.bias is None else out + self.b_scale * self.bias


class NTKMLP(nn.Module):
    """`depth` hidden layers of `width` units: the finite network whose limit `kernels` computes."""

    def __init__(
        self,
        d_in: int,
        width: int,
        depth: int = 1,
        activation: str | Fn = "relu",
        weight_var: float = 2.0,
        bias_var: float = 0.0,
        d_out: int = 1,
    ):
        super().__init__()
        sizes = [d_in] + [width] * depth + [d_out]
        self.layers = nn.ModuleList(NTKLinear(a, b, weight_var, bias_var) for a, b in itertools.pairwise(sizes))
        self.act = get_activation(activation).fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.act(layer(x))
        return self.layers[-1](x)


def empirical_ntk(model: nn.Module, x1: ArrayLike, x2: ArrayLike | None = None, chunk: int = 256) -> torch.Tensor:
    """Θ(x, x') = Σ_params ⟨∂f(x)/∂θ, ∂f(x')/∂θ⟩ of `model` as it is, (n1, n2) float64.

    With several outputs, the per-output kernels are averaged (the infinite-width NTK is the
    same for every output and zero across outputs). Jacobians by torch.func, `chunk` inputs at a time.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    from torch.func import functional_call, jacrev, vmap

    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    dtype = next(iter(params.values())).dtype
    a = as_inputs(x1, "x1").to(dtype)
    b = a if x2 is None else as_inputs(x2, "x2").to(dtype)

    def f(p, x):
        return functional_call(model, p, (x[None],)).reshape(-1)

    def jac(x: torch.Tensor) -> torch.Tensor:  # (n, outputs, P)
        parts = []
        for s in range(0, len(x), chunk):
            j = vmap(jacrev(f), in_dims=(None, 0))(params, x[s : s + chunk])
            parts.append(torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in j.values()], -1))
        return torch.cat(parts).to(torch.float64)

    j1 = jac(a)
    j2 = j1 if x2 is None else jac(b)
    return torch.einsum("iop,jop->ij", j1, j2) / j1.shape[1]


def empirical_nngp(
    make_model: Callable[[], nn.Module], x1: ArrayLike, x2: ArrayLike | None = None, samples: int = 100
) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo NNGP: the mean of f(x) f(x')ᵀ over `samples` fresh networks from `make_model()`,
    with its standard error; both (n1, n2) float64 (outputs averaged)."""
    if not isinstance(samples, int) or samples < 2:
        raise ValueError(f"samples must be an integer ≥ 2, got {samples!r}")
    a = as_inputs(x1, "x1")
    b = a if x2 is None else as_inputs(x2, "x2")
    total = torch.zeros(len(a), len(b), dtype=torch.float64, device=a.device)
    total_sq = torch.zeros_like(total)
    with torch.no_grad():
        for _ in range(samples):
            model = make_model()
            p = next(model.parameters())
            dtype = p.dtype
            a, b = a.to(p.device), b.to(p.device)  # the networks' device (the first one's for the sums)
            total, total_sq = total.to(p.device), total_sq.to(p.device)
            fa = model(a.to(dtype)).to(torch.float64).reshape(len(a), -1)
            fb = fa if x2 is None else model(b.to(dtype)).to(torch.float64).reshape(len(b), -1)
            k = fa @ fb.T / fa.shape[1]
            total += k
            total_sq += k * k
    mean = total / samples
    se = ((total_sq / samples - mean * mean).clamp_min(0) / (samples - 1)).sqrt()
    return mean, se
