"""`parametrize`: turn a model written in standard parametrization into µP, in place.

What it changes: the values of the model's initial parameters (rescaled by µP's init
factors relative to the base model), the attention logit scale (see `attention`), and —
only where the formulation needs it or a tunable multiplier is not 1 — the class of the
readout or input layers, to a subclass that applies the forward constant (see `scaled_forward`). It records a `MuSpec` on the model for `param_groups`.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .. import scaled_forward
from ..errors import ModelError, MuPWarning
from ..rules import (
    BRANCH_MULTIPLIER,
    DEFAULT_DEPTH_ALPHA,
    DEFAULT_FORMULATION,
    DEFAULT_PARAMETRIZATION,
    NO_MULTIPLIERS,
    UMUP_DEPTH_ALPHA,
    UMUP_NAME,
    TunableMultipliers,
    check_depth_alpha,
    depth_factor,
    factor,
    formulation_name,
    formulation_rules,
    parametrization_name,
)
from .attention_plan import base_attention, install_attention, plan_attention
from .branches import Branch, find_branches
from .depth import BRANCH_ATTR, DepthMap, block_containers, outermost
from .devices import meta_parameters
from .forward_constants import forward_constants, in_effect, install_forward_constants, readout_input_ratio
from .groups import mark_parameters, register_plain_guard
from .init_law import read_law
from .observe import effective_logit_scales, observe_model
from .param_checks import attention_suspects, check_class_forward, not_a_random_scale, rms, warn_unused
from .roles import ParamInfo, classify
from .row_roles import assign_row_roles, column_roles, row_plan
from .shapes import WidthShapes, canonical_name
from .spec import SPEC_ATTR, MuSpec, find_spec
from .umup import UMuPPlan, rescale_to, unit_target
from .umup_setup import check_umup_options, plan_umup_probed, umup_depth_map, umup_hparams, umup_residuals
from .width_constants import ForwardConstants, merge_constants, width_constants
from .zeroing import Zeroing, ZeroPiece, query_zeroing, readout_zeroing

__all__ = ["BaseShapes", "ForwardConstants", "ZeroPiece", "Zeroing", "parametrize"]

BaseShapes = str | os.PathLike | WidthShapes | Mapping


def parametrize(
    model: nn.Module,
    base: nn.Module | None = None,
    delta: nn.Module | None = None,
    *,
    base_shapes: BaseShapes | None = None,
    formulation: str = DEFAULT_FORMULATION,
    init_mult: Mapping[str, float] | None = None,
    lr_mult: Mapping[str, float] | None = None,
    output_mult: float = 1.0,
    attn_mult: float = 1.0,
    embedding_mult: float = 1.0,
    zero_init_readout: bool = False,
    zero_init_query: bool | str | Iterable[str] = False,
    roles: Mapping[str, str] | None = None,
    transposed: Iterable[str] = (),
    attention: bool = True,
    attn_base_head_dim: int | None = None,
    depth_alpha: float = DEFAULT_DEPTH_ALPHA,
    residual_branches: Iterable[str] | None = None,
    base_depth: int | Mapping[str, int] | None = None,
    example_inputs: Any = None,
    parametrization: str = DEFAULT_PARAMETRIZATION,
    alpha_res: float = 1.0,
    alpha_res_attn_ratio: float = 1.0,
    alpha_ffn_act: float = 1.0,
    alpha_loss_softmax: float = 1.0,
) -> nn.Module:
    """Put `model` in µP relative to `base` (and `delta`), in place; returns `model`.

    Args:
        model: the target model, built the usual way (any init).
        base: the same architecture at base width. With real values, µP rescales the
            model's own init by µP's factors relative to the base's init, whatever the init
            scheme. On the meta device only shapes are known; then the model's init is
            assumed to scale like PyTorch's default (weights and Linear/Conv biases
            ∝ fan_in^-½, everything else constant).
        delta: the same architecture wider than base in every width dim. Without it, dims
            that differ between base and model are the width dims.
        base_shapes: instead of base/delta, a `WidthShapes`, its dict, or a JSON path
            written by `mt.save_shapes`. The init is then rescaled by the assumption above.
        formulation: "no_multipliers" (TP5 Table 3: init and lr carry the scaling; default; alias
            "table3") or "readout_multiplier" (Table 8, alias "table8": readout
            multiplier 1/m, as the `mup` package). Tied readouts always use Table 8.
        init_mult: per-role tunable init factors, e.g. {"hidden": 2.0}.
        lr_mult: per-role tunable lr factors, e.g. {"output": 0.5}.
        output_mult: α_output, the tunable multiplier of the readout's forward pass.
        attn_mult: α_attention, the tunable multiplier of the attention logits.
        embedding_mult: α_embedding, the tunable multiplier of the input layers' output.
        zero_init_readout: TP5 D.2's zero init of the readout (recommended; off by default so
            that µP equals the user's model at base width).
        zero_init_query: TP5 D.2's zero init of the attention queries; may also be a pattern
            or list of patterns naming the query weights.
        roles: {"name pattern": role} to override a parameter's role.
        transposed: name patterns of weights stored (fan_in, fan_out).
        attention: set False if the model already scales attention the µP way.
        attn_base_head_dim: head dim of the base model when it cannot be read off it.
        depth_alpha: depth scaling when the model has more (or fewer) repeated residual blocks
            than `base`: each branch output × (L/L₀)^-α, in-block lr and ε per `rules.DEPTH_RULES`.
            1.0 CompleteP (default), 0.5 Depth-µP, 0 no depth scaling. See `depth`.
        residual_branches: module name patterns of the residual branches (e.g.
            ["blocks.*.attn", "blocks.*.mlp"]) when tracing the blocks cannot find them.
        base_depth: the base depth L₀ when the base model given is not at it (an int for the
            model's one block container, or {container: L₀}).
        example_inputs: inputs for the probe forward (a tensor, a tuple of positional arguments or
            a dict of keyword arguments; small is fine: batch 1, a few tokens). The probe observes
            how each parameter is used (its role) and measures every attention's logit scale,
            before and after the change. Without it, inputs are made from the model (Hugging
            Face's main input and config, timm's input size, or the first layer); if none runs,
            roles fall back to module types and shapes, with a warning naming what was guessed.
        parametrization: "mup" (the default: µP relative to the base model, which it equals at base
            width) or "u-mup" (unit-scaled µP, Blake et al. 2025: unit-variance weights, every matmul,
            nonlinearity, attention and residual add scaled to unit scale at init, µP's width and
            Depth-µP's depth scaling on top; see docs/u-mup.md). Under "u-mup", ``attn_mult`` is
            u-µP's α_attn_softmax (logits α/d_head), ``output_mult`` its α_output, ``formulation``
            and ``depth_alpha`` keep their defaults (u-µP has its own rules: `rules.UMUP`) and
            ``base_depth`` is not used (u-µP's depth rule is absolute).
        alpha_res: u-µP's α_res: the residual branches' total contribution to the stream
            relative to the embedding's (the τ rule; "u-mup" only).
        alpha_res_attn_ratio: u-µP's α_res_attn_ratio: attention branches' contribution over the
            MLP branches' ("u-mup" only).
        alpha_ffn_act: u-µP's α_ffn_act: the MLP nonlinearity computes f(α·x)/α, unit-scaled
            ("u-mup" only).
        alpha_loss_softmax: u-µP's α_loss_softmax: the logits as the loss's softmax sees them, × the
            readout's multiplier ("u-mup" only).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"parametrize needs an nn.Module as `model`, got {type(model).__name__}")
    if find_spec(model) is not None:
        raise ModelError(
            f"parametrize was already called on this {type(model).__name__}; it rescales the "
            "init, so calling it twice would apply µP twice. Build a fresh model instead"
        )
    parametrization = parametrization_name(parametrization)
    umup_hp = umup_hparams(
        parametrization,
        alpha_res=alpha_res,
        alpha_res_attn_ratio=alpha_res_attn_ratio,
        alpha_ffn_act=alpha_ffn_act,
        alpha_loss_softmax=alpha_loss_softmax,
    )
    umup = parametrization == UMUP_NAME
    if umup:
        check_umup_options(formulation, depth_alpha, base_depth)
        umup_hp["alpha_attn_softmax"] = float(attn_mult)
        umup_hp["alpha_output"] = float(output_mult)
    on_meta = meta_parameters(model)
    if on_meta and isinstance(base, nn.Module):
        base_meta = meta_parameters(base)
        if base_meta:
            raise ModelError(
                f"parametrize: the model is on the meta device ({on_meta[0]} …) and so is `base` ({base_meta[0]} …): "
                "µP's init of a meta-built target is read off the base's values. Build `base` (small: the model at "
                "base width) on a real device; `delta` may stay on meta"
            )
    tunable = TunableMultipliers(dict(init_mult or {}), dict(lr_mult or {}), output_mult, attn_mult, embedding_mult)
    formulation = formulation_name(formulation)
    rules = formulation_rules(formulation)
    alpha = check_depth_alpha(depth_alpha)
    shapes = _resolve_shapes(model, base, delta, base_shapes, example_inputs)
    depth = umup_depth_map(model) if umup else _depth_map(model, shapes, base_depth)
    seen = observe_model(model, example_inputs)
    if example_inputs is not None and not seen.ran:
        raise ModelError(
            f"parametrize could not run the model on example_inputs ({seen.error}); pass inputs the "
            "model's forward accepts (a tensor, a tuple of arguments or a dict of keyword arguments)"
        )
    if not seen.ran and on_meta:
        raise ModelError(
            f"parametrize: {type(model).__name__} is on the meta device and its probe forward cannot run there "
            f"({seen.error}): an op that needs values (data-dependent shapes such as a mixture-of-experts router's "
            "nonzero, or a meta kernel torch lacks). µP's roles and attention scales are observed on that forward; "
            "build this target on a real device (materialise it, then parametrize), or pass example_inputs= that "
            "avoid the op"
        )
    if not seen.ran and attention:
        suspects = attention_suspects(model)
        if suspects:
            raise ModelError(
                f"parametrize could not run a probe forward of {type(model).__name__} ({seen.error}), and it has "
                f"attention ({', '.join(suspects[:4])}{' …' if len(suspects) > 4 else ''}) whose logit scale µP can "
                f"only set once it is measured; pass example_inputs= (a tensor, a tuple of arguments or a dict of "
                f"keyword arguments the forward accepts), or attention=False if the model already scales its "
                f"logits the µP way"
            )
    if not seen.ran:
        warnings.warn(
            f"parametrize could not run a probe forward of {type(model).__name__} ({seen.error}): roles "
            f"follow module types and shapes, and attention is found only by attributes and source (an "
            f"attention module computed otherwise keeps its own scale). Pass example_inputs= (a tensor, "
            f"a tuple of arguments or a dict of keyword arguments) so that both are observed",
            MuPWarning,
            stacklevel=2,
        )
    if umup and not seen.ran:
        raise ModelError(
            f"parametrize (u-mup): u-µP's unit scales are observed on a probe forward, and {type(model).__name__}'s "
            f"did not run ({seen.error}); pass example_inputs= (a tensor, a tuple of arguments or a dict of "
            "keyword arguments the forward accepts)"
        )
    residuals = umup_residuals(model, depth, seen.inputs, residual_branches) if umup else None
    if residuals is not None:
        depth = residuals.depth  # a plain stack (no residual stream) leaves it: no τ rule, no depth rule
    infos = classify(model, shapes, roles, transposed, depth, seen)
    params = {canonical_name(n): p for n, p in model.named_parameters()}
    split_rows = assign_row_roles(infos, shapes, seen, rules, params)
    _check_row_forward(infos, split_rows, rules)
    _warn_columns(column_roles(infos, shapes, seen, params))
    umup_plan: UMuPPlan | None = None
    if residuals is not None:
        branches: list[Branch] = []
        helper_blocks: list[str] = []
        folded: list[Branch] = []
        umup_plan = plan_umup_probed(model, infos, seen, umup_hp, tunable, residuals)
    else:
        found = find_branches(model, depth, residual_branches) if depth.containers and alpha > 0 else None
        branches, helper_blocks = (found.branches, found.helpers) if found is not None else ([], [])
        branches, folded = _fold_branches(branches, infos, formulation)
    attention_plan = (
        plan_attention(
            model, seen, base_attention(model, shapes, depth, attn_base_head_dim), float(attn_mult), absolute=umup
        )
        if attention
        else []
    )
    if not umup:
        warn_unused(
            infos,
            tunable,
            attention and bool(attention_plan),
            attn_base_head_dim,
            residual_branches,
            bool(depth.containers),
        )
    zeroing = readout_zeroing(model, infos, params) if zero_init_readout else []
    zeroing += query_zeroing(model, zero_init_query) if zero_init_query else []
    if umup_plan is not None:  # a width-dependent constant of the forward (Gemma's embedding × √d): to unit scale
        compensations = width_constants(seen, shapes, depth, infos, absolute=True)
        for m, side, c in compensations:
            umup_plan.compensations[m] = c
            umup_plan.why.setdefault((m, str(side)), []).append(
                f"undoes the forward's width-dependent × {1 / c:.4g}: unit scale"
            )
        umup_plan.constants = merge_constants(list(umup_plan.constants) + compensations)
        constants = list(umup_plan.constants)
    else:
        constants = forward_constants(infos, rules, tunable, readout_input_ratio(seen, shapes, depth), model)
        compensations = width_constants(seen, shapes, depth, infos)
        constants = merge_constants(constants + compensations)
    if seen.ran:
        constants = in_effect(constants, seen)

    check_class_forward(model, [m for m, _, _ in constants] + [b.module for b in branches])

    # Everything is checked: from here on the model changes. Attention first: its scales are measured
    # again on a probe forward, and a mismatch undoes the change and raises before anything else changes.
    spec_attention = install_attention(model, attention_plan, float(attn_mult), seen)
    base_values = None
    if base is not None and not any(p.is_meta for p in base.parameters()):
        base_values = {canonical_name(n): p.detach() for n, p in base.named_parameters()}
    spec = MuSpec(
        shapes,
        infos,
        formulation,
        tunable,
        init_source=(
            "base values"
            if base_values is not None
            else "assumed PyTorch-default scaling"
            if not on_meta
            else "shapes only (a meta target: no init law)"
        ),
        depth_alpha=(UMUP_DEPTH_ALPHA if umup else alpha) if depth.containers else 0.0,
        depth=dict(depth.containers),
        parametrization=parametrization,
        umup=umup_plan,
    )
    grown = any(own_width(i, shapes, params[n]) for n, i in infos.items())  # wider than the base somewhere
    with torch.no_grad():
        for name, info in infos.items():
            p = params[name]
            base_p = None if base_values is None else base_values[info.base_name]
            depth_f = depth_factor(spec.depth_rule(name).init, info.m_depth, spec.depth_alpha)
            unit = None if umup_plan is None else unit_target(umup_plan, name, tunable.init_mult(info.role))
            if unit is not None:  # u-µP: the weight at RMS 1 (× the tunable init multiplier, × a folded multiplier)
                if base_p is not None:
                    grows = tuple(s != b for s, b in zip(p.shape, base_p.shape))
                    law = read_law(base_p, grows)
                    spec.init_laws[name] = law.scaled(unit / law.base_rms) if law.base_rms > 0 else law
                if not p.is_meta:
                    spec.init_scales[name] = rescale_to(p, unit)
                continue
            # u-µP: a bias under its layer's output multiplier A holds b/A (abc-symmetry: the same function)
            shift = umup_plan.folded[name] if umup_plan is not None and name in umup_plan.shifted else 1.0
            target = (
                factor(rules[info.role].init, info.m_in, info.m_out) * tunable.init_mult(info.role) * depth_f * shift
            )
            if base_p is not None:
                grows = tuple(s != b for s, b in zip(p.shape, base_p.shape))
                spec.init_laws[name] = read_law(base_p, grows).scaled(target)
            if p.is_meta:  # nothing to rescale: mt.init_weights draws the law
                applied = target != tunable.init_mult(info.role) or own_width(info, shapes, p)
                nonzero = name in spec.init_laws and spec.init_laws[name].rms > 0
            else:
                init_factor = _init_factor(
                    info,
                    shapes,
                    rules[info.role].init,
                    tunable.init_mult(info.role),
                    p,
                    base_p,
                    spec.kept_values,
                    grown,
                )
                init_factor *= depth_f * shift
                spec.init_scales[name] = init_factor  # the field keeps its name: MuSpec is pickled with models
                if init_factor != 1.0:
                    p.mul_(init_factor)
                applied = init_factor != tunable.init_mult(info.role) or own_width(info, shapes, p)
                nonzero = rms(p) > 0
            if applied:
                for r in info.row_roles:  # rows of another role (B/C of an in_proj): their own init
                    c = r.init_ratio * tunable.init_mult(r.role) / tunable.init_mult(info.role)
                    if c != 1.0 and nonzero:
                        if not p.is_meta:
                            p.narrow(r.dim, r.start, r.stop - r.start).mul_(c)
                        spec.init_pieces.setdefault(name, []).append((r.dim, r.start, r.stop, c))
        for zero in zeroing:
            zero.tensor(params).zero_()
            spec.init_pieces.setdefault(zero.param, []).append((zero.dim, zero.start, zero.stop, 0.0))
    spec.init_pending = bool(on_meta)
    spec.init_rms = {
        name: (
            spec.expected_rms(name)
            if name in spec.init_laws and (p.is_meta or name not in spec.kept_values)
            else (None if p.is_meta else rms(p))
        )
        for name, p in ((n, params[n]) for n in infos)
    }
    spec.zero_init = [z.what for z in zeroing]
    install_forward_constants(model, constants)
    if umup_plan is not None:
        umup_plan.constants = list(constants)  # as installed (those whose module never runs were left out)
    else:
        spec.forward_constants = {m: (kind, c) for m, kind, c in constants}
    spec.attention = spec_attention
    spec.compensated = {m: c for m, _, c in compensations if m not in seen.inner_constants}
    spec.compensated.update(
        {
            a.how[len("query output ") :]: a.target / a.before
            for a in spec_attention
            if a.how.startswith("query output ")
        }
    )
    spec.branches = {} if umup else _install_branch_multipliers(model, depth, alpha, branches, helper_blocks)
    spec.folded_branches = {
        b.end: depth_factor(BRANCH_MULTIPLIER, depth.multiplier(b.end), alpha) for b in folded if b.end is not None
    }
    setattr(model, SPEC_ATTR, spec)
    mark_parameters(model, spec)
    register_plain_guard()
    if umup and spec.attention and not any(p.is_meta for p in model.parameters()):
        spec.attention_effective = effective_logit_scales(model, seen.inputs)
    return model


def own_width(info: ParamInfo, shapes: WidthShapes, p: torch.Tensor) -> bool:
    """Whether a parameter is not at its base size (then µP changes its init)."""
    return any(m != 1.0 for m in shapes.params[info.base_name].width_ratios(tuple(p.shape)))


def _check_row_forward(infos: dict[str, ParamInfo], names: list[str], rules) -> None:
    """Rows of another role inside a weight get µP's lr from the weight's group only when the rules need
    no forward multiplier on them (a = 1, as in TP5 Tables 3 and 8); otherwise say so, never guess."""
    for name in names:
        info = infos[name]
        for r in info.row_roles:
            _, a = row_plan(rules, info.role, r.role, info.m_in, info.m_out)
            if abs(a - 1.0) > 1e-9:
                raise ModelError(
                    f"parametrize: '{name}' {r} would need a forward multiplier {a:.4g} on those rows for µP's "
                    f"lr under these rules, which is not supported; give the rows their own layer, or set the "
                    f"whole weight's role with roles={{'{name}': '{info.role}'}}"
                )


def _warn_columns(found: dict[str, list[tuple[int, int, str]]]) -> None:
    for name, ranges in found.items():
        warnings.warn(
            f"parametrize: the input of '{name}' is concatenated from pieces that scale differently: columns "
            + ", ".join(f"{a}:{b} are {role}-like" for a, b, role in ranges)
            + " (a fixed-size input beside a width-sized one), but the weight has one role and µP's init and lr of "
            f"those columns are not given to them. Give the fixed-size input its own layer (sum the two outputs), or "
            f"set the role with roles={{'{name}': ...}} to acknowledge it",
            MuPWarning,
            stacklevel=3,
        )


def _resolve_shapes(model, base, delta, base_shapes, example_inputs=None) -> WidthShapes:
    if base_shapes is not None:
        if base is not None or delta is not None:
            raise ModelError("pass either base_shapes= or base=/delta=, not both")
        if isinstance(base_shapes, WidthShapes):
            return base_shapes
        if isinstance(base_shapes, (str, os.PathLike)):
            return WidthShapes.load(base_shapes)
        if isinstance(base_shapes, Mapping):
            return WidthShapes.from_dict(dict(base_shapes))
        raise TypeError(f"base_shapes must be a path, a WidthShapes or a dict, got {type(base_shapes).__name__}")
    if base is None:
        raise ModelError("parametrize needs base= (the model at base width) or base_shapes=")
    if not isinstance(base, nn.Module):
        raise TypeError(f"base must be an nn.Module, got {type(base).__name__}")
    if delta is not None and not isinstance(delta, nn.Module):
        raise TypeError(f"delta must be an nn.Module, got {type(delta).__name__}")
    return WidthShapes.from_models(base, delta, target=model, example_inputs=example_inputs)


def _depth_map(model: nn.Module, shapes: WidthShapes, base_depth) -> DepthMap:
    """Block containers whose count differs between the base (shapes) and `model`."""
    target = {canonical_name(n): tuple(p.shape) for n, p in model.named_parameters()}
    base = {n: ps.base for n, ps in shapes.params.items()}
    if isinstance(base_depth, int) and not isinstance(base_depth, bool):
        outer = outermost(block_containers(target))
        if len(outer) != 1:
            raise ModelError(
                f"base_depth={base_depth} is ambiguous: the model has block containers "
                f"{', '.join(outer) or 'none'}; pass base_depth={{'container': L0}}"
            )
        base_depth = {outer[0]: base_depth}
    elif base_depth is not None and not isinstance(base_depth, Mapping):
        raise TypeError(f"base_depth must be an int or a dict of container → int, got {type(base_depth).__name__}")
    return DepthMap.between(base, target, base_depth)


def _fold_branches(
    branches: list[Branch], infos: dict[str, ParamInfo], formulation: str
) -> tuple[list[Branch], list[Branch]]:
    """Split the branches into (forward constant, folded into their last layer).

    Table 3 has no forward constants, so a branch whose output is a Linear/Conv layer's gets the
    multiplier folded into that layer's parameters ("branch_end" depth rule); its parameters must
    belong to that layer alone. Everything else keeps a forward constant.
    """
    if formulation != NO_MULTIPLIERS:
        return branches, []
    keep, folded = [], []
    for b in branches:
        own = [i for i in infos.values() if b.end is not None and any(m == b.end for m, _ in i.usages)]
        if b.end is None or not own or any(len(i.usages) != 1 for i in own):
            keep.append(b)
            continue
        for info in own:
            info.depth_role = "branch_end"
        folded.append(b)
    return keep, folded


def _install_branch_multipliers(
    model: nn.Module, depth: DepthMap, alpha: float, branches: list[Branch], helper_blocks: list[str]
) -> dict[str, float]:
    """Multiply every residual branch output by (L/L₀)^-α; returns {module: multiplier}."""
    installed = {}
    for b in branches:
        c = depth_factor(BRANCH_MULTIPLIER, depth.multiplier(b.module), alpha)
        if c != 1.0:
            scaled_forward.install(model.get_submodule(b.module), output_mult=c)
            installed[b.module] = c
    for bname in helper_blocks:
        c = depth_factor(BRANCH_MULTIPLIER, depth.multiplier(bname), alpha)
        setattr(model.get_submodule(bname), BRANCH_ATTR, c)
        installed[bname] = c
    return installed


def _init_factor(
    info: ParamInfo,
    shapes: WidthShapes,
    init_exp,
    init_mult: float,
    p: torch.Tensor,
    base_p: torch.Tensor | None,
    kept: dict[str, str] | None = None,
    grown: bool = False,
) -> float:
    """Factor to multiply the model's current init by; parameters whose values are kept as they are
    (not a random init, see `not_a_random_scale`) are added to `kept` with the reason."""
    kept = {} if kept is None else kept
    own = shapes.params[info.base_name].width_ratios(tuple(p.shape))
    if all(m == 1.0 for m in own) and info.module_fan_in_mult == 1.0:
        # Base width for this parameter (and, for a bias, for its layer's fan_in): keep the user's init, unless
        # the model is wider than the base and the user's init of this finite-shape parameter changed with it
        # (T5's relative attention bias ∝ d_model^-½): µP keeps a parameter with no width dim at the base's scale.
        if grown and base_p is not None and base_p.shape == p.shape:
            current = rms(p)
            why = not_a_random_scale(info, p, base_p) if current > 0 else "zero"
            if why is None:
                ratio = rms(base_p) / current
                if abs(math.log(ratio)) > 0.1:
                    return ratio * init_mult
            elif not math.isclose(rms(base_p), current, rel_tol=1e-6):  # kept, and not the base's: say so
                kept[info.name] = why
        return init_mult
    target = factor(init_exp, info.m_in, info.m_out)
    if base_p is not None:
        current = rms(p)
        if current == 0.0:
            return init_mult  # zero init stays zero
        if target == 1.0 and info.role in ("vector", "scalar", "input"):
            why = not_a_random_scale(info, p, base_p)
            if why is not None:  # its values are its meaning (a log-decay, a time-step bias, a gain): kept
                if not math.isclose(rms(base_p), current, rel_tol=1e-6):  # listed where rescaling would change it
                    kept[info.name] = why
                return init_mult
        return target * rms(base_p) / current * init_mult
    # Shapes only: assume the user's init scales like PyTorch's default.
    if info.layout is not None or (p.ndim >= 2 and info.role in ("hidden", "output")):
        assumed = info.m_in**-0.5
    elif p.ndim == 1 and info.module_fan_in_mult != 1.0:
        assumed = info.module_fan_in_mult**-0.5
    else:
        assumed = 1.0
    return target / assumed * init_mult
