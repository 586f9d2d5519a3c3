"""Optimizer parameter groups with µP's per-parameter lr, Adam ε and weight decay.

`param_groups` returns plain dicts for any torch optimizer (fused/foreach included). Every
group carries ``mup_lr_factor``, its lr relative to the base lr, so schedulers and tools
can check that µP's ratios survive. Schedulers that multiply each group's lr (LambdaLR,
StepLR, CosineAnnealingLR, LinearLR, …) keep the ratios. OneCycleLR and CyclicLR set
every group to one scalar ``max_lr``/``base_lr`` and would erase µP: pass per-group values
from `scaled_lrs`, or build them with `OneCycleLR` here; `check_lr_ratios` catches it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from ._core.shapes import canonical_name
from ._core.spec import MuSpec, find_spec, require_spec
from .errors import OptimizerError
from .optimizers import LR_FACTOR_KEY, MuonWithAdamW
from .optimizers import Adafactor as _Adafactor
from .optimizers import Lion as _Lion
from .rules import DEFAULT_WEIGHT_DECAY_POLICY, OPTIMIZERS, WEIGHT_DECAY_POLICIES, optimizer_rule

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

ADJUST_KEY = "mup_adjust_lr_fn"  # the torch.optim.Muon adjust_lr_fn a Muon group's lr factor was built for
MUON_ADJUST_FNS = (None, "original", "match_rms_adamw")


class MuonGroups(NamedTuple):
    """The two lists of groups a Muon run needs: ``torch.optim.Muon(groups.muon, ...)`` for the
    hidden matrices and ``torch.optim.AdamW(groups.adamw, ...)`` for everything else. Unpacks
    as ``muon_groups, adamw_groups = mt.param_groups(model, lr, "muon")``."""

    muon: list[dict[str, Any]]
    adamw: list[dict[str, Any]]


def muon_adjust_ratio(shape: tuple[int, ...], base_shape: tuple[int, ...], adjust_lr_fn: str | None) -> float:
    """How much torch.optim.Muon's own lr adjustment (`adjust_lr_fn`) grows from the base shape to
    `shape`: the part of the spectral µP factor torch already applies. Read from torch itself
    ("original": √max(1, rows/cols); "match_rms_adamw": 0.2·√max(rows, cols))."""
    adjust = _torch_muon()._adjust_lr
    return adjust(1.0, adjust_lr_fn, torch.Size(shape)) / adjust(1.0, adjust_lr_fn, torch.Size(base_shape))


def _torch_muon():
    """torch's Muon module (torch.optim._muon: the Muon class and its lr adjustment), or a clear error."""
    try:
        from torch.optim import _muon
    except ImportError:
        raise ImportError(
            f"optimizer 'muon' needs torch.optim.Muon (torch >= 2.9); this is torch {torch.__version__}"
        ) from None
    return _muon


def group_factors(
    spec: MuSpec, name: str, optimizer: str, adjust_lr_fn: str | None = None
) -> tuple[str, float, tuple[float, ...]]:
    """(the optimizer that updates `name`, its lr factor, its ε factors) under `optimizer`: the
    rules' width × depth factors, and for Muon divided by the growth of torch's own lr adjustment
    (`muon_adjust_ratio`), so that the step's total scaling is µP's. What `param_groups` writes
    and `describe(model, optimizer=...)` prints."""
    who = spec.updater(name, optimizer)
    lr_f, *eps_f = spec.factors(name, optimizer)
    if who == "muon":
        info = spec.params[name]
        lr_f /= muon_adjust_ratio(info.shape, spec.shapes.params[info.base_name or name].base, adjust_lr_fn)
    return who, lr_f, tuple(eps_f) if spec.columns(name, optimizer)[1] else ()


def _check_adjust(adjust_lr_fn) -> None:
    if adjust_lr_fn not in MUON_ADJUST_FNS:
        raise OptimizerError(
            f"adjust_lr_fn must be one of torch.optim.Muon's: None/'original' (lr·√max(1, rows/cols)) "
            f"or 'match_rms_adamw' (lr·0.2·√max(rows, cols)), got {adjust_lr_fn!r}"
        )


def _eps_base(optimizer: str, eps, p: torch.Tensor) -> tuple:
    """The base-width ε value(s) of one parameter, as the optimizer takes them."""
    if optimizer == "adafactor":
        eps1, eps2 = (None, 1e-3) if eps is None else eps
        return (torch.finfo(p.dtype).eps if eps1 is None else eps1, eps2)
    return (1e-8 if eps is None else eps,)


