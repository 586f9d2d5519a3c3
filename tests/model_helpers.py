"""Shared test helpers: building plain/µP models and measuring coordinate changes (sizes: see
tests/conftest.py's docstring)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt


def build(cls, width: int, base_width: int, seed: int = 0, mup: bool = True, **kw) -> nn.Module:
    """The model at `width`, seeded; in µP relative to `base_width` when `mup`."""
    torch.manual_seed(seed)
    model = cls(width, **kw)
    if mup:
        mt.parametrize(model, base=cls(base_width, **kw), delta=cls(2 * base_width, **kw))
    return model


def make_optimizer(model: nn.Module, optimizer: str, lr: float, mup: bool) -> torch.optim.Optimizer:
    groups = mt.param_groups(model, lr, optimizer) if mup else model.parameters()
    if optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr)
    return torch.optim.Adam(groups, lr=lr)


def coordinate_changes(
    model: nn.Module,
    modules: dict[str, nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: str,
    lr: float,
    mup: bool,
    steps: int = 3,
) -> dict[str, float]:
    """Mean |activation(t) − activation(0)| of each named module's output after `steps` steps."""
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda mod, a, out, n=n: captured.__setitem__(n, out.detach().clone()))
        for n, m in modules.items()
    ]
    opt = make_optimizer(model, optimizer, lr, mup)
    with torch.no_grad():
        model(x)
    start = dict(captured)
    for _ in range(steps):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return {n: (captured[n] - start[n]).abs().mean().item() for n in modules}


def limit_data(n: int = 8, n_test: int = 6, seed: int = 5, d: int = 4):
    """(x, y, x_test) in float64 for the FeatureLimit tests: n training points in d dims, n_test test points."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    return x, y, torch.randn(n_test, d, generator=g, dtype=torch.float64)


def exact_rms(w: torch.Tensor, rms: float) -> None:
    """Gaussian entries scaled to exactly this rms (so a base of width 1 carries the law's variance)."""
    with torch.no_grad():
        nn.init.normal_(w)
        w.mul_(rms / w.pow(2).mean().sqrt())
