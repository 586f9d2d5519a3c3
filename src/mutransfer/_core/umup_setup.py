"""What `parametrize(parametrization="u-mup")` settles before it plans: u-µP's α's checked, µP's options
that u-µP replaces refused, its depth map (every stack of repeated blocks at its own L), the residual
branches (found before the parameters are classified: a plain stack, with no residual stream, leaves the
depth map) and the probe for nonlinearities that `umup.plan_umup` plans from."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import ModelError
from ..rules import DEFAULT_DEPTH_ALPHA, DEFAULT_FORMULATION, UMUP_NAME, formulation_name
from .branches import Branch, FoundBranches, find_branches
from .depth import DepthMap, block_containers, outermost
from .shapes import canonical_name
from .umup import UMUP_DEFAULTS, UMuPPlan, plan_umup
from .unit_ops import find_unit_ops

__all__ = [
    "UMuPResiduals",
    "check_umup_options",
    "plan_umup_probed",
    "umup_depth_map",
    "umup_hparams",
    "umup_residuals",
]


def umup_hparams(parametrization: str, **given: float) -> dict[str, float]:
    """u-µP's α's, checked: numbers, α_ffn_act and α_loss_softmax positive, α_res and its ratio ≥ 0; only
    under parametrization="u-mup" may they differ from 1."""
    out = dict(UMUP_DEFAULTS)
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{key} must be a number (u-µP's {key}, default 1), got {value!r}")
        if not math.isfinite(value) or value < 0 or (value == 0 and key in ("alpha_ffn_act", "alpha_loss_softmax")):
            raise ModelError(
                f"{key} must be a finite number {'> 0' if key.startswith('alpha_ffn') else '≥ 0'}, got {value!r}"
            )
        if value != 1.0 and parametrization != UMUP_NAME:
            raise ModelError(
                f"{key}={value!r} is a u-µP hyperparameter; pass parametrization='u-mup' to use it (µP's own "
                "multipliers are output_mult, attn_mult and embedding_mult)"
            )
        out[key] = float(value)
    return out


def check_umup_options(formulation: str, depth_alpha: float, base_depth: Any) -> None:
    """Options of µP that u-µP replaces by its own rules: refused when set, never silently ignored."""
    if formulation_name(formulation) != DEFAULT_FORMULATION:
        raise ModelError(
            f"formulation={formulation!r} is a choice between µP's tables; u-µP has its own (rules.UMUP: every "
            "matmul carries its multiplier). Leave formulation at its default with parametrization='u-mup'"
        )
    if depth_alpha != DEFAULT_DEPTH_ALPHA:
        raise ModelError(
            f"depth_alpha={depth_alpha!r}: u-µP scales depth by its own rule (Depth-µP, α = ½: the τ rule's "
            "1/√L per branch and the blocks' lr × L^-½); leave depth_alpha at its default with parametrization='u-mup'"
        )
    if base_depth is not None:
        raise ModelError(
            "base_depth is not used by u-µP: its depth rule is absolute (1/√L with L the model's own number of "
            "blocks); drop base_depth= with parametrization='u-mup'"
        )


def umup_depth_map(model: nn.Module) -> DepthMap:
    """Every outermost container of repeated blocks as (1, L): u-µP's depth factors read L itself. A container
    of a single block gets no depth rule (L^-½ = 1) but its names still map onto the base's blocks."""
    target = {canonical_name(n): tuple(p.shape) for n, p in model.named_parameters()}
    found = block_containers(target)
    outer = {p: (1, found[p]) for p in outermost(found)}
    return DepthMap({p: v for p, v in outer.items() if v[1] > 1}, {p: v for p, v in outer.items() if v[1] == 1})


@dataclass
class UMuPResiduals:
    """u-µP's residual structure, settled before the parameters are classified.

    Attributes:
        depth: the depth map classify reads: the containers of residual blocks (Depth-µP's in-block factors
            apply), the plain stacks moved to ``renamed`` (their names map onto the base's, no depth rule).
        branches: the residual branches for the τ rule, in forward order (None: not found, see ``error``).
        error: why the branches could not be found (a warning; no τ rule then).
        plain: plain stack → L: containers whose blocks were observed to add nothing onto their input.
    """

    depth: DepthMap
    branches: list[Branch] | None = None
    error: str | None = None
    plain: dict[str, int] = field(default_factory=dict)


def umup_residuals(model: nn.Module, depth: DepthMap, inputs: Any, residual_branches: Any) -> UMuPResiduals:
    """Find u-µP's residual branches (fx, else the probe forward on `inputs`), container by container, so that a
    plain stack is recognised whatever the other containers hold. A plain stack has no residual stream: the τ
    rule has nothing to scale there and Depth-µP's factors (derived for 1/√L branches) do not apply, so it is
    dropped from the depth map, with no warning. Where a residual block's branches cannot be found, the fix
    named is residual_branches= (u-µP refuses depth_alpha, and `mt.residual_branch` gives one multiplier per
    block where the τ rule needs one per branch)."""
    if not depth.containers and residual_branches is None:
        return UMuPResiduals(depth)
    fixes = ": u-µP's τ rule gives each branch its own multiplier"
    found: list[FoundBranches] = []
    errors: list[str] = []
    if residual_branches is not None:
        calls = [(depth, residual_branches)]
    else:  # one container at a time: a plain stack is recognised whatever the others hold
        calls = [(DepthMap({p: v}), None) for p, v in depth.containers.items()]
    for one, patterns in calls:
        try:
            found.append(find_branches(model, one, patterns, inputs, report_plain=True, fixes=fixes))
        except ModelError as e:
            errors.append(str(e))
    plain = [p for f in found for p in f.plain]
    out = UMuPResiduals(depth.without_depth_rule(plain), plain={p: depth.containers[p][1] for p in plain})
    helpers = [h for f in found for h in f.helpers]
    if errors:
        out.error = "; ".join(errors)
    elif helpers:
        out.error = (
            f"the blocks {', '.join(helpers[:2])}{' …' if len(helpers) > 2 else ''} scale their branches with "
            "mt.residual_branch, which gives one multiplier per block and u-µP's τ rule needs one per branch; "
            "name the branch modules with residual_branches=[...]"
        )
    else:
        out.branches = [b for f in found for b in f.branches]
    return out


def plan_umup_probed(model, infos, seen, hparams, tunable, residuals: UMuPResiduals) -> UMuPPlan:
    """u-µP's plan: the probe for nonlinearities, then `umup.plan_umup` with the residual branches found."""
    ops = find_unit_ops(model, seen.inputs)
    if ops.error is not None:
        raise ModelError(f"parametrize (u-mup): the probe forward that finds the nonlinearities failed ({ops.error})")
    plan = plan_umup(model, infos, seen, ops, hparams, tunable.embedding, residuals.branches, residuals.error)
    plan.plain_stacks = dict(residuals.plain)
    return plan
