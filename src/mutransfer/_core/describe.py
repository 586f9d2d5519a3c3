"""A readable summary of a parametrized model: every parameter, its role and its factors."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..rules import optimizer_rule
from ..scaled_forward import INPUT_ATTR, OUTPUT_ATTR, Side
from .depth import BRANCH_ATTR, block_pattern
from .groups import group_factors
from .spec import MuSpec, require_spec, spec_holder

__all__ = ["describe"]


_ALPHA_WORDS = {
    "alpha_res": "α_res",
    "alpha_res_attn_ratio": "α_res_attn_ratio",
    "alpha_attn_softmax": "α_attn_softmax",
    "alpha_ffn_act": "α_ffn_act",
    "alpha_output": "α_output",
    "alpha_loss_softmax": "α_loss_softmax",
}


def _umup_lines(model: nn.Module, spec: MuSpec, umup, stale: dict[str, str]) -> list[str]:
    """u-µP's scales as installed: its α's, each forward constant with what it is made of, the τ rule's
    branch multipliers, the unit-scaled nonlinearities, the depth rule, the plain stacks it does not apply
    to and every fallback taken."""
    lines = ["u-µP hyperparameters: " + ", ".join(f"{_ALPHA_WORDS[k]} {v:g}" for k, v in umup.hparams.items())]
    if umup.constants:
        lines.append("u-µP forward scales (in effect, folded by mt.export):")
        for m, side, c in umup.constants:
            why = "; ".join(umup.why.get((m, str(side)), []))
            note = f" (NOT in effect: {stale[m]})" if m in stale else ""
            lines.append(f"  {m or '<model>'} {side}{c:.4g}  [{why}]{note}")
    if umup.branches:
        kinds = [k for k, _ in umup.branches.values()]
        lines.append(
            f"τ rule (pre-norm: one multiplier per branch output): {kinds.count('attention')} attention, "
            f"{kinds.count('mlp')} MLP branches; "
            + ", ".join(sorted({f"{k} × {c:.4g}" for k, c in umup.branches.values()}))
        )
    for consumer, fn, sigma in umup.activations:
        lines.append(f"unit {fn}: σ = {sigma:.4g} on the input of {consumer}")
    for prefix, (_, n) in spec.depth.items():
        lines.append(f"depth {prefix or '<model>'}: L={n} blocks: in-block Adam lr and ε × L^-½ (Depth-µP)")
    for prefix, n in (getattr(umup, "plain_stacks", None) or {}).items():  # absent from specs pickled before it
        lines.append(
            f"plain stack {prefix or '<model>'}: L={n} blocks that add nothing onto their input (observed): no "
            "residual stream, so no τ rule and no depth rule apply"
        )
    lines += _folded_lines(model, umup, stale)
    for msg in umup.fallbacks:
        lines.append(f"fallback: {msg}")
    return lines


def _rms_now(p: torch.Tensor) -> str:
    """A parameter's value in words, as it is now (never the value it had at init)."""
    if p.is_meta:
        return "no value yet (meta)"
    if not bool(p.detach().ne(0).any()):
        return "zero now"
    return f"RMS now {float(p.detach().double().pow(2).mean().sqrt()):.4g}"


