"""NNGP and NTK kernels of fully-connected networks in the infinite-width limit.

Convention: the network these kernels describe has `depth` hidden layers and is written in the
NTK parametrization, each layer h = σ_w·W·x/√fan_in + σ_b·b with W, b ~ N(0, 1):

    K¹(x, x')    = σ_w² ⟨x, x'⟩ / d + σ_b²
    K^{l+1}      = σ_w² E[φ(u) φ(v)] + σ_b²,   (u, v) ~ N(0, K^l restricted to {x, x'})
    Θ¹           = K¹
    Θ^{l+1}      = K^{l+1} + σ_w² E[φ'(u) φ'(v)] · Θ^l

and the output is layer depth+1. The NNGP kernel K is the same for the standard
parametrization (W ~ N(0, σ_w²/fan_in), b ~ N(0, σ_b²)); the NTK Θ is the NTK parametrization's
(in the standard parametrization the NTK has no width-independent limit). weight_var = 2 with
relu keeps the diagonal constant through the layers (He init).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._activations import Activation, Fn, get_activation
from ._arrays import ArrayLike, as_inputs
from ._fields import FALLBACK_ORDER, elem_of, expect_both
from ._gaussian import MAX_ORDER, expect_1d

__all__ = [
    "DEFAULT_QUAD_ORDER",
    "DEFAULT_SERIES_TERMS",
    "kernels",
    "mlp_kernels",
    "nngp",
    "nngp_diag",
    "ntk",
]

DEFAULT_QUAD_ORDER = FALLBACK_ORDER  # per dimension, for the 2-D quadrature fallback
DEFAULT_SERIES_TERMS = 240  # Hermite coefficients in Mehler's series


def _check(depth: int, weight_var: float, bias_var: float) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth (number of hidden layers) must be an integer ≥ 0, got {depth!r}")
    if not weight_var > 0:
        raise ValueError(f"weight_var must be positive, got {weight_var!r}")
    if not bias_var >= 0:
        raise ValueError(f"bias_var must be ≥ 0, got {bias_var!r}")


def _diag_next(act: Activation, d: torch.Tensor, order: int) -> torch.Tensor:
    if act.phi_moment is not None:
        return act.phi_moment(d, d, d)
    return expect_1d(lambda u: act.fn(u) ** 2, d, min(4 * order, MAX_ORDER))


def _model_call(fn_name: str, first, rest: tuple, kwargs: dict):
    """`f(model, x1, x2=None, weight_var=2.0, bias_var=0.0, **options)` → ModelKernels."""
    from ._traced import model_kernels

    names = ("x1", "x2", "weight_var", "bias_var")
    if len(rest) > len(names):
        raise TypeError(
            f"{fn_name}(model, x1, x2=None, weight_var=2.0, bias_var=0.0, ...) takes at most "
            f"{len(names)} positional arguments after the model"
        )
    bound = dict(zip(names, rest))
    for key in bound:
        if key in kwargs:
            raise TypeError(f"{fn_name}() got two values for {key}")
    bad = {"depth", "activation", "derivative", "quad_order", "series_terms"} & set(kwargs)
    if bad:
        raise TypeError(f"{fn_name}(model, ...) reads the architecture from the model; drop {sorted(bad)}")
    if "x1" not in bound and "x1" not in kwargs:
        raise TypeError(f"{fn_name}(model, x1, ...) needs the inputs x1")
    return model_kernels(first, **bound, **kwargs)


def kernels(
    x1: nn.Module | ArrayLike, x2: ArrayLike | None = None, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The NNGP and NTK kernels of an infinitely wide network, in one pass.

    Two forms:

    - `kernels(model, x1, x2=None, weight_var=2.0, bias_var=0.0, *, ntk=True, exact=False,
      samples=32, seed=0)`: any `torch.nn.Module`, traced and propagated op by op (see
      `model_kernels`; a Monte Carlo estimate with a `KernelWarning` where an op has no rule);
    - `kernels(x1, x2=None, depth=1, activation="relu", weight_var=2.0, bias_var=0.0, *,
      derivative=None, ntk=True, quad_order=160, series_terms=240)`: a fully-connected network with
      `depth` hidden layers in the NTK parametrization.

    Args:
        x1: the module, or the first inputs (n1, d) (tensor or numpy array).
        x2: the second inputs (n2, …); None means x1 (the kernel is then exactly symmetric).
        *args: the rest of the form's positional arguments, as listed above.
        **kwargs: the rest of the form's keyword arguments, as listed above.

    Returns:
        (NNGP, NTK), each (n1, n2) float64 ((n1, n2, *positions) for a module whose output has
        positions); the NTK is None with `ntk=False`.
    """
    if isinstance(x1, nn.Module):
        r = _model_call("kernels", x1, (x2,) + args if x2 is not None or args else (), kwargs)
        return r.nngp, r.ntk
    return mlp_kernels(x1, x2, *args, **kwargs)


