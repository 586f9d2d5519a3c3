"""What `parametrize(parametrization="u-mup")` settles before it plans: u-µP's α's checked, µP's options
that u-µP replaces refused, its depth map (every stack of repeated blocks at its own L), and the probe
for nonlinearities and residual branches that `umup.plan_umup` plans from."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from ..errors import ModelError
from ..rules import DEFAULT_DEPTH_ALPHA, DEFAULT_FORMULATION, UMUP_NAME, formulation_name
from .depth import Branch, DepthMap, block_containers, find_branches, outermost
from .shapes import canonical_name
from .umup import UMUP_DEFAULTS, UMuPPlan, plan_umup
from .unit_ops import find_unit_ops

__all__ = ["check_umup_options", "plan_umup_probed", "umup_depth_map", "umup_hparams"]


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
    """Every outermost container of repeated blocks as (1, L): u-µP's depth factors read L itself."""
    target = {canonical_name(n): tuple(p.shape) for n, p in model.named_parameters()}
    found = block_containers(target)
    return DepthMap({p: (1, found[p]) for p in outermost(found) if found[p] > 1})


def plan_umup_probed(model, infos, seen, hparams, tunable, depth: DepthMap, residual_branches) -> UMuPPlan:
    """u-µP's plan: the probe for nonlinearities, the residual branches, then `umup.plan_umup`."""
    ops = find_unit_ops(model, seen.inputs)
    if ops.error is not None:
        raise ModelError(f"parametrize (u-mup): the probe forward that finds the nonlinearities failed ({ops.error})")
    branches: list[Branch] | None = None
    error = None
    if depth.containers or residual_branches is not None:
        try:
            branches, helpers = find_branches(model, depth, residual_branches, inputs=seen.inputs)
        except ModelError as e:
            error = str(e)
        else:
            if helpers:
                error = (
                    f"the blocks {', '.join(helpers[:2])}{' …' if len(helpers) > 2 else ''} scale their branches with "
                    "mt.residual_branch, which gives one multiplier per block and u-µP's τ rule needs one per branch; "
                    "name the branch modules with residual_branches=[...]"
                )
                branches = None
    return plan_umup(model, infos, seen, ops, hparams, tunable.embedding, branches, error)
