"""Attention for `parametrize`: the base model's head dims and scales, the plan, and its verified install.

`base_attention` walks once from each module of the model to its base module's data (head dim d₀,
measured logit scale s₀); `plan_attention` decides how every attention module gets µP's logit scale
α·s₀·d₀/d (measured on the probe forward through `plan`, in the order `attention` describes, or
assumed from attributes without one);
`install_attention` applies the plan, measures it on a second probe forward, and undoes it and
raises on any mismatch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..errors import ModelError, MuPWarning
from . import attention as attn
from .depth import DepthMap
from .naming import canonical_name
from .observation import AttentionCall, Observation
from .observe import observe
from .shapes import WidthShapes

__all__ = ["BaseHead", "base_attention", "install_attention", "plan", "plan_attention"]


@dataclass(frozen=True)
class BaseHead:
    """What the base model says about one attention module of the model (found once, by its base name)."""

    d0: int | None  # the base head dim (attn_base_head_dim when given), None when unknown
    measured: tuple[int, float] | None  # (d₀, s₀) measured on the base's probe forward, if it agrees with d0


def base_attention(
    model: nn.Module, shapes: WidthShapes, depth: DepthMap, override_d0: int | None
) -> dict[str, BaseHead]:
    """Every module of `model` → its base module's head dim and measured logit scale: the one walk from
    the model back to the base model's data that both attention paths (probed or not) read."""
    out: dict[str, BaseHead] = {}
    for n, _ in model.named_modules():
        name = canonical_name(n)
        bname = depth.to_base(name)
        measured = shapes.attention_scales.get(bname)
        if measured is not None and override_d0 not in (None, measured[0]):
            measured = None
        d0 = override_d0 if override_d0 is not None else shapes.attention_head_dims.get(bname)
        out[name] = BaseHead(d0, measured)
    return out


def plan_attention(
    model: nn.Module, seen: Observation, base: dict[str, BaseHead], alpha: float, absolute: bool = False
) -> list[attn.AttentionFix]:
    """The attention modules to rescale, from the probe forward (or, without one, attributes).

    `absolute` (u-µP): the target is α/d at every head dim, whatever the base computes — written as a
    base "head dim" d₀ = 1 with logit scale s₀ = 1, so that α·s₀·d₀/d = α/d everywhere the scale is kept.
    """
    if absolute and seen.ran:
        return plan(
            model,
            seen.attention_by_module(),
            lambda name, d, s: (1, 1.0),
            alpha,
            lambda: observe(model, seen.inputs).attention_by_module(),
            seen.output_uses,
        )
    if not seen.ran:
        heads = {n: b.d0 for n, b in base.items() if b.d0 is not None}
        fixes = attn.legacy_plan(model, heads, alpha)
        if any(f.how != "unchanged" for f in fixes):
            warnings.warn(
                f"no probe forward ran ({seen.error}), so the attention scales of "
                f"{', '.join(f.name or '<model>' for f in fixes)} are set by assuming that each computes "
                f"1/√d, not measured. Pass example_inputs= to parametrize to have them measured and "
                f"verified",
                MuPWarning,
                stacklevel=3,
            )
        return fixes

    def base_logit_scale(name: str, d: int, s: float) -> tuple[int, float]:
        known = base.get(name, BaseHead(None, None))
        if known.measured is not None:
            return known.measured
        if known.d0 is None:
            raise ModelError(
                f"attention module '{name}' computes attention at head dim {d} but its base head dim is unknown (the "
                f"base model's probe forward did not reach it); pass attn_base_head_dim=<head dim of the base "
                f"model>, example_inputs= that run the base model, or attention=False if the model already "
                f"scales its logits the µP way"
            )
        if not math.isclose(s, 1.0 / math.sqrt(d), rel_tol=1e-6):
            raise ModelError(
                f"attention module '{name}' computes q·kᵀ × {s:.4g} at head dim {d}, not 1/√d, and the base model's "
                f"scale was not measured (base_shapes without attention scales, or a base that could not run): "
                f"pass base= (a real or meta model) with example_inputs=, or save the shapes with this version"
            )
        return int(known.d0), 1.0 / math.sqrt(known.d0)

    def probe() -> dict[str, list[AttentionCall]]:
        return observe(model, seen.inputs).attention_by_module()

    return plan(model, seen.attention_by_module(), base_logit_scale, alpha, probe, seen.output_uses)


