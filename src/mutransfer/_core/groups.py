"""µP's optimizer parameter groups: per-parameter lr, ε and weight decay (`param_groups`), and Muon's.

What `mt.param_groups` (re-exported by `mutransfer.optim`) computes from a model's `MuSpec`:
`group_factors` per parameter, `MuonGroups` for a Muon run (with torch's own `adjust_lr_fn`
divided out, `muon_adjust_ratio`, and the guard `check_muon_adjust` that runs before every
torch.optim.Muon step), `hidden_matrices` for a model in standard parametrization.
"""

from __future__ import annotations

import types
import warnings
import weakref
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import ModelError, MuPWarning, OptimizerError
from ..optimizers import LR_FACTOR_KEY
from ..rules import DEFAULT_WEIGHT_DECAY_POLICY, WEIGHT_DECAY_POLICIES, optimizer_rule
from .shapes import canonical_name
from .spec import MuSpec, require_spec

__all__ = [
    "ADJUST_KEY",
    "MUON_ADJUST_FNS",
    "MUP_MARK",
    "MuonGroups",
    "check_muon_adjust",
    "check_unchanged",
    "group_factors",
    "hidden_matrices",
    "mark_parameters",
    "muon_adjust_ratio",
    "param_groups",
    "plain_groups_holding_mup",
    "register_muon_guard",
    "register_plain_guard",
    "torch_muon",
]

MUP_MARK = "_mutransfer_mup"  # on a parameter µP gives an lr factor other than 1: its canonical name
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
    adjust = torch_muon()._adjust_lr
    return adjust(1.0, adjust_lr_fn, torch.Size(shape)) / adjust(1.0, adjust_lr_fn, torch.Size(base_shape))


def torch_muon() -> types.ModuleType:
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
    eps: Any = None,
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
    names: dict[int, str] = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), canonical_name(n))
    check_unchanged(spec, model, "param_groups")

    user_groups: list[Any]
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
                new: dict[str, Any] = dict(options)
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
        register_muon_guard()
        return MuonGroups(out.get(name_lc, []), out.get(rule.partner, []))
    return out.get(name_lc, [])


def check_unchanged(spec: MuSpec, model: nn.Module, caller: str) -> None:
    """Raise if `model` has parameters `parametrize` never saw, or whose shape changed since (a layer
    added or replaced after `parametrize`): their init and lr factors would be missing or stale.

    Args:
        spec: the model's `MuSpec`.
        model: the model (or a wrapper of it).
        caller: the function's name, for the message.

    Raises:
        ModelError: a parameter is new or has another shape than `parametrize` recorded.
    """
    for n, p in model.named_parameters():
        name = canonical_name(n)
        info = spec.params.get(name)
        if info is None:
            raise ModelError(
                f"{caller}: parameter '{name}' (shape {tuple(p.shape)}) was added after mt.parametrize, so it has no "
                "µP role, init or lr factor; build the model with it and call mt.parametrize again"
            )
        if tuple(p.shape) != tuple(info.shape) and not p.is_meta and p.numel() > 0 and _unflattened(p, info):
            raise ModelError(
                f"{caller}: parameter '{name}' has shape {tuple(p.shape)}, but mt.parametrize recorded "
                f"{tuple(info.shape)}: its layer was replaced after parametrize and its µP factors are stale; "
                "build the model with the new layer and call mt.parametrize again"
            )


def _unflattened(p: torch.Tensor, info: Any) -> bool:
    """False for a parameter a sharding wrapper flattened (FSDP: one flat 1-D shard of the recorded tensor)."""
    return not (p.ndim == 1 and len(info.shape) != 1)


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


def _muon_guard_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    muon = getattr(torch.optim, "Muon", None)
    if muon is not None and isinstance(optimizer, muon):
        check_muon_adjust(optimizer)
    return None


def register_muon_guard() -> None:
    """Run `check_muon_adjust` before every torch.optim.Muon step (registered once, process-wide)."""
    global _GUARD
    if _GUARD is None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _GUARD = register_optimizer_step_pre_hook(_muon_guard_hook)


# ----------------------------------------------------------------------- the plain-optimizer guard
_PLAIN_GUARD = None
_CHECKED: weakref.WeakSet = weakref.WeakSet()


def mark_parameters(model: nn.Module, spec: MuSpec) -> None:
    """Mark the parameters of a parametrized model whose µP lr differs from the base lr (under SGD or
    Adam) with their name, so that an optimizer built over them without `param_groups` is noticed."""
    for n, p in model.named_parameters():
        name = canonical_name(n)
        if name in spec.params and any(spec.factors(name, o)[0] != 1.0 for o in ("sgd", "adam")):
            setattr(p, MUP_MARK, name)


def plain_groups_holding_mup(optimizer: torch.optim.Optimizer) -> list[tuple[int, list[str]]]:
    """(group index, µP parameter names) of every optimizer group that was not built by `param_groups`
    but holds parameters of a µP model whose lr µP scales: a plain optimizer over a µP model."""
    out = []
    for i, g in enumerate(optimizer.param_groups):
        if LR_FACTOR_KEY in g:
            continue
        names = [getattr(p, MUP_MARK) for p in g["params"] if hasattr(p, MUP_MARK)]
        if names:
            out.append((i, names))
    return out


def _plain_guard_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if optimizer in _CHECKED:
        return None
    _CHECKED.add(optimizer)
    found = plain_groups_holding_mup(optimizer)
    if found:
        i, names = found[0]
        warnings.warn(
            f"{type(optimizer).__name__} group {i} holds parameters of a µP model ({', '.join(names[:3])}"
            f"{' …' if len(names) > 3 else ''}) with one lr for all, not µP's per-parameter lrs (hidden and readout "
            "weights need lr × 1/m): build the optimizer over mt.param_groups(model, lr, optimizer=...) or use "
            "mt.optim.AdamW(model, lr=...) (and its relatives)",
            MuPWarning,
            stacklevel=3,
        )
    return None


def register_plain_guard() -> None:
    """Check once per optimizer, before its first step, that the µP parameters it steps are in groups
    built by `param_groups` (registered once, process-wide; a warning names the parameters)."""
    global _PLAIN_GUARD
    if _PLAIN_GUARD is None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _PLAIN_GUARD = register_optimizer_step_pre_hook(_plain_guard_hook)
