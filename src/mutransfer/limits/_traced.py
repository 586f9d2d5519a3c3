"""Kernels of any PyTorch module in the infinite-width limit: exact where every op of the traced
program has a rule (`program`), Monte Carlo otherwise (`monte_carlo`), never silently.

    k = mt.limits.nngp(model, x1, x2)     # (n1, n2) float64, one output unit
    r = mt.limits.model_kernels(model, x1, exact=True)   # raises, naming the op and graph node
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import KernelWarning
from ._arrays import ArrayLike
from ._monte_carlo import monte_carlo_kernels
from ._program import NotExact, prepare_inputs, program_kernels

__all__ = ["KernelWarning", "ModelKernels", "model_kernel_diag", "model_kernels"]


@dataclass
class ModelKernels:
    """The kernels `model_kernels` returns, and how they were obtained.

    Attributes:
        nngp: the NNGP kernel of one output unit, (n1, n2) float64 ((n1, n2, *positions) for an
            output with positions, the same position on both sides).
        ntk: the NTK, the same shape, or None when not asked for.
        method: "exact" or "monte_carlo".
        nngp_std_error: the Monte Carlo standard error of `nngp` (None when exact).
        ntk_std_error: the Monte Carlo standard error of `ntk` (None when exact).
        reason: why no exact rule applied: the op and its graph node (None when exact).
        own_init: the parameters the Monte Carlo networks left with the module's own init.
    """

    nngp: torch.Tensor
    ntk: torch.Tensor | None
    method: str
    nngp_std_error: torch.Tensor | None = None
    ntk_std_error: torch.Tensor | None = None
    reason: str | None = None
    own_init: list = field(default_factory=list)


def _check(model, weight_var, bias_var):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not weight_var > 0:
        raise ValueError(f"weight_var must be positive, got {weight_var!r}")
    if not bias_var >= 0:
        raise ValueError(f"bias_var must be ≥ 0, got {bias_var!r}")


def model_kernels(
    model: nn.Module,
    x1: ArrayLike,
    x2: ArrayLike | None = None,
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    ntk: bool = True,
    exact: bool = False,
    samples: int = 32,
    seed: int = 0,
) -> ModelKernels:
    """NNGP and NTK of one output unit of `model` as every hidden width → ∞, exact or Monte Carlo.

    In the NTK parametrization: each Linear/Conv weight N(0, weight_var/fan_in), each bias
    N(0, bias_var); only the architecture matters, not the module's init or width. `model` is traced
    with torch.fx (torch.export where fx cannot) and the kernels propagated op by op (the rules:
    the "Kernels of any module" page). Where an op has no exact rule, `exact=True` raises;
    otherwise `samples` finite networks of this very module (at its own width) are sampled, with a
    `KernelWarning` saying so, and the standard errors are returned alongside.

    Args:
        model: a plain `torch.nn.Module` taking one input tensor.
        x1: inputs (n1, ...) as the module takes them, batch axis first.
        x2: inputs (n2, ...); None means x1 (the kernel is then exactly symmetric).
        weight_var: σ_w², the variance of each weight times its fan-in.
        bias_var: σ_b², the variance of each bias.
        ntk: also compute the NTK.
        exact: raise instead of falling back to Monte Carlo.
        samples: finite networks for the Monte Carlo fallback.
        seed: the Monte Carlo fallback's seed.

    Returns:
        The kernels, the method used and, for Monte Carlo, the standard errors and the reason.

    Raises:
        ValueError: with `exact=True`, naming the op and the graph node that have no rule.
    """
    _check(model, weight_var, bias_var)
    a = prepare_inputs(x1, "x1")
    b = None if x2 is None else prepare_inputs(x2, "x2")
    try:
        k, t = program_kernels(model, a, b, weight_var, bias_var, ntk=ntk)
        return ModelKernels(k, t, "exact")
    except NotExact as e:
        reason = str(e)
    if exact:
        raise ValueError(
            f"no exact infinite-width rule for {type(model).__name__}: {reason}. Pass exact=False "
            "for a Monte Carlo estimate, or change that op."
        )
    mc = monte_carlo_kernels(model, a, b, weight_var, bias_var, samples=samples, ntk=ntk, seed=seed)
    width = _widest(model)
    warnings.warn(
        f"{type(model).__name__}: {reason}; returning a Monte Carlo estimate over {samples} networks of "
        f"this module at its own width (largest layer {width}), standard error up to "
        f"{float(mc['nngp_se'].max()):.3g} (NNGP); the finite width adds an O(1/width) bias not in it",
        KernelWarning,
        stacklevel=3,
    )
    return ModelKernels(mc["nngp"], mc["ntk"], "monte_carlo", mc["nngp_se"], mc["ntk_se"], reason, mc["own_init"])


def model_kernel_diag(
    model: nn.Module,
    x,
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    exact: bool = False,
    samples: int = 32,
    seed: int = 0,
) -> torch.Tensor:
    """K(x, x) for every row of x without the (n, n) matrix (exact), or the Monte Carlo diagonal."""
    _check(model, weight_var, bias_var)
    a = prepare_inputs(x, "x")
    try:
        return program_kernels(model, a, None, weight_var, bias_var, ntk=False, self_only=True)[0]
    except NotExact:
        pass
    r = model_kernels(model, a, None, weight_var, bias_var, ntk=False, exact=exact, samples=samples, seed=seed)
    return r.nngp.diagonal()


def _widest(model: nn.Module) -> int:
    weights = [getattr(m, "weight", None) for m in model.modules()]
    sizes = [max(w.shape[:2]) for w in weights if isinstance(w, torch.Tensor) and w.ndim >= 2]
    return max(sizes) if sizes else 0
