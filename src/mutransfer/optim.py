"""Optimizer parameter groups with µP's per-parameter lr, Adam ε and weight decay.

`param_groups` returns plain dicts for any torch optimizer (fused/foreach included). Every
group carries ``mup_lr_factor``, its lr relative to the base lr, so schedulers and tools
can check that µP's ratios survive. Schedulers that multiply each group's lr (LambdaLR,
StepLR, CosineAnnealingLR, LinearLR, …) keep the ratios. OneCycleLR and CyclicLR set
every group to one scalar ``max_lr``/``base_lr`` and would erase µP: pass per-group values
from `scaled_lrs`, or build them with `OneCycleLR` here; `check_lr_ratios` catches it.

(About 500 lines: one documented factory per optimizer family, each a few lines over `build_optimizer`.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import nn

from ._core.groups import (
    ADJUST_KEY,
    MuonGroups,
    check_muon_adjust,
    group_factors,
    hidden_matrices,
    muon_adjust_ratio,
    param_groups,
    plain_groups_holding_mup,
    torch_muon,
)
from ._core.shapes import canonical_name
from ._core.spec import find_spec
from .errors import OptimizerError
from .optimizers import LR_FACTOR_KEY, MuonWithAdamW
from .optimizers import Adafactor as _Adafactor
from .optimizers import Lion as _Lion
from .rules import DEFAULT_WEIGHT_DECAY_POLICY, OPTIMIZERS, optimizer_rule

__all__ = [
    "ADJUST_KEY",
    "LR_FACTOR_KEY",
    "SGD",
    "SOAP",
    "Adafactor",
    "Adam",
    "AdamW",
    "Lion",
    "Muon",
    "MuonGroups",
    "MuonWithAdamW",
    "OneCycleLR",
    "build_optimizer",
    "check_lr_ratios",
    "check_muon_adjust",
    "group_factors",
    "hidden_matrices",
    "muon_adjust_ratio",
    "param_groups",
    "scaled_lrs",
]

# ----------------------------------------------------------------------- ready optimizers
_TORCH_CLASSES = {
    "sgd": "SGD",
    "adam": "Adam",
    "adamw": "AdamW",
    "adamax": "Adamax",
    "nadam": "NAdam",
    "radam": "RAdam",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
}


def _soap_class():
    try:
        from pytorch_optimizer import SOAP as cls
    except ImportError:
        raise ImportError(
            "optimizer 'soap' runs pytorch_optimizer.SOAP: pip install 'mutransfer[optimizers]' (or pytorch-optimizer)"
        ) from None
    return cls


def _plain_groups(model: nn.Module, optimizer: str, groups: Any, hidden: set[str] | None) -> list[Any] | MuonGroups:
    params = list(groups) if groups is not None else [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if OPTIMIZERS[optimizer].partner is None:
        return params
    if hidden is None:
        raise OptimizerError(
            "a Muon run of a model that was not parametrized needs to know its hidden matrices: pass "
            "hidden=mt.optim.hidden_matrices(model, same_model_at_another_width) (or a set of names)"
        )
    names = {id(p): canonical_name(n) for n, p in model.named_parameters()}
    flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    return MuonGroups(
        [{"params": [p for p in flat if names.get(id(p)) in hidden]}],
        [{"params": [p for p in flat if names.get(id(p)) not in hidden]}],
    )


def build_optimizer(
    model: nn.Module,
    optimizer: str,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    mup: bool | None = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    partner_lr: float | None = None,
    partner_betas: tuple[float, float] | None = None,
    hidden: set[str] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """The optimizer named `optimizer` (any name in `rules.OPTIMIZERS`) over the whole model.

    With `mup` (default: whether the model was parametrized) its groups are `param_groups`' µP
    groups, else every trainable parameter in one group (standard parametrization; for Muon,
    `hidden` names the matrices it takes). Other keyword arguments (momentum, betas, nesterov,
    adjust_lr_fn, …) go to the optimizer (Muon: to torch.optim.Muon; `partner_lr` and
    `partner_betas` to its AdamW). The one place the library builds one.

    Args:
        model: the model whose parameters it updates (parametrized or plain).
        optimizer: any name in `rules.OPTIMIZERS` ("sgd", "adam", "adamw", "lion", "adafactor", "muon", "soap", …).
        lr: the base learning rate.
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width (see `param_groups`); None: the optimizer's default.
        mup: use µP's groups; None: whether the model was parametrized.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES`.
        groups: your own parameter groups instead of all of the model's.
        partner_lr: Muon only: the base lr of its AdamW partner (default `lr`).
        partner_betas: Muon only: the betas of its AdamW partner.
        hidden: Muon on a plain model only: the names of the hidden matrices (`hidden_matrices`).
        **kwargs: further keyword arguments of the optimizer.

    Returns:
        The optimizer (for "muon", a `mutransfer.optimizers.MuonWithAdamW`).

    Raises:
        OptimizerError: an unknown optimizer name, a bad argument, or Muon on a plain model without `hidden`.
    """
    optimizer_rule(optimizer)  # a clear error for an unknown name
    name = optimizer.lower()
    if mup is None:
        mup = find_spec(model) is not None
    adjust = kwargs.get("adjust_lr_fn")
    pg: list[dict[str, Any]] | MuonGroups
    if mup:
        pg = param_groups(
            model,
            lr,
            name,
            weight_decay=weight_decay,
            eps=eps,
            weight_decay_policy=weight_decay_policy,
            groups=groups,
            partner_lr=partner_lr,
            adjust_lr_fn=adjust,
        )
    else:
        pg = _plain_groups(model, name, groups, hidden)
    eps_kw: dict[str, Any] = {} if eps is None else {"eps": tuple(eps) if name == "adafactor" else eps}
    partner_kw: dict[str, Any] = {} if partner_betas is None else {"betas": tuple(partner_betas)}
    one = cast("list[dict[str, Any]]", pg)  # every optimizer but Muon: one list of groups
    if name in _TORCH_CLASSES:
        cls = getattr(torch.optim, _TORCH_CLASSES[name])
        return cls(one, lr=lr, weight_decay=weight_decay, **eps_kw, **kwargs)
    if name == "lion":
        return _Lion(one, lr=lr, weight_decay=weight_decay, **kwargs)
    if name == "adafactor":
        return _Adafactor(one, lr=lr, weight_decay=weight_decay, **eps_kw, **kwargs)
    if name == "soap":
        return _soap_class()(one, lr=lr, weight_decay=weight_decay, **eps_kw, **kwargs)
    if name == "muon":
        if not isinstance(pg, MuonGroups):  # param_groups and _plain_groups give Muon its two lists
            raise OptimizerError("optimizer 'muon' needs MuonGroups (hidden matrices + the rest)")
        cls = torch_muon().Muon
        muon = cls(pg.muon, lr=lr, weight_decay=weight_decay, **kwargs) if pg.muon and pg.muon[0]["params"] else None
        adamw = (
            torch.optim.AdamW(
                pg.adamw,
                lr=lr if partner_lr is None else partner_lr,
                weight_decay=weight_decay,
                **eps_kw,
                **partner_kw,
            )
            if pg.adamw and pg.adamw[0]["params"]
            else None
        )
        return MuonWithAdamW(muon, adamw)
    raise OptimizerError(f"no optimizer class for '{optimizer}'")  # every name in OPTIMIZERS has one above


def _ready(
    name: str,
    model: nn.Module,
    lr: float,
    weight_decay: float,
    eps: Any,
    weight_decay_policy: str,
    groups: Iterable[dict | torch.Tensor] | None,
    kwargs: dict[str, Any],
) -> torch.optim.Optimizer:
    """The ready optimizers below: `build_optimizer` with µP on."""
    return build_optimizer(
        model,
        name,
        lr,
        weight_decay=weight_decay,
        eps=eps,
        mup=True,
        weight_decay_policy=weight_decay_policy,
        groups=groups,
        **kwargs,
    )


# Ready optimizers: functions that return an optimizer over a whole parametrized model. The optimizer
# classes torch lacks (Lion, Adafactor with the scaled cap, MuonWithAdamW) live in `mutransfer.optimizers`.


def SGD(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready `torch.optim.SGD` over µP's `param_groups(model, lr, "sgd", …)`.

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer (momentum=, nesterov=, …).

    Returns:
        A ready optimizer.

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("sgd", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def Adam(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready `torch.optim.Adam` over µP's `param_groups(model, lr, "adam", …)`.

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer (betas=, …).

    Returns:
        A ready optimizer.

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("adam", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def AdamW(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready `torch.optim.AdamW` over µP's `param_groups(model, lr, "adamw", …)`.

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer (betas=, …).

    Returns:
        A ready optimizer.

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("adamw", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def Lion(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready Lion optimizer over µP's `param_groups(model, lr, "lion", …)`.

    This is a factory; the optimizer class it builds is `mutransfer.optimizers.Lion`.

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer (betas=, …).

    Returns:
        A ready optimizer (a `mutransfer.optimizers.Lion`).

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("lion", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def Adafactor(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready Adafactor over µP's `param_groups(model, lr, "adafactor", …)`.

    This is a factory; the class it builds is `mutransfer.optimizers.Adafactor` (torch.optim.Adafactor
    with its relative-step cap scaled per group).

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer.

    Returns:
        A ready optimizer (a `mutransfer.optimizers.Adafactor`).

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("adafactor", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def SOAP(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready `pytorch_optimizer.SOAP` over µP's `param_groups(model, lr, "soap", …)` (needs pytorch_optimizer).

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer.

    Returns:
        A ready optimizer.

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("soap", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def Muon(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.0,
    eps: Any = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A ready Muon: `torch.optim.Muon` on the hidden matrices + `torch.optim.AdamW` on the rest, as one optimizer.

    This is a factory; the class it builds is `mutransfer.optimizers.MuonWithAdamW`.

    Args:
        model: a model put in µP by `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate (a parameter of the base model gets it; the others µP's factor × it).
        weight_decay: base weight decay (see `param_groups`).
        eps: ε at base width, scaled per group (see `param_groups`); None: the optimizer's default.
        weight_decay_policy: one of `rules.WEIGHT_DECAY_POLICIES` (see `param_groups`).
        groups: your own parameter groups (dicts or tensors) instead of all of the model's.
        **kwargs: further keyword arguments of the optimizer (partner_lr=, partner_betas= for the AdamW; adjust_lr_fn= as torch's, never double-scaled).

    Returns:
        A ready optimizer (a `mutransfer.optimizers.MuonWithAdamW`).

    Raises:
        OptimizerError: for a model that was not parametrized or a bad argument (see `param_groups`).
    """
    return _ready("muon", model, lr, weight_decay, eps, weight_decay_policy, groups, kwargs)