_SKIP_ATTR_WORDS = ("drop", "eps", "theta", "factor_init", "std", "range")


def _candidates(module: nn.Module) -> list[str]:
    """Float attributes that might multiply (or divide) the logits: the perturbation test decides."""
    return [
        k
        for k, v in vars(module).items()
        if type(v) is float
        and v > 0
        and not k.startswith("_mutransfer")
        and not any(w in k.lower() for w in _SKIP_ATTR_WORDS)
    ]


def plan(
    model: nn.Module,
    calls: dict[str, list[AttentionCall]],
    base_scale: Callable[[str, int, float], tuple[int, float]],
    alpha: float,
    probe: Callable[[], dict[str, list[AttentionCall]] | None],
    output_uses: dict[str, int] | None = None,
) -> list[attn.AttentionFix]:
    """How to give every observed attention module µP's logit scale α·s₀·d₀/d, before any change.

    `calls`: the target's attention calls by module (from a probe forward); `base_scale(name, d, s)`
    returns (d₀, s₀) of the base model's module; `probe()` re-runs the forward (for the
    perturbation test that finds the float attribute holding the scale, if any); `output_uses`:
    how many ops each module's output went into on the probe (a query projection whose output
    feeds q alone may carry the correction).
    """
    modules = {canonical_name(n): m for n, m in model.named_modules()}
    fixes: list[attn.AttentionFix] = []
    for name, found in calls.items():
        ds = {c.head_dim for c in found}
        scales = {round(c.scale, 12) for c in found}
        if len(ds) > 1 or len(scales) > 1:
            raise ModelError(
                f"attention module '{name}' computes attention {len(found)} times with different head "
                f"dims or scales ({sorted(ds)}, {sorted(scales)}); mutransfer gives one µP scale per "
                f"module: compute each attention in its own submodule"
            )
        d, s = found[0].head_dim, found[0].scale
        d0, s0 = base_scale(name, d, s)
        target = alpha * s0 * d0 / d
        module = modules.get(name, model)
        if math.isclose(target, s, rel_tol=1e-9):
            fixes.append(attn.AttentionFix(module, name, "unchanged", d0, d, s, target))
            continue
        kinds = {c.kind for c in found}
        if isinstance(module, nn.MultiheadAttention):
            if module.add_zero_attn:
                raise ModelError(
                    f"nn.MultiheadAttention '{name}' uses add_zero_attn=True, which mutransfer's µP "
                    "attention does not support"
                )
            how = "mha"
        elif attn.calls_helper(module):
            how = "helper"
        else:
            how = "sdpa" if kinds == {"sdpa"} else "eager"
        query = _query_source(found, modules, output_uses)
        fixes.append(
            attn.AttentionFix(module, name, how, d0, d, s, target, query=query, query_module=modules.get(query or "\0"))
        )
    _find_attributes([f for f in fixes if f.how in ("sdpa", "eager")], probe)
    for f in fixes:
        if f.how == "eager" and f.query is not None:
            f.how = f"query output {f.query}"
    for f in fixes:
        if f.how == "eager":
            raise ModelError(
                f"attention module '{f.name}' ({type(f.module).__name__}) computes its logits as q·kᵀ × {f.before:.4g} "
                f"(head dim {f.d}) with a constant mutransfer cannot reach from outside (no float attribute holds it; "
                f"µP needs {f.target:.4g} = α·s₀·d₀/d with d₀={f.d0}). Write the scale as "
                f"`mt.attn_scale(self, head_dim)` in its forward (it returns 1/√d until the model is parametrized), "
                f"keep it in a float attribute such as `self.scaling`, or call "
                f"F.scaled_dot_product_attention; pass attention=False only if the model already scales its "
                f"logits the µP way"
            )
    return fixes


