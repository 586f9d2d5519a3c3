"""Optimizer parameter groups with µP's per-parameter lr, Adam ε and weight decay.

`param_groups` returns plain dicts for any torch optimizer (fused/foreach included). Every
group carries ``mup_lr_factor``, its lr relative to the base lr, so schedulers and tools
can check that µP's ratios survive. Schedulers that multiply each group's lr (LambdaLR,
StepLR, CosineAnnealingLR, LinearLR, …) keep the ratios. OneCycleLR and CyclicLR set
every group to one scalar ``max_lr``/``base_lr`` and would erase µP: pass per-group values
from `scaled_lrs`, or build them with `OneCycleLR` here; `check_lr_ratios` catches it.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
from torch import nn

from .rules import DEFAULT_WEIGHT_DECAY_POLICY, WEIGHT_DECAY_POLICIES, optimizer_family
from .shapes import canonical_name
from .spec import find_spec, require_spec

__all__ = ["LR_FACTOR_KEY", "param_groups", "build_optimizer", "SGD", "Adam", "AdamW", "scaled_lrs", "check_lr_ratios",
           "OneCycleLR"]

LR_FACTOR_KEY = "mup_lr_factor"


def param_groups(model: nn.Module, lr: float, optimizer: str = "adam", *,
                 weight_decay: float = 0.0, eps: Optional[float] = None,
                 weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
                 groups: Optional[Iterable[Union[dict, torch.Tensor]]] = None) -> list[dict[str, Any]]:
    """Split the parameters into groups with µP's lr, ε and weight decay for `optimizer`.

    Args:
        model: a model passed through `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate: what a parameter of the base model gets.
        optimizer: "sgd" (momentum, nesterov), "adam", "adamw" (or other Adam-like names).
        weight_decay: base weight decay; a user group's own "weight_decay" wins.
        eps: Adam's ε at base width (torch's 1e-8 when None); scaled like the gradient.
        weight_decay_policy: "lr_wd_constant" (default: wd divided by the lr factor, so that the
            per-step decay lr·wd of every group equals the base model's) or "independent".
        groups: the user's own groups (dicts with "params" and options, or a flat list of
            tensors); each is split further by µP factor and keeps its options.
    """
    spec = require_spec(model, "param_groups")
    family = optimizer_family(optimizer)
    if weight_decay_policy not in WEIGHT_DECAY_POLICIES:
        raise ValueError(f"unknown weight_decay_policy '{weight_decay_policy}'; use one of "
                         f"{', '.join(WEIGHT_DECAY_POLICIES)}")
    if not isinstance(lr, (int, float)) or lr < 0:
        raise ValueError(f"lr must be a non-negative number, got {lr!r}")
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), canonical_name(n))

    if groups is None:
        user_groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    else:
        user_groups = list(groups)
        if user_groups and not isinstance(user_groups[0], dict):
            user_groups = [{"params": user_groups}]
    out: list[dict[str, Any]] = []
    for gi, group in enumerate(user_groups):
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"groups[{gi}] must be a dict with a 'params' entry")
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        options = {k: v for k, v in group.items() if k != "params"}
        g_lr = options.get("lr", lr)
        g_wd = options.get("weight_decay", weight_decay)
        g_eps = options.get("eps", 1e-8 if eps is None else eps)
        split: dict[tuple, dict[str, Any]] = {}
        for p in params:
            name = names.get(id(p))
            if name is None:
                raise ValueError(f"groups[{gi}] holds a parameter of shape {tuple(p.shape)} that is not "
                                 "in the model")
            lr_f, eps_f = spec.factors(name, family)
            wd_f = 1.0 / lr_f if (weight_decay_policy == "lr_wd_constant" and lr_f > 0) else 1.0
            key = (lr_f, eps_f if family == "adam" else 1.0, wd_f)
            if key not in split:
                new = dict(options)
                new["lr"] = g_lr * lr_f if lr_f != 1.0 else g_lr
                new["weight_decay"] = g_wd * wd_f if wd_f != 1.0 else g_wd
                if family == "adam":
                    new["eps"] = g_eps * eps_f if eps_f != 1.0 else g_eps
                new[LR_FACTOR_KEY] = lr_f
                new["params"] = []
                split[key] = new
            split[key]["params"].append(p)
        out.extend(split.values())
    return out


def build_optimizer(model: nn.Module, optimizer: str, lr: float, *, weight_decay: float = 0.0,
                    eps: Optional[float] = None, mup: Optional[bool] = None,
                    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY, groups=None,
                    **kwargs) -> torch.optim.Optimizer:
    """The torch optimizer named `optimizer` ("sgd", "adamw", or another Adam-like name → Adam).

    With `mup` (default: whether the model was parametrized) its groups are `param_groups`' µP
    groups, else every trainable parameter in one group (standard parametrization). Other keyword
    arguments (momentum, betas, …) go to the optimizer. The one place the library builds one.
    """
    family = optimizer_family(optimizer)
    if mup is None:
        mup = find_spec(model) is not None
    if mup:
        pg = param_groups(model, lr, optimizer, weight_decay=weight_decay, eps=eps,
                          weight_decay_policy=weight_decay_policy, groups=groups)
    else:
        pg = list(groups) if groups is not None else [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if family == "sgd":
        return torch.optim.SGD(pg, lr=lr, weight_decay=weight_decay, **kwargs)
    cls = torch.optim.AdamW if optimizer.lower() == "adamw" else torch.optim.Adam
    return cls(pg, lr=lr, weight_decay=weight_decay, **({} if eps is None else {"eps": eps}), **kwargs)


def _named(name: str, cls: type):
    def build(model: nn.Module, lr: float, *, weight_decay: float = 0.0, eps: Optional[float] = None,
              weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY, groups=None, **kwargs):
        return build_optimizer(model, name, lr, weight_decay=weight_decay, eps=eps, mup=True,
                               weight_decay_policy=weight_decay_policy, groups=groups, **kwargs)
    build.__name__ = cls.__name__
    build.__doc__ = (f"torch.optim.{cls.__name__} over `param_groups(model, lr, '{name}', …)`; "
                     "other keyword arguments go to the optimizer.")
    return build


SGD = _named("sgd", torch.optim.SGD)
Adam = _named("adam", torch.optim.Adam)
AdamW = _named("adamw", torch.optim.AdamW)


def scaled_lrs(optimizer: torch.optim.Optimizer, value: float) -> list[float]:
    """`value` × each group's µP lr factor: per-group max_lr for OneCycleLR / CyclicLR."""
    return [value * g.get(LR_FACTOR_KEY, 1.0) for g in optimizer.param_groups]


def check_lr_ratios(optimizer: torch.optim.Optimizer, rtol: float = 1e-6) -> None:
    """Raise ValueError if the groups' lrs no longer stand in µP's ratios (e.g. after OneCycleLR)."""
    groups = [g for g in optimizer.param_groups if LR_FACTOR_KEY in g and g[LR_FACTOR_KEY] > 0]
    if not groups:
        return
    ref = groups[0]["lr"] / groups[0][LR_FACTOR_KEY]
    for i, g in enumerate(groups):
        base = g["lr"] / g[LR_FACTOR_KEY]
        if abs(base - ref) > rtol * max(abs(ref), 1e-30):
            raise ValueError(
                f"optimizer group {i} has lr {g['lr']:.3g}, not µP's factor {g[LR_FACTOR_KEY]:.4g} × the base lr "
                f"{ref:.3g}: a scheduler (OneCycleLR/CyclicLR with a scalar max_lr?) overwrote the per-group "
                "lrs. Pass max_lr=mt.optim.scaled_lrs(optimizer, max_lr) or use mt.optim.OneCycleLR")


def OneCycleLR(optimizer: torch.optim.Optimizer, max_lr: float, **kwargs) -> torch.optim.lr_scheduler.OneCycleLR:
    """torch's OneCycleLR with a scalar `max_lr` spread over the groups by their µP factors."""
    if isinstance(max_lr, (list, tuple)):
        raise TypeError("mt.optim.OneCycleLR takes the base max_lr as one number; it scales it per group")
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=scaled_lrs(optimizer, max_lr), **kwargs)