def scaled_lrs(optimizer: torch.optim.Optimizer, value: float) -> list[float]:
    """`value` × each group's µP lr factor: per-group max_lr for OneCycleLR / CyclicLR.

    Args:
        optimizer: an optimizer over `param_groups`.
        value: the base value (e.g. max_lr).

    Returns:
        One value per group, in the optimizer's group order.
    """
    return [value * g.get(LR_FACTOR_KEY, 1.0) for g in optimizer.param_groups]


def check_lr_ratios(optimizer: torch.optim.Optimizer, rtol: float = 1e-6) -> None:
    """Check that the groups' lrs still stand in µP's ratios (a scheduler may have overwritten them).

    Args:
        optimizer: an optimizer over `param_groups`.
        rtol: relative tolerance of the base lr each group implies.

    Raises:
        OptimizerError: a group's lr is not its µP factor × the base lr (e.g. after OneCycleLR with
            a scalar max_lr), or a group not built by `param_groups` holds parameters whose lr µP scales.
    """
    plain = plain_groups_holding_mup(optimizer)
    if plain:
        i, names = plain[0]
        raise OptimizerError(
            f"optimizer group {i} was not built by mt.param_groups but holds parameters of a µP model "
            f"({', '.join(names[:3])}{' …' if len(names) > 3 else ''}): they all get one lr, not µP's. Build the "
            "optimizer over mt.param_groups(model, lr, optimizer=...) or use mt.optim.AdamW(model, lr=...)"
        )
    groups = [g for g in optimizer.param_groups if LR_FACTOR_KEY in g and g[LR_FACTOR_KEY] > 0]
    if not groups:
        return
    ref = groups[0]["lr"] / groups[0][LR_FACTOR_KEY]
    for i, g in enumerate(groups):
        base = g["lr"] / g[LR_FACTOR_KEY]
        if abs(base - ref) > rtol * max(abs(ref), 1e-30):
            raise OptimizerError(
                f"optimizer group {i} has lr {g['lr']:.3g}, not µP's factor {g[LR_FACTOR_KEY]:.4g} × the base lr "
                f"{ref:.3g}: a scheduler (OneCycleLR/CyclicLR with a scalar max_lr?) overwrote the per-group "
                "lrs. Pass max_lr=mt.optim.scaled_lrs(optimizer, max_lr) or use mt.optim.OneCycleLR"
            )


def OneCycleLR(optimizer: torch.optim.Optimizer, max_lr: float, **kwargs: Any) -> torch.optim.lr_scheduler.OneCycleLR:
    """torch's OneCycleLR with a scalar `max_lr` spread over the groups by their µP factors.

    Args:
        optimizer: an optimizer over `param_groups` (each group carries its µP lr factor).
        max_lr: the base max_lr, one number.
        **kwargs: further arguments of torch.optim.lr_scheduler.OneCycleLR (total_steps=, …).

    Returns:
        The scheduler, with per-group max_lr = `max_lr` × the group's µP factor.

    Raises:
        TypeError: `max_lr` is a list (the per-group values are made here).
    """
    if isinstance(max_lr, (list, tuple)):
        raise TypeError("mt.optim.OneCycleLR takes the base max_lr as one number; it scales it per group")
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=scaled_lrs(optimizer, max_lr), **kwargs)