def param_groups(
    model: nn.Module,
    lr: float,
    optimizer: str = "adam",
    *,
    weight_decay: float = 0.0,
    eps=None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups: Iterable[dict | torch.Tensor] | None = None,
    partner_lr: float | None = None,
    adjust_lr_fn: str | None = None,
) -> list[dict[str, Any]] | MuonGroups:
    """Split the parameters into groups with µP's lr, ε and weight decay for `optimizer`.

    Args:
        model: a model passed through `mt.parametrize` (or a torch.compile / DDP / FSDP wrapper).
        lr: the base learning rate: what a parameter of the base model gets.
        optimizer: any name in `rules.OPTIMIZERS`: "sgd" (momentum, nesterov), "adam", "adamw" (and
            Adam's relatives), "lion", "adafactor" (torch.optim.Adafactor), "muon" (returns
            `MuonGroups`: lists for torch.optim.Muon and torch.optim.AdamW), "soap"
            (pytorch_optimizer.SOAP).
        weight_decay: base weight decay; a user group's own "weight_decay" wins.
        eps: ε at base width, scaled per group as the optimizer's rule says: Adam's ε (torch's 1e-8
            when None), SOAP's (1e-8), Adafactor's pair (ε₁, ε₂) (torch's (None → machine ε, 1e-3)).
            Lion has none; Muon's guards a norm division and is not scaled (its AdamW partner's is).
        weight_decay_policy: "lr_wd_constant" (default: wd divided by the lr factor, so that the
            per-step decay lr·wd of every group equals the base model's) or "independent".
        groups: the user's own groups (dicts with "params" and options, or a flat list of
            tensors); each is split further by µP factor and keeps its options.
        partner_lr: Muon only: the base lr of its AdamW partner (default: `lr`).
        adjust_lr_fn: Muon only: the `adjust_lr_fn` the torch.optim.Muon will run with. Its growth
            with the shape is divided out of the µP factor, so the two never both scale the step;
            the groups record it and a mismatch raises at the first step (`check_muon_adjust`).
    """
    spec = require_spec(model, "param_groups")
    rule = optimizer_rule(optimizer)
    name_lc = optimizer.lower()
    if weight_decay_policy not in WEIGHT_DECAY_POLICIES:
        raise OptimizerError(
            f"unknown weight_decay_policy '{weight_decay_policy}'; use one of {', '.join(WEIGHT_DECAY_POLICIES)}"
        )
    if not isinstance(lr, (int, float)) or lr < 0:
        raise OptimizerError(f"lr must be a non-negative number, got {lr!r}")
    if partner_lr is not None and (rule.partner is None or not isinstance(partner_lr, (int, float)) or partner_lr < 0):
        raise OptimizerError(
            f"partner_lr is the base lr of Muon's AdamW partner (a non-negative number); "
            f"got {partner_lr!r} with optimizer '{optimizer}'"
        )
    if name_lc == "muon":
        _check_adjust(adjust_lr_fn)
    elif adjust_lr_fn is not None:
        raise OptimizerError(f"adjust_lr_fn belongs to torch.optim.Muon; optimizer '{optimizer}' has none")
    if name_lc == "lion" and eps is not None:
        raise OptimizerError("Lion has no ε (its step is a sign); drop eps=")
    if name_lc == "adafactor" and eps is not None and not (isinstance(eps, (tuple, list)) and len(eps) == 2):
        raise OptimizerError(f"Adafactor's eps is a pair (ε₁, ε₂) as torch.optim.Adafactor takes it, got {eps!r}")
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), canonical_name(n))

    if groups is None:
        user_groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    else:
        user_groups = list(groups)
        if user_groups and not isinstance(user_groups[0], dict):
            user_groups = [{"params": user_groups}]
    out: dict[str, list[dict[str, Any]]] = {}
    for gi, group in enumerate(user_groups):
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"groups[{gi}] must be a dict with a 'params' entry")
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        options = {k: v for k, v in group.items() if k != "params"}
        g_wd = options.get("weight_decay", weight_decay)
        split: dict[tuple, dict[str, Any]] = {}
        for p in params:
            name = names.get(id(p))
            if name is None:
                raise OptimizerError(
                    f"groups[{gi}] holds a parameter of shape {tuple(p.shape)} that is not in the model"
                )
            who, lr_f, eps_f = group_factors(spec, name, name_lc, adjust_lr_fn)
            g_lr = options.get("lr", partner_lr if (who != name_lc and partner_lr is not None) else lr)
            wd_f = 1.0 / lr_f if (weight_decay_policy == "lr_wd_constant" and lr_f > 0) else 1.0
            eps_cols = spec.columns(name, name_lc)[1]
            g_eps = options.get("eps", eps)  # Muon: its AdamW partner's
            eps_v = None
            if eps_cols:
                base = _eps_base(who, g_eps, p)
                eps_v = tuple(b * f if f != 1.0 else b for b, f in zip(base, eps_f))
            key = (who, lr_f, eps_v, wd_f)
            if key not in split:
                new = dict(options)
                new["lr"] = g_lr * lr_f if lr_f != 1.0 else g_lr
                new["weight_decay"] = g_wd * wd_f if wd_f != 1.0 else g_wd
                if eps_v is not None:
                    new["eps"] = eps_v if who == "adafactor" else eps_v[0]
                if who == "muon":
                    new[ADJUST_KEY] = "original" if adjust_lr_fn is None else adjust_lr_fn
                new[LR_FACTOR_KEY] = lr_f
                new["params"] = []
                split[key] = new
            split[key]["params"].append(p)
        for (who, *_), g in split.items():
            out.setdefault(who, []).append(g)
    if rule.partner is not None:
        _register_muon_guard()
        return MuonGroups(out.get(name_lc, []), out.get(rule.partner, []))
    return out.get(name_lc, [])