def _folded_lines(model: nn.Module, umup, stale: dict[str, str]) -> list[str]:
    """What `UMuPPlan.folded` put in effect, observed on the model as it is now.

    Two kinds of entries share ``folded`` (both abc-symmetry shifts): a weight whose multiplier A went into
    its init (no layer carries it: drawn with std A, Adam lr × A, SGD lr × A², ε × 1/A), and a zero bias
    whose layer's scaled-matmul factor A sits on the layer's output (u-µP's scaled matmul), so the bias is
    multiplied by A in the forward and compensated by Adam lr × 1/A, SGD lr × 1/A², ε × A. The bias's
    value is not changed (zero stays zero), so no "std" is printed for it; its layer's output multiplier is
    read off the module (said NOT in effect when it is gone)."""
    root = spec_holder(model) or model
    params = dict(root.named_parameters(remove_duplicate=False))
    shifted = dict(getattr(umup, "shifted", None) or {})
    if not shifted:  # specs pickled before `shifted` existed: a vector-row bias entry is a shift
        shifted = {
            n: n[: -len(".bias")] if n.endswith(".bias") else ""
            for n in umup.folded
            if umup.rows.get(n) in ("vector", "scalar") and n.rsplit(".", 1)[-1] == "bias"
        }
    lines = []
    for name, c in umup.folded.items():
        p = params.get(name)
        now = _rms_now(p) if p is not None else "not a parameter of the model now"
        if name in shifted:
            layer = shifted[name]
            a = 1.0 / c
            try:
                module = root.get_submodule(layer)
                installed = module.__dict__.get(OUTPUT_ATTR)
            except AttributeError:
                installed = None
            if installed is None or layer in stale:
                why = stale.get(layer, "its layer carries no output multiplier now")
                lines.append(
                    f"shifted bias {name}: its layer {layer or '<model>'}'s output multiplier is NOT in effect "
                    f"({why}); its lr and ε still carry the shift (Adam lr × {c:.4g}, ε × {a:.4g}); {now}"
                )
                continue
            lines.append(
                f"shifted bias {name} (abc-symmetry: its init value × 1/A = {c:.4g}; {now}): its layer {layer or '<model>'} "
                f"multiplies its output, bias included, by {float(installed):.4g} (the scaled matmul's {a:.4g}"
                + (
                    f" × {float(installed) / a:.4g} of its other scales"
                    if not math.isclose(float(installed), a, rel_tol=1e-9)
                    else ""
                )
                + f"), compensated in its groups by Adam lr × {c:.4g}, SGD lr × {c * c:.4g}, ε × {a:.4g}"
            )
        else:
            lines.append(
                f"multiplier in the init (no layer carries it): {name} drawn with std {c:.4g} instead of 1 "
                f"({now}); Adam lr × {c:.4g}, SGD lr × {c * c:.4g}, ε × {1.0 / c:.4g}"
            )
    return lines