def mlp_kernels(
    x1: ArrayLike,
    x2: ArrayLike | None = None,
    depth: int = 1,
    activation: str | Fn = "relu",
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    derivative: Fn | None = None,
    ntk: bool = True,
    quad_order: int = DEFAULT_QUAD_ORDER,
    series_terms: int = DEFAULT_SERIES_TERMS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(NNGP, NTK) kernels between the rows of x1 and x2 (x2 = x1 when None), each (n1, n2) float64.

    `activation`: "relu", "erf", "identity" (closed forms), "tanh", "gelu", "sigmoid", "softplus",
    "silu" or any elementwise callable; φ' by autograd unless `derivative` is given.
    `ntk=False` skips the NTK. Without a closed form, the Gaussian moments come from Mehler's
    series with `series_terms` Hermite coefficients (see `gaussian`): ~1e-8 relative or better for smooth
    activations (tests check against erf's closed form), at the cost of `series_terms` (n1 × n2)
    multiply-adds per layer. Where the coefficients do not decay (kinks, jumps) it falls back to
    2-D Gauss–Hermite quadrature of order `quad_order` per dimension, only for the entries whose
    coefficients do not decay on either side (~1e-4 at kinks, slow).
    """
    _check(depth, weight_var, bias_var)
    act = get_activation(activation, derivative)
    a = as_inputs(x1, "x1")
    b = a if x2 is None else as_inputs(x2, "x2")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x1 and x2 have different feature sizes ({a.shape[1]} and {b.shape[1]})")
    d_in = a.shape[1]
    k = weight_var * (a @ b.T) / d_in + bias_var
    d1 = weight_var * (a * a).sum(1) / d_in + bias_var
    d2 = d1 if x2 is None else weight_var * (b * b).sum(1) / d_in + bias_var
    theta = k.clone() if ntk else None
    phi = elem_of(act)
    for _ in range(depth):
        e, de = expect_both(phi, phi, d1[:, None], d2[None, :], k, ntk, terms=series_terms, fallback_order=quad_order)
        k_next = weight_var * e + bias_var
        if ntk:
            assert theta is not None and de is not None
            theta = k_next + weight_var * de * theta
        k = k_next
        d1 = weight_var * _diag_next(act, d1, quad_order) + bias_var
        d2 = d1 if x2 is None else weight_var * _diag_next(act, d2, quad_order) + bias_var
    if x2 is None:  # exactly symmetric
        k = (k + k.T) / 2
        theta = None if theta is None else (theta + theta.T) / 2
    return k, theta


def nngp(x1: nn.Module | ArrayLike, x2: ArrayLike | None = None, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The NNGP kernel: the covariance of the infinitely wide network's output at init.

    `nngp(model, x1, x2=None, weight_var=2.0, bias_var=0.0, ...)` for any `torch.nn.Module` (a Monte
    Carlo estimate carries its standard error as `.std_error` on the tensor), or
    `nngp(x1, x2=None, depth=1, activation="relu", weight_var=2.0, bias_var=0.0, ...)` for a
    fully-connected network. The same in the standard and the NTK parametrization.

    Args:
        x1: the module, or the first inputs (n1, d).
        x2: the second inputs; None means x1.
        *args: the form's other positional arguments (see `kernels`).
        **kwargs: the form's other keyword arguments (see `kernels`).

    Returns:
        The (n1, n2) float64 kernel of one output unit.
    """
    if isinstance(x1, nn.Module):
        r = _model_call("nngp", x1, (x2,) + args if x2 is not None or args else (), dict(kwargs, ntk=False))
        if r.nngp_std_error is not None:
            r.nngp.std_error = r.nngp_std_error
        return r.nngp
    return _mlp(x1, x2, *args, ntk=False, **kwargs)[0]


def ntk(x1: nn.Module | ArrayLike, x2: ArrayLike | None = None, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The neural tangent kernel of the infinitely wide network in the NTK parametrization.

    `ntk(model, x1, x2=None, weight_var=2.0, bias_var=0.0, ...)` for any `torch.nn.Module`, or
    `ntk(x1, x2=None, depth=1, activation="relu", ...)` for a fully-connected network.

    Args:
        x1: the module, or the first inputs (n1, d).
        x2: the second inputs; None means x1.
        *args: the form's other positional arguments (see `kernels`).
        **kwargs: the form's other keyword arguments (see `kernels`).

    Returns:
        The (n1, n2) float64 kernel Θ of one output unit; frozen parameters are not in it.
    """
    if isinstance(x1, nn.Module):
        r = _model_call("ntk", x1, (x2,) + args if x2 is not None or args else (), kwargs)
        if r.ntk_std_error is not None:
            r.ntk.std_error = r.ntk_std_error
        return r.ntk
    return _mlp(x1, x2, *args, **kwargs)[1]


def _mlp(
    x1,
    x2=None,
    depth: int = 1,
    activation: str | Fn = "relu",
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    **kwargs,
):
    return mlp_kernels(x1, x2, depth, activation, weight_var, bias_var, **kwargs)


def nngp_diag(
    x: ArrayLike,
    depth: int = 1,
    activation: str | Fn = "relu",
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    derivative: Fn | None = None,
    quad_order: int = DEFAULT_QUAD_ORDER,
) -> torch.Tensor:
    """K(x, x) for every row of x, without the (n, n) matrix."""
    _check(depth, weight_var, bias_var)
    act = get_activation(activation, derivative)
    a = as_inputs(x, "x")
    d = weight_var * (a * a).sum(1) / a.shape[1] + bias_var
    for _ in range(depth):
        d = weight_var * _diag_next(act, d, quad_order) + bias_var
    return d