def hidden_matrices(model: nn.Module, other: nn.Module) -> set[str]:
    """Names of the 2-D parameters of `model` whose two dims both differ in `other`, the same
    architecture at another width: the hidden matrices, found from shapes alone (for a model in
    standard parametrization, where Muon still needs to know which parameters are its)."""
    theirs = {canonical_name(n): tuple(p.shape) for n, p in other.named_parameters()}
    out = set()
    for n, p in model.named_parameters():
        o = theirs.get(canonical_name(n))
        if p.ndim == 2 and o is not None and len(o) == 2 and o[0] != p.shape[0] and o[1] != p.shape[1]:
            out.add(canonical_name(n))
    return out


# ----------------------------------------------------------------------- the adjust_lr_fn guard
_GUARD = None


def check_muon_adjust(optimizer: torch.optim.Optimizer) -> None:
    """Raise ValueError if a Muon group built by `param_groups` runs with another `adjust_lr_fn`
    than its lr factor was built for (both would scale the step: double scaling, or none).
    Runs by itself before every torch.optim.Muon step once µP Muon groups exist."""
    for i, g in enumerate(optimizer.param_groups):
        want = g.get(ADJUST_KEY)
        if want is None:
            continue
        have = g.get("adjust_lr_fn") or "original"
        if have != want:
            raise OptimizerError(
                f"torch.optim.Muon group {i} runs adjust_lr_fn={g.get('adjust_lr_fn')!r}, but its µP lr factor "
                f"{g.get(LR_FACTOR_KEY, 1.0):.4g} was built for adjust_lr_fn={want!r}: the factor already holds "
                "the width dependence of the adjustment it was built for, so running another would scale the "
                f"step twice (or not at all). Pass adjust_lr_fn={g.get('adjust_lr_fn')!r} to mt.param_groups, "
                f"or build torch.optim.Muon with adjust_lr_fn={want!r}"
            )


def _muon_guard_hook(optimizer, args, kwargs):
    if isinstance(optimizer, getattr(torch.optim, "Muon", ())):
        check_muon_adjust(optimizer)
    return None


def _register_muon_guard() -> None:
    global _GUARD
    if _GUARD is None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _GUARD = register_optimizer_step_pre_hook(_muon_guard_hook)


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


