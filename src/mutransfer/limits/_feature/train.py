"""The finite networks `FeatureLimit` is the limit of, trained as it trains: `train_mup`."""

from __future__ import annotations

import torch
from torch import nn

from .._arrays import ArrayLike, as_inputs, as_targets
from .._checks import integer, positive
from .._mup_limit import sgd_batches
from .scaling import mup_adam, mup_sgd

__all__ = ["train_mup"]


def train_mup(
    model: nn.Module,
    base: nn.Module,
    x: ArrayLike,
    y: ArrayLike,
    steps: int,
    lr: float,
    batch_size: int | None = None,
    batch_seed: int = 0,
    *,
    momentum: float = 0.0,
    optimizer: str = "sgd",
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> nn.Module:
    """The finite µP network `mt.limits.FeatureLimit(·, base=base)` is the limit of, trained as the
    limit's `fit(x, y, steps=steps, lr=lr, momentum=momentum, batch_size=batch_size)` trains (or
    its `fit(…, optimizer="adam", betas=betas, eps=eps)`).

    `mt.parametrize(model, base=base)` (in place), then `steps` steps of
    `torch.optim.SGD(mt.param_groups(model, lr, "sgd"), lr=lr, momentum=momentum)` (or
    `torch.optim.Adam(mt.param_groups(model, lr, "adam", eps=eps), lr=lr, betas=betas)`) on
    (1/B) Σ ½‖f − y‖² over the minibatches `sgd_batches(len(x), steps, batch_size, batch_seed)`:
    the limit's own batches when `batch_seed` is the limit's `seed`. As the width of `model` grows
    (same `base`), its predictions approach the limit's like width^-½.

    Args:
        model: the plain module at width n (a fresh one: it is parametrized in place).
        base: the same architecture at the base width (the limit's `base`; with real values).
        x: training inputs (N, d), or (N, T, d) for a sequence model; cast to the model's dtype and device.
        y: targets (N, k), or (N,) for one output.
        steps: SGD steps.
        lr: the base learning rate, as `mt.param_groups(model, lr, "sgd")` takes it.
        batch_size: minibatch size (None: full batch).
        batch_seed: the seed of the minibatch order (`FeatureLimit`'s `seed` for its batches).
        momentum: torch.optim.SGD's momentum (no dampening, no Nesterov).
        optimizer: "sgd" or "adam".
        betas: Adam's (β₁, β₂).
        eps: Adam's ε at base width.

    Returns:
        `model`, parametrized and trained.

    Example:
        >>> base = make(16)
        >>> lim = FeatureLimit(make(256), base=base, seed=0).fit(x, y, steps=5, lr=0.1)  # doctest: +SKIP
        >>> net = train_mup(make(4096), base, x, y, steps=5, lr=0.1, batch_seed=0)  # doctest: +SKIP
        >>> net(x_test) - lim.predict(x_test)  # O(4096^-1/2)  # doctest: +SKIP
    """
    if not isinstance(model, nn.Module) or not isinstance(base, nn.Module):
        raise TypeError("model and base must be torch.nn.Module instances (base: the limit's base model)")
    steps = integer(steps, "steps", 0)
    lr = positive(lr, "lr")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be a number in [0, 1) (torch.optim.SGD's), got {momentum!r}")
    if batch_size is not None:
        batch_size = integer(batch_size, "batch_size", 1)
    if isinstance(x, torch.Tensor) and x.dim() > 2:  # sequences (N, T, d)
        xt = x.detach().to(torch.float64)
    else:
        xt = as_inputs(x, "x")
    yt = as_targets(y.reshape(len(y), -1) if isinstance(y, torch.Tensor) and y.dim() > 2 else y, len(xt))
    first = next(model.parameters(), None)
    if first is not None:
        xt, yt = xt.to(first.device, first.dtype), yt.to(first.device, first.dtype)
    opt: torch.optim.Optimizer
    if optimizer == "adam":
        opt = torch.optim.Adam(mup_adam(model, base, lr, float(eps), example=xt[:2]), lr=lr, betas=betas)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(mup_sgd(model, base, lr, example=xt[:2]), lr=lr, momentum=float(momentum))
    else:
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    for idx in sgd_batches(len(xt), steps, batch_size, batch_seed, xt.device):
        f = model(xt[idx])
        f = f.reshape(len(idx), -1)
        if f.shape[1] != yt.shape[1]:
            raise ValueError(
                f"y has {yt.shape[1]} target(s) per input but the model gives {f.shape[1]} output(s); "
                "pass y of shape (N, k) with k the model's outputs"
            )
        loss = 0.5 * (f - yt[idx]).pow(2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