def _query_source(
    found: list[AttentionCall], modules: dict[str, nn.Module], output_uses: dict[str, int] | None
) -> str | None:
    """The module whose output is q in every call of an attention module, when a multiplier on that output
    scales q·kᵀ and nothing else: a leaf module (a projection or a QK-norm) that does not also give k, whose
    output goes into one op only. Else None."""
    sources = {(c.query, c.key) for c in found}
    if len(sources) != 1 or output_uses is None:
        return None
    q, k = sources.pop()
    module = modules.get(q) if q is not None else None
    if q is None or module is None or q == k or list(module.children()) or output_uses.get(q) != 1:
        return None
    return q


def _find_attributes(fixes: list[attn.AttentionFix], probe) -> None:
    """Perturbation test: ×2 on a candidate attribute that doubles (halves) the measured scale holds it."""
    pending = {id(f.module): (f, _candidates(f.module)) for f in fixes}
    k = 0
    while any(len(c) > k for _, c in pending.values()):
        changed = []
        for f, cands in pending.values():
            if f.attr is None and len(cands) > k:
                value = getattr(f.module, cands[k])
                setattr(f.module, cands[k], value * 2.0)
                changed.append((f, cands[k], value))
        if not changed:
            break
        try:
            seen = probe()
        finally:
            for f, attr, value in changed:
                setattr(f.module, attr, value)
        if seen is None:
            return
        for f, attr, _ in changed:
            now = seen.get(f.name)
            if not now:
                continue
            if math.isclose(now[0].scale, 2.0 * f.before, rel_tol=1e-6):
                f.attr, f.divides, f.how = attr, False, f"attribute {attr}"
            elif math.isclose(now[0].scale, 0.5 * f.before, rel_tol=1e-6):
                f.attr, f.divides, f.how = attr, True, f"attribute {attr}"
        k += 1


def install_attention(
    model: nn.Module, fixes: list[attn.AttentionFix], alpha: float, seen: Observation
) -> list[attn.AttentionScale]:
    """Install the planned scales, measure them on a probe forward, undo and raise on any mismatch."""
    originals = {f.name: getattr(f.module, f.attr) for f in fixes if f.attr is not None}
    revert = attn.install(fixes, alpha)
    if not seen.ran:
        return [
            attn.AttentionScale(f.name, f.how, f.d0, f.d, f.before, f.target, f.target, False, originals.get(f.name))
            for f in fixes
        ]
    after = observe(model, seen.inputs)
    calls = after.attention_by_module()
    out = []
    for f in fixes:
        measured = calls.get(f.name)
        if not after.ran or not measured or not all(math.isclose(c.scale, f.target, rel_tol=1e-5) for c in measured):
            revert()
            got = (
                f"measured {measured[0].scale:.6g}"
                if measured
                else f"no attention call seen ({after.error})"
                if not after.ran
                else "no attention call seen"
            )
            raise ModelError(
                f"attention module '{f.name}' ({type(f.module).__name__}): after setting µP's logit scale through "
                f"{f.how}, the probe forward {got} instead of {f.target:.6g} (= α·s₀·d₀/d with α={alpha:g}, "
                f"d₀={f.d0}, d={f.d}). The model is unchanged. Compute the logits with "
                f"`mt.attn_scale(self, head_dim)` or F.scaled_dot_product_attention, or pass attention=False if the "
                f"model already scales them the µP way"
            )
        out.append(
            attn.AttentionScale(
                f.name, f.how, f.d0, f.d, f.before, f.target, measured[0].scale, True, originals.get(f.name)
            )
        )
    return out
