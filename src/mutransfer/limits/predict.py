"""Predictions of infinitely wide networks: NNGP posterior and NTK gradient flow on MSE."""
from __future__ import annotations

from typing import Optional

import torch

from .kernels import ArrayLike, as_inputs, kernels, nngp_diag

__all__ = ["nngp_predict", "ntk_predict"]


def _targets(y: ArrayLike, n: int) -> tuple[torch.Tensor, bool]:
    y = torch.as_tensor(y).detach().to(torch.float64)
    squeeze = y.ndim == 1
    y = y[:, None] if squeeze else y
    if y.ndim != 2 or y.shape[0] != n:
        raise ValueError(f"y_train must have shape ({n},) or ({n}, k), got {tuple(y.shape)}")
    return y, squeeze


def nngp_predict(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike, *, noise_var: float = 0.0,
                 jitter: float = 1e-10, **kernel_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior (mean, variance) at x_test of the NNGP (exact Bayesian inference, Gaussian noise).

    mean = K*ₓ (Kₓₓ + σ²I)⁻¹ y,  var = K** − K*ₓ (Kₓₓ + σ²I)⁻¹ Kₓ*  (per test point; the same for
    every output column). `jitter` × mean diagonal is added for numerical stability.
    Kernel arguments (depth, activation, weight_var, bias_var, ...) as in `kernels`.
    """
    xtr, xte = as_inputs(x_train, "x_train"), as_inputs(x_test, "x_test")
    y, squeeze = _targets(y_train, xtr.shape[0])
    if noise_var < 0:
        raise ValueError(f"noise_var must be ≥ 0, got {noise_var}")
    ktt = kernels(xtr, None, ntk=False, **kernel_kwargs)[0]
    kst = kernels(xte, xtr, ntk=False, **kernel_kwargs)[0]
    kss = nngp_diag(xte, **{k: v for k, v in kernel_kwargs.items() if k not in ("series_terms", "ntk")})
    reg = noise_var + jitter * float(ktt.diagonal().mean())
    chol = torch.linalg.cholesky(ktt + reg * torch.eye(len(ktt), dtype=ktt.dtype))
    alpha = torch.cholesky_solve(y, chol)
    mean = kst @ alpha
    v = torch.linalg.solve_triangular(chol, kst.T, upper=False)
    var = (kss - (v * v).sum(0)).clamp_min(0)
    return (mean[:, 0] if squeeze else mean), var


def ntk_predict(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike, *, t: Optional[float] = None,
                lr: float = 1.0, **kernel_kwargs) -> torch.Tensor:
    """Mean prediction at x_test of the infinitely wide network trained by gradient flow on MSE.

    Loss ½ Σᵢ (f(xᵢ) − yᵢ)², so df/dt = −lr · Θ (f − y). Averaged over initializations (f₀ has
    mean 0): f_t(x*) = Θ*ₓ Θₓₓ⁻¹ (I − exp(−lr Θₓₓ t)) y; `t=None` is t = ∞ (kernel regression
    with the NTK). Kernel arguments (depth, activation, weight_var, bias_var, ...) as in `kernels`.
    """
    xtr, xte = as_inputs(x_train, "x_train"), as_inputs(x_test, "x_test")
    y, squeeze = _targets(y_train, xtr.shape[0])
    if t is not None and t < 0:
        raise ValueError(f"t must be ≥ 0 (or None for t = ∞), got {t}")
    theta_tt = kernels(xtr, None, **kernel_kwargs)[1]
    theta_st = kernels(xte, xtr, **kernel_kwargs)[1]
    lam, vec = torch.linalg.eigh(theta_tt)
    lam = lam.clamp_min(0)
    if t is None:
        gain = torch.where(lam > lam.max() * 1e-13, 1 / lam.clamp_min(1e-300), torch.zeros_like(lam))
    else:  # (1 − e^{−lr λ t}) / λ, → lr·t as λ → 0
        x = lr * t * lam
        gain = torch.where(x > 1e-8, -torch.expm1(-x) / lam.clamp_min(1e-300), lr * t * (1 - x / 2))
    mean = theta_st @ (vec @ (gain[:, None] * (vec.T @ y)))
    return mean[:, 0] if squeeze else mean