def describe(model: nn.Module, optimizer: str | None = None, adjust_lr_fn: str | None = None) -> str:
    """Table of every parameter: role, width multipliers, init / lr / ε factors vs the base model.

    Without `optimizer`: the lr factors of SGD and Adam and Adam's ε factor. With one (any name in
    `rules.OPTIMIZERS`): the optimizer that updates each parameter (Muon's AdamW partner shows),
    its lr factor and its ε factors, exactly as `param_groups(model, lr, optimizer)` writes them
    (`adjust_lr_fn`: the torch.optim.Muon setting they are built for)."""
    spec = require_spec(model, "describe")
    depth = bool(spec.depth) and spec.depth_alpha > 0
    if optimizer is not None:
        optimizer_rule(optimizer)  # a clear error for an unknown name
        name_lc = optimizer.lower()
        eps_cols = {c for n in spec.params for c in spec.columns(n, name_lc)[1]}
        eps_head = ("ε×",) if len(eps_cols) <= 1 else ("ε₁×", "ε₂×")
        cols = ("updated by", "lr×") + (eps_head if eps_cols else ())
    else:
        cols = ("sgd lr×", "adam lr×", "adam ε×")
    laws = getattr(spec, "init_laws", {})  # absent from specs pickled before it existed
    rescaled = bool(spec.init_scales)  # eager parametrize rescaled the model's own values (not redrawn since)
    init_cols = (("init×",) if rescaled else ()) + (("µP init law",) if laws else ())
    header = ("parameter", "shape", "role", "m_in", "m_out") + (("depth", "m_L") if depth else ()) + init_cols + cols
    rows = [header]
    for name, info in spec.params.items():
        if optimizer is not None:
            who, lr_f, eps_f = group_factors(spec, name, name_lc, adjust_lr_fn)
            eps_cells = tuple(f"{e:.4g}" for e in eps_f) + ("-",) * (len(eps_head) - len(eps_f)) if eps_cols else ()
            values = (who, f"{lr_f:.4g}") + eps_cells
        else:
            sgd_lr, _ = spec.factors(name, "sgd")
            adam_lr, eps = spec.factors(name, "adam")
            values = (f"{sgd_lr:.4g}", f"{adam_lr:.4g}", f"{eps:.4g}")
        role = info.role + (" (tied readout)" if info.tied_readouts else "")
        where = (
            (info.depth_role.replace("_", " ") if info.depth_role != "outside" else "-", f"{info.m_depth:g}")
            if depth
            else ()
        )
        rows.append(
            (
                name,
                "×".join(map(str, info.shape)),
                role,
                f"{info.m_in:g}",
                f"{info.m_out:g}",
                *where,
                *((f"{spec.init_scales.get(name, 1.0):.4g}",) if rescaled else ()),
                *((laws[name].describe() if name in laws else "-",) if laws else ()),
                *values,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    umup = spec.__dict__.get("umup")
    lines = [
        (
            "u-µP (rules.UMUP: unit-variance weights, factors of the absolute fans)"
            if umup
            else f"µP ({spec.formulation})"
        )
        + f"; {_init_words(spec)}"
        + (
            f"; factors for {optimizer}" + (f" (adjust_lr_fn={adjust_lr_fn})" if adjust_lr_fn else "")
            if optimizer is not None
            else ""
        )
    ]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    stale = _not_in_effect(model, spec)
    if umup is not None:
        lines += _umup_lines(model, spec, umup, stale)
    elif spec.forward_constants:
        lines.append(
            "forward constants: "
            + ", ".join(
                f"{m or '<model>'} {kind}{c:.4g}" + (" (NOT in effect: " + stale[m] + ")" if m in stale else "")
                for m, (kind, c) in spec.forward_constants.items()
            )
        )
    elif not spec.branches:
        lines.append("forward constants: none (zero forward overhead)")
    else:
        lines.append(f"forward constants: residual branch multipliers only ({len(spec.branches)})")
    stale_branches = [m for m in spec.branches if m in stale and m not in spec.forward_constants]
    if stale_branches:
        lines.append(
            "residual branch multipliers NOT in effect: "
            + ", ".join(f"{m} ({stale[m]})" for m in stale_branches[:6])
            + (" …" if len(stale_branches) > 6 else "")
        )
    for prefix, (l0, l) in spec.depth.items() if umup is None else ():

        def inside(names, prefix=prefix):
            return sorted({block_pattern(m) for m in names if m.startswith(f"{prefix}.") or not prefix})

        c = (l / l0) ** -spec.depth_alpha if spec.depth_alpha else 1.0
        how = []
        if inside(spec.branches):
            how.append("forward constant on " + ", ".join(inside(spec.branches)))
        if inside(spec.folded_branches):
            how.append("folded into " + ", ".join(inside(spec.folded_branches)) + " (init × m_L^-α, no overhead)")
        lines.append(
            f"depth {prefix or '<model>'}: L₀={l0} → L={l} (m_L={l / l0:g}), α={spec.depth_alpha:g}: "
            f"residual branch outputs × m_L^-α = {c:.4g}" + (f"; {'; '.join(how)}" if how else "")
        )
    alpha = spec.multipliers.attention
    for a in spec.attention:
        change = "left as it is" if a.how == "unchanged" else f"set through {a.how}"
        if a.how.startswith("query output "):
            change = (
                f"its constant is inline, so {a.how[len('query output ') :]}'s output (q) × {a.target / a.before:.4g}, "
                "which scales q·kᵀ exactly"
            )
        check = (
            "measured on a probe forward"
            if a.verified
            else "NOT measured: no probe forward ran; assumed the module computed 1/√d"
        )
        rule = (
            f"u-µP: α_attn_softmax/d, α={alpha:g}, d={a.d}"
            if umup is not None
            else f"µP: α·s₀·d₀/d, α={alpha:g}, d₀={a.d0}, d={a.d}"
        )
        lines.append(
            f"attention {a.module or '<model>'}: q·kᵀ × {a.scale:.4g} ({rule}; the model's own was {a.before:.4g}; "
            f"{change}; {check})"
        )
    by_source: dict[str, int] = {}
    for info in spec.params.values():
        by_source[info.source] = by_source.get(info.source, 0) + 1
    words = {
        "usage": "observed usage on a probe forward",
        "module": "module type",
        "shape": "shape only",
        "override": "roles= override",
    }
    lines.append(
        "roles from: "
        + ", ".join(f"{words.get(k, k)} ({v} parameter{'s' if v != 1 else ''})" for k, v in sorted(by_source.items()))
    )
    split = {n: getattr(i, "row_roles", ()) for n, i in spec.params.items() if getattr(i, "row_roles", ())}
    for n, ranges in split.items():
        lines.append(
            f"rows of {n} ({spec.params[n].role}, measured on probes at two widths): "
            + ", ".join(f"{r} (init × {r.init_ratio:.4g})" for r in ranges)
            + "; same optimizer group as the weight (see docs/model.md, fused projections)"
        )
    kept = getattr(spec, "kept_values", {})  # absent from specs pickled before it existed
    if kept:
        lines.append(
            "init values kept, not rescaled by rms(base)/rms(model): "
            + ", ".join(f"{n} ({why})" for n, why in list(kept.items())[:8])
            + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
        )
    if spec.zero_init:
        lines.append("zero-initialized: " + ", ".join(spec.zero_init))
    return "\n".join(lines)


def _init_words(spec: MuSpec) -> str:
    """What the model's init values are, in words (never a value that is not in effect)."""
    seed = getattr(spec, "init_seed", None)
    if seed is not None:
        return (
            f"init drawn by mt.init_weights (seed {seed}) from the laws read off the base's values "
            "(mt.check(model) tells whether the values are still µP's)"
        )
    if getattr(spec, "init_pending", False):
        if getattr(spec, "init_laws", {}):
            return "init NOT drawn yet (built on meta): mt.init_weights(model) draws the laws below"
        return "no init values (built on meta and parametrized from shapes only): load them from a checkpoint"
    return f"init rescaled from {spec.init_source}"


def _not_in_effect(model: nn.Module, spec: MuSpec) -> dict[str, str]:
    """Modules whose recorded forward constant or branch multiplier is not installed on the model as
    it is now (the module was replaced or its class changed after `parametrize`): module → why."""
    root = spec_holder(model) or model
    want: dict[str, dict[str, float]] = {}
    for m, (kind, c) in spec.forward_constants.items():
        attr = INPUT_ATTR if kind == Side.INPUT else OUTPUT_ATTR
        want.setdefault(m, {})[attr] = want.get(m, {}).get(attr, 1.0) * c
    for m, c in spec.branches.items():
        want.setdefault(m, {})[OUTPUT_ATTR] = want.get(m, {}).get(OUTPUT_ATTR, 1.0) * c
    out = {}
    for m, attrs in want.items():
        try:
            module = root.get_submodule(m)  # "" is the model itself
        except AttributeError:
            out[m] = "no such module in the model now"
            continue
        if "forward" in module.__dict__:
            out[m] = "its forward is set on the instance"
            continue
        for attr, c in attrs.items():
            have = module.__dict__.get(attr, module.__dict__.get(BRANCH_ATTR) if attr == OUTPUT_ATTR else None)
            if have is None or not math.isclose(float(have), c, rel_tol=1e-9):
                out[m] = "the module was replaced or changed after parametrize"
    return out
