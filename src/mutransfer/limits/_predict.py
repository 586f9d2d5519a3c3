"""Predictions of infinitely wide networks: NNGP posterior and NTK gradient flow on MSE."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._arrays import ArrayLike, as_inputs, as_targets
from ._kernels import kernels, nngp_diag

__all__ = ["gp_posterior", "gradient_flow", "nngp_predict", "ntk_predict"]


def _targets(y: ArrayLike, n: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """(n, k) targets on `device` (the inputs') and whether y was 1-D (the prediction is squeezed back)."""
    return as_targets(y, n, "y_train").to(device), torch.as_tensor(y).ndim == 1


class _ModelKernels:
    """The three kernel blocks a prediction needs, from a model (any nn.Module) or from the
    fully-connected recursion's keyword arguments."""

    def __init__(self, model, kernel_kwargs: dict):
        self.model, self.kw = model, kernel_kwargs

    def inputs(self, x, name):
        if self.model is None:
            return as_inputs(x, name)
        from ._program import prepare_inputs

        return prepare_inputs(x, name)

    def pair(self, a, b, ntk: bool):
        if self.model is None:
            return kernels(a, b, ntk=ntk, **self.kw)
        from ._traced import model_kernels

        r = model_kernels(self.model, a, b, ntk=ntk, **self.kw)
        return r.nngp, r.ntk

    def diag(self, x):
        if self.model is None:
            return nngp_diag(x, **{k: v for k, v in self.kw.items() if k not in ("series_terms", "ntk")})
        from ._traced import model_kernel_diag

        return model_kernel_diag(self.model, x, **self.kw)


def _split(args, kernel_kwargs, n: int):
    named = [kernel_kwargs.pop(k) for k in ("x_train", "y_train", "x_test") if k in kernel_kwargs]
    args = tuple(args) + tuple(named)
    if args and isinstance(args[0], nn.Module):
        if len(args) != n + 1:
            raise TypeError(f"with a model first, pass exactly {n} arrays after it")
        return _ModelKernels(args[0], kernel_kwargs), args[1:]
    if len(args) != n:
        raise TypeError(f"expected {n} arrays (x_train, y_train, x_test), got {len(args)} arguments")
    return _ModelKernels(None, kernel_kwargs), args


def nngp_predict(
    *args: Any, noise_var: float = 0.0, jitter: float = 1e-10, **kernel_kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and variance at x_test of the NNGP: exact Bayesian inference with the
    infinitely wide network as the prior and Gaussian observation noise.

    mean = K*ₓ (Kₓₓ + σ²I)⁻¹ y,  var = K** − K*ₓ (Kₓₓ + σ²I)⁻¹ Kₓ*  (per test point; the same for
    every output column). Called as `nngp_predict(x_train, y_train, x_test, depth=...,
    activation=..., ...)` for the fully-connected kernels, or `nngp_predict(model, x_train, y_train,
    x_test, weight_var=..., bias_var=...)` for any module (`model_kernels`).

    Args:
        *args: `[model,] x_train, y_train, x_test`; y_train (n,) or (n, k).
        noise_var: σ², the observation noise variance.
        jitter: added to the diagonal, times its mean, for numerical stability.
        **kernel_kwargs: the kernel's arguments, as for `kernels`.

    Returns:
        (mean, variance): mean (m,) for y of shape (n,), else (m, k); variance (m,).
    """
    src, (x_train, y_train, x_test) = _split(args, kernel_kwargs, 3)
    xtr, xte = src.inputs(x_train, "x_train"), src.inputs(x_test, "x_test")
    y, squeeze = _targets(y_train, xtr.shape[0], xtr.device)
    if noise_var < 0:
        raise ValueError(f"noise_var must be ≥ 0, got {noise_var}")
    ktt = src.pair(xtr, None, False)[0]
    kst = src.pair(xte, xtr, False)[0]
    kss = src.diag(xte)
    mean, var = gp_posterior(ktt, kst, y, kss, noise_var=noise_var, jitter=jitter)
    assert var is not None  # given K(x*, x*)
    return (mean[:, 0] if squeeze else mean), var


def ntk_predict(*args: Any, t: float | None = None, lr: float = 1.0, **kernel_kwargs: Any) -> torch.Tensor:
    """Mean prediction at x_test of the infinitely wide network trained by gradient flow on MSE.

    Loss ½ Σᵢ (f(xᵢ) − yᵢ)², so df/dt = −lr · Θ (f − y). Averaged over initializations (f₀ has
    mean 0): f_t(x*) = Θ*ₓ Θₓₓ⁻¹ (I − exp(−lr Θₓₓ t)) y; `t=None` is t = ∞ (kernel regression
    with the NTK). Called as `ntk_predict(x_train, y_train, x_test, depth=..., ...)` or
    `ntk_predict(model, x_train, y_train, x_test, ...)` for any module.

    Args:
        *args: `[model,] x_train, y_train, x_test`; y_train (n,) or (n, k).
        t: the training time; None for t = ∞.
        lr: the learning rate of the flow.
        **kernel_kwargs: the kernel's arguments, as for `kernels`.

    Returns:
        The mean prediction, (m,) for y of shape (n,), else (m, k).
    """
    src, (x_train, y_train, x_test) = _split(args, kernel_kwargs, 3)
    xtr, xte = src.inputs(x_train, "x_train"), src.inputs(x_test, "x_test")
    y, squeeze = _targets(y_train, xtr.shape[0], xtr.device)
    if t is not None and t < 0:
        raise ValueError(f"t must be ≥ 0 (or None for t = ∞), got {t}")
    theta_tt = src.pair(xtr, None, True)[1]
    theta_st = src.pair(xte, xtr, True)[1]
    mean = gradient_flow(theta_tt, theta_st, y, t=t, lr=lr)
    return mean[:, 0] if squeeze else mean


def gp_posterior(
    k_train: torch.Tensor,
    k_test_train: torch.Tensor,
    y: torch.Tensor,
    k_test_diag: torch.Tensor | None = None,
    *,
    noise_var: float = 0.0,
    jitter: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The GP posterior from kernels you already have (computed once, reused across targets).

    Args:
        k_train: Kₓₓ, (n, n).
        k_test_train: K*ₓ, (m, n).
        y: the training targets, (n, k).
        k_test_diag: K(x*, x*) per test point, (m,); without it no variance.
        noise_var: σ², the observation noise variance.
        jitter: added to the diagonal, times its mean, for numerical stability.

    Returns:
        (mean K*ₓ (Kₓₓ + σ²I)⁻¹ y of shape (m, k), variance per test point (m,) or None).
    """
    if noise_var < 0:
        raise ValueError(f"noise_var must be ≥ 0, got {noise_var}")
    reg = noise_var + jitter * float(k_train.diagonal().mean())
    chol = torch.linalg.cholesky(k_train + reg * torch.eye(len(k_train), dtype=k_train.dtype, device=k_train.device))
    mean = k_test_train @ torch.cholesky_solve(y, chol)
    if k_test_diag is None:
        return mean, None
    v = torch.linalg.solve_triangular(chol, k_test_train.T, upper=False)
    return mean, (k_test_diag - (v * v).sum(0)).clamp_min(0)


def gradient_flow(
    theta_train: torch.Tensor,
    theta_test_train: torch.Tensor,
    y: torch.Tensor,
    t: float | None = None,
    lr: float = 1.0,
) -> torch.Tensor:
    """The mean of gradient flow on MSE from NTKs you already have: Θ*ₓ Θₓₓ⁻¹ (I − exp(−lr Θₓₓ t)) y.

    Args:
        theta_train: Θₓₓ, (n, n).
        theta_test_train: Θ*ₓ, (m, n).
        y: the training targets, (n, k).
        t: the training time; None for t = ∞ (kernel regression with the NTK).
        lr: the learning rate of the flow.

    Returns:
        The mean prediction at the test points, (m, k).
    """
    if t is not None and t < 0:
        raise ValueError(f"t must be ≥ 0 (or None for t = ∞), got {t}")
    lam, vec = torch.linalg.eigh(theta_train)
    lam = lam.clamp_min(0)
    if t is None:
        gain = torch.where(lam > lam.max() * 1e-13, 1 / lam.clamp_min(1e-300), torch.zeros_like(lam))
    else:  # (1 − e^{−lr λ t}) / λ, → lr·t as λ → 0
        x = lr * t * lam
        gain = torch.where(x > 1e-8, -torch.expm1(-x) / lam.clamp_min(1e-300), lr * t * (1 - x / 2))
    return theta_test_train @ (vec @ (gain[:, None] * (vec.T @ y)))
