"""The finite 1-hidden-layer network the µP limit (`MuPLimit`) is the limit of, in µP or the NTK
parametrization; its optimizer (the µP learning rates and ε of `MuPLimit`'s equations), its
training on the limit's minibatches, and the measures the comparisons use (feature movement, the
slope of an error against width)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ._activations import Fn, get_activation
from ._arrays import ArrayLike, as_inputs, as_targets
from ._mup_limit import ADAPTIVE, check_optimizer, sgd_batches

__all__ = ["OneHiddenLayer", "feature_movement", "finite_optimizer", "fitted_slope", "train_finite"]


class OneHiddenLayer(nn.Module):
    """f(x) = c_n · Σ_α v_α φ(u_α·x) with u ~ N(0, I/d), v ~ N(0, 1): c_n = 1/n in µP, 1/√n in the
    NTK parametrization. Train it with `train_finite`, which sets the matching learning rates."""

    def __init__(
        self,
        d_in: int,
        width: int,
        d_out: int = 1,
        activation: str | Fn = "relu",
        parametrization: str = "mup",
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__()
        if parametrization not in ("mup", "ntk"):
            raise ValueError(f"parametrization must be 'mup' or 'ntk', got {parametrization!r}")
        self.u = nn.Parameter(torch.randn(width, d_in, dtype=dtype) / math.sqrt(d_in))
        self.v = nn.Parameter(torch.randn(d_out, width, dtype=dtype))
        self.act = get_activation(activation).fn
        self.parametrization = parametrization
        self.scale = 1.0 / width if parametrization == "mup" else 1.0 / math.sqrt(width)

    def preactivations(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden neurons' preactivations u_α·x.

        Args:
            x: inputs (m, d).

        Returns:
            (m, width).
        """
        return x @ self.u.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) = scale · φ(x uᵀ) vᵀ, (m, k); scale is 1/n in µP, 1/√n in the NTK parametrization."""
        return self.scale * self.act(self.preactivations(x)) @ self.v.T


def finite_optimizer(
    model: OneHiddenLayer,
    lr: float,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    nesterov: bool = False,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """The torch optimizer whose n → ∞ limit is `MuPLimit(..., optimizer=...)` with the same arguments.

    Both u and v of `OneHiddenLayer` are vector-like (one width dimension), and v sits behind the
    1/n readout. µP: SGD lr η·n (momentum as given); Adam lr η and ε/n — the gradients are Θ(1/n),
    and Adam is invariant to scaling gradient and ε together (the library's rules: Adam lr ×1 for
    input and multiplied-readout weights, ε ×1/n); AdamW's decoupled `weight_decay` as given (every
    entry is Θ(1), so p ← p·(1 − lr·wd) is the same at every width). NTK parametrization: SGD lr η
    (Adam is not defined for it here)."""
    check_optimizer(optimizer, momentum, nesterov, betas, eps, weight_decay)
    width = model.u.shape[0]
    if optimizer in ADAPTIVE:
        if model.parametrization != "mup":
            raise ValueError(
                f"optimizer={optimizer!r} is defined for parametrization='mup' only; use 'sgd' for the NTK one"
            )
        if optimizer == "adamw":
            return torch.optim.AdamW(
                model.parameters(), lr=lr, betas=tuple(betas), eps=eps / width, weight_decay=weight_decay
            )
        return torch.optim.Adam(model.parameters(), lr=lr, betas=tuple(betas), eps=eps / width)
    scale = width if model.parametrization == "mup" else 1.0
    return torch.optim.SGD(model.parameters(), lr=lr * scale, momentum=momentum, nesterov=nesterov)


def train_finite(
    model: OneHiddenLayer,
    x: ArrayLike,
    y: ArrayLike,
    steps: int,
    lr: float,
    batch_size: int | None = None,
    batch_seed: int = 0,
    *,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    nesterov: bool = False,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> OneHiddenLayer:
    """Train on (1/B) Σ ½‖f − y‖² with `finite_optimizer`: SGD at lr η·n (µP) or η (NTK) on u and v,
    with `momentum`/`nesterov`; or, µP only, Adam/AdamW at lr η with ε/n (`betas`, `eps`,
    AdamW's decoupled `weight_decay`)."""
    x = as_inputs(x, "x").to(device=model.u.device, dtype=model.u.dtype)  # where the network is
    y = as_targets(y, x.shape[0]).to(device=model.u.device, dtype=model.u.dtype)
    opt = finite_optimizer(model, lr, optimizer, momentum, nesterov, betas, eps, weight_decay)
    for batch in sgd_batches(len(x), steps, batch_size, batch_seed, x.device):
        loss = 0.5 * ((model(x[batch]) - y[batch]) ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def feature_movement(model: OneHiddenLayer, initial: OneHiddenLayer, x: ArrayLike) -> float:
    """Mean |h_T − h_0| of the hidden preactivations over neurons and inputs."""
    x = as_inputs(x, "x").to(model.u.dtype)
    with torch.no_grad():
        return float((model.preactivations(x) - initial.preactivations(x)).abs().mean())


def fitted_slope(widths, errors) -> float:
    """Least-squares slope of log(error) against log(width)."""
    return float(np.polyfit(np.log(np.asarray(widths, float)), np.log(np.asarray(errors, float)), 1)[0])