def _plain_groups(model: nn.Module, optimizer: str, groups, hidden: set[str] | None):
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
    eps=None,
    mup: bool | None = None,
    weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
    groups=None,
    partner_lr: float | None = None,
    partner_betas: tuple[float, float] | None = None,
    hidden: set[str] | None = None,
    **kwargs,
) -> torch.optim.Optimizer:
    """The optimizer named `optimizer` (any name in `rules.OPTIMIZERS`) over the whole model.

    With `mup` (default: whether the model was parametrized) its groups are `param_groups`' µP
    groups, else every trainable parameter in one group (standard parametrization; for Muon,
    `hidden` names the matrices it takes). Other keyword arguments (momentum, betas, nesterov,
    adjust_lr_fn, …) go to the optimizer (Muon: to torch.optim.Muon; `partner_lr` and
    `partner_betas` to its AdamW). The one place the library builds one.
    """
    optimizer_rule(optimizer)  # a clear error for an unknown name
    name = optimizer.lower()
    if mup is None:
        mup = find_spec(model) is not None
    adjust = kwargs.get("adjust_lr_fn")
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
    eps_kw = {} if eps is None else {"eps": tuple(eps) if name == "adafactor" else eps}
    if name in _TORCH_CLASSES:
        cls = getattr(torch.optim, _TORCH_CLASSES[name])
        return cls(pg, lr=lr, weight_decay=weight_decay, **eps_kw, **kwargs)
    if name == "lion":
        return _Lion(pg, lr=lr, weight_decay=weight_decay, **kwargs)
    if name == "adafactor":
        return _Adafactor(pg, lr=lr, weight_decay=weight_decay, **eps_kw, **kwargs)
    if name == "soap":
        return _soap_class()(pg, lr=lr, weight_decay=weight_decay, **eps_kw, **kwargs)
    if name == "muon":
        cls = _torch_muon().Muon
        muon = cls(pg.muon, lr=lr, weight_decay=weight_decay, **kwargs) if pg.muon and pg.muon[0]["params"] else None
        adamw = (
            torch.optim.AdamW(
                pg.adamw,
                lr=lr if partner_lr is None else partner_lr,
                weight_decay=weight_decay,
                **eps_kw,
                **({} if partner_betas is None else {"betas": tuple(partner_betas)}),
            )
            if pg.adamw and pg.adamw[0]["params"]
            else None
        )
        return MuonWithAdamW(muon, adamw)
    raise OptimizerError(f"no optimizer class for '{optimizer}'")  # every name in OPTIMIZERS has one above


def _named(name: str, what: str):
    def build(
        model: nn.Module,
        lr: float,
        *,
        weight_decay: float = 0.0,
        eps=None,
        weight_decay_policy: str = DEFAULT_WEIGHT_DECAY_POLICY,
        groups=None,
        **kwargs,
    ):
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

    build.__name__ = build.__qualname__ = what.split(" ")[0].split(".")[-1]
    build.__doc__ = (
        f"{what} over `param_groups(model, lr, '{name}', …)` of a parametrized model; other keyword "
        "arguments go to the optimizer."
    )
    return build


SGD = _named("sgd", "torch.optim.SGD (momentum=, nesterov=)")
Adam = _named("adam", "torch.optim.Adam")
AdamW = _named("adamw", "torch.optim.AdamW")
Lion = _named("lion", "mutransfer.optimizers.Lion")
Adafactor = _named("adafactor", "mutransfer.optimizers.Adafactor (torch.optim.Adafactor with the µP-scaled cap)")
SOAP = _named("soap", "pytorch_optimizer.SOAP")
Muon = _named(
    "muon",
    "torch.optim.Muon (hidden matrices) + torch.optim.AdamW (the rest), as one MuonWithAdamW "
    "(partner_lr=, partner_betas= for the AdamW; adjust_lr_fn= as torch's, never double-scaled)",
)


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
            raise OptimizerError(
                f"optimizer group {i} has lr {g['lr']:.3g}, not µP's factor {g[LR_FACTOR_KEY]:.4g} × the base lr "
                f"{ref:.3g}: a scheduler (OneCycleLR/CyclicLR with a scalar max_lr?) overwrote the per-group "
                "lrs. Pass max_lr=mt.optim.scaled_lrs(optimizer, max_lr) or use mt.optim.OneCycleLR"
            )


def OneCycleLR(optimizer: torch.optim.Optimizer, max_lr: float, **kwargs) -> torch.optim.lr_scheduler.OneCycleLR:
    """torch's OneCycleLR with a scalar `max_lr` spread over the groups by their µP factors."""
    if isinstance(max_lr, (list, tuple)):
        raise TypeError("mt.optim.OneCycleLR takes the base max_lr as one number; it scales it per group")
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=scaled_lrs(optimizer, max_lr), **kwargs)
