"""A readable summary of a parametrized model: every parameter, its role and its factors."""

from __future__ import annotations

from torch import nn

from ..rules import optimizer_rule
from .depth import block_pattern
from .groups import group_factors
from .spec import require_spec

__all__ = ["describe"]


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
    header = ("parameter", "shape", "role", "m_in", "m_out") + (("depth", "m_L") if depth else ()) + ("init×",) + cols
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
                f"{spec.init_scales.get(name, 1.0):.4g}",
                *values,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"µP ({spec.formulation}); init rescaled from {spec.init_source}"
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
    if spec.forward_constants:
        lines.append(
            "forward constants: "
            + ", ".join(f"{m or '<model>'} {kind}{c:.4g}" for m, (kind, c) in spec.forward_constants.items())
        )
    elif not spec.branches:
        lines.append("forward constants: none (zero forward overhead)")
    else:
        lines.append(f"forward constants: residual branch multipliers only ({len(spec.branches)})")
    for prefix, (l0, l) in spec.depth.items():

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
        lines.append(
            f"attention {a.module or '<model>'}: q·kᵀ × {a.scale:.4g} (µP: α·s₀·d₀/d, α={alpha:g}, "
            f"d₀={a.d0}, d={a.d}; the model's own was {a.before:.4g}; {change}; {check})"
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
    lines.append("roles from: " + ", ".join(f"{words.get(k, k)} {v}" for k, v in sorted(by_source.items())))
    if spec.zero_init:
        lines.append("zero-initialized: " + ", ".join(spec.zero_init))
    return "\n".join(lines)
