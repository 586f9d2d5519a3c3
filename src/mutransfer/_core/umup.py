"""u-µP on an unmodified model: the plan `parametrize(..., parametrization="u-mup")` installs.

Everything u-µP puts in the forward pass is a constant on a layer's input or output (installed by
`scaled_forward`, the same machinery as µP's forward constants), so `mt.export` folds all of it into
weights and the exported model is a plain one with the same logits:

- **matmuls**: every weight starts at unit RMS; its layer multiplies its *output* by `rules.UMUP`'s
  forward column (fan_in^-½ for hidden and finite-fan_in input layers, α_output·α_loss_softmax/fan_in
  for the readout, nothing for a lookup): u-µP's scaled matmul, ``(x·Wᵀ)·A``, whose operands x and W
  are both unit-scale — what an FP8 matmul needs (`mt.fp8_simulation` casts x and W). A layer with a
  bias keeps that bias's function by abc-symmetry: ``(x·Wᵀ + b')·A`` with b' = b/A (its value × 1/A:
  zero stays zero, PyTorch's default nonzero bias is rescaled), its Adam lr × 1/A, SGD lr × 1/A², ε × A
  (`UMuPPlan.folded`, `UMuPPlan.shifted`). A readout tied to the embedding keeps A on its input (a
  factor on its output could not be folded into the shared weight by `mt.export`), named in ``why``;
- **attention**: logits × α_attn_softmax/d_head (µP's 1/d, set through the attention machinery); the
  attention's output × 1/√(mean over queries of 1/n_visible) on the input of the layer that reads it
  (`unit_ops.attention_output_scale`: the RMS of near-uniform attention under the probe's mask,
  H_T/T for a causal one), so the o-projection's operand is unit-scale too;
- **nonlinearities**: the layer feeding f gets × α_ffn_act on its output, the layer reading f's output
  × 1/(α·σ_α) on its input (`unit_ops`: f and σ_α found on a probe forward);
- **residual adds**: u-µP's τ rule, which for pre-norm blocks is one multiplier per branch output
  (`rules.umup_residual_mults`); a stack of blocks with no residual stream (a deep MLP's hidden
  layers: observed to add nothing onto their input) gets none, and no depth rule (`plain_stacks`);
- **norms**: unit already (gain 1);
- **the backward**: the loss's gradient is unit-scaled by `UMuPPlan.loss_grad_scale` (the paper's
  unit-scaled cross-entropy backward, N·√V for a mean over N tokens of a V-way softmax); it is a
  backward-only scale, which `mt.fp8_simulation` applies where it rounds gradients to E5M2 (and
  takes out again before the parameters' gradients: the training, and so the optimum, is unchanged).

A weight whose layer cannot carry a multiplier (a raw parameter used inside a bigger module, a layer
whose forward never runs) gets it in its init instead (abc-symmetry: the same function and, under
Adam, the same training), with a warning naming it: a fallback, so the model still is u-µP up to ε,
but that weight is not unit-scaled.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import scaled_forward
from ..errors import ModelError, MuPWarning
from ..rules import UMUP, factor, umup_residual_mults
from .branches import Branch
from .observation import Observation
from .roles import ParamInfo
from .unit_ops import UnitOps, activation_scale
from .width_constants import ForwardConstants, merge_constants

__all__ = ["UMUP_DEFAULTS", "UMuPPlan", "plan_umup", "umup_fans", "umup_row"]

# The paper's hyperparameters, each 1 by default (α_attn_softmax and α_output arrive as attn_mult / output_mult).
UMUP_DEFAULTS: dict[str, float] = {
    "alpha_res": 1.0,
    "alpha_res_attn_ratio": 1.0,
    "alpha_attn_softmax": 1.0,
    "alpha_ffn_act": 1.0,
    "alpha_output": 1.0,
    "alpha_loss_softmax": 1.0,
}


@dataclass
class UMuPPlan:
    """What u-µP decided for a model, kept on its `MuSpec` (``spec.umup``).

    Attributes:
        hparams: the α's in effect (the paper's names).
        rows: parameter → its row of `rules.UMUP` ("embedding", "input", "hidden", "output", "vector", "scalar").
        fans: parameter → (fan_in, fan_out), the absolute fans its rules read.
        folded: parameter → the factor its init and optimizer columns are shifted by (abc-symmetry): for a
            weight no layer could carry, its forward multiplier, moved into its init (std A); for a zero bias
            shifted onto the output of its layer's scaled matmul (``shifted``), 1/A (its value stays zero; its
            Adam lr × 1/A, SGD lr × 1/A², ε × A).
        shifted: bias → the layer whose output multiplier A it is shifted under (``folded[bias]`` = 1/A).
        constants: (module, side, constant) installed, merged per place.
        why: (module, side) → what the constant is made of, for `describe`.
        branches: residual branch module → (kind, multiplier) of the τ rule.
        plain_stacks: container → L of each stack of blocks observed to add nothing onto their input (a deep
            MLP's hidden layers): no residual stream, so neither the τ rule nor Depth-µP's factors apply.
        activations: (consumer layer, function, σ_α) of each nonlinearity unit-scaled.
        fallbacks: what was left without a unit rule, and why (each also warned).
        matmul_scales: layer → the scaled matmul's 1/√fan_in on its output (hidden and input rows): the
            factor that brings the product of unit operands back to unit scale, so the layer's output *after*
            it is what u-µP holds at scale one (the monitor discounts it; other output constants are scales
            on top of one).
        compensations: layer → 1/c on its output, undoing a width-dependent constant c the model's own forward
            puts there (Gemma's embedding × √d_model): to unit scale, like the scaled matmul's factor.
    """

    hparams: dict[str, float] = field(default_factory=dict)
    rows: dict[str, str] = field(default_factory=dict)
    fans: dict[str, tuple[int, int]] = field(default_factory=dict)
    folded: dict[str, float] = field(default_factory=dict)
    shifted: dict[str, str] = field(default_factory=dict)
    constants: ForwardConstants = field(default_factory=list)
    why: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    branches: dict[str, tuple[str, float]] = field(default_factory=dict)
    plain_stacks: dict[str, int] = field(default_factory=dict)
    activations: list[tuple[str, str, float]] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    matmul_scales: dict[str, float] = field(default_factory=dict)
    compensations: dict[str, float] = field(default_factory=dict)
    attention_outputs: list[tuple[str, float]] = field(default_factory=list)
    vocab: int | None = None
    alpha_loss: float = 1.0

    def loss_grad_scale(self, logits_shape: tuple[int, ...] | torch.Size) -> float:
        """u-µP's backward scale of the loss: the factor that brings the gradient of a mean
        cross-entropy over the logits to unit scale, N·√V (N = the logits' rows, V = their last dim;
        at init the softmax is near uniform and each of the N·V entries of the gradient has RMS
        ≈ 1/(N·√V)), rounded to a power of two so that taking it out again is exact.

        Args:
            logits_shape: the readout's output shape (…, V).

        Returns:
            The scale (≥ 1).
        """
        shape = tuple(logits_shape)
        if not shape:
            return 1.0
        vocab = shape[-1]
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        raw = rows * math.sqrt(max(vocab, 1))
        return float(2.0 ** round(math.log2(max(raw, 1.0))))

    def forward_factor(self, name: str) -> float:
        """The multiplier of parameter `name` in the forward (its row's forward column at its fans)."""
        fi, fo = self.fans[name]
        return factor(UMUP[self.rows[name]].forward, fi, fo)


def umup_row(info: ParamInfo, seen: Observation) -> str:
    """The row of `rules.UMUP` for a parameter: its µP role, with "embedding" for input weights used by lookup."""
    if info.role == "input" and any(u.op in ("lookup", "gather") for u in seen.uses.get(info.name, [])):
        return "embedding"
    return info.role


def umup_fans(info: ParamInfo) -> tuple[int, int]:
    """(fan_in, fan_out) of a parameter, absolute: a weight's by its layout (a conv's kernel counts in
    fan_in; an embedding's fan_out is its feature dim), a vector's fan_out its length."""
    shape = info.shape
    numel = math.prod(shape) if shape else 1
    if info.layout is not None and len(shape) >= 2:
        fo = shape[info.layout[1]]
        return numel // fo, fo
    return 1, numel


def _is_layer(module: nn.Module) -> bool:
    return not list(module.children()) and set(module._parameters) <= {"weight", "bias"}


def plan_umup(
    model: nn.Module,
    infos: dict[str, ParamInfo],
    seen: Observation,
    ops: UnitOps,
    hparams: dict[str, float],
    embedding_mult: float,
    branches: list[Branch] | None,
    branch_error: str | None,
) -> UMuPPlan:
    """Decide u-µP's forward constants, residual multipliers and init for `model` (nothing is changed).

    Args:
        model: the model, before any change.
        infos: the classified parameters (roles, layouts).
        seen: the probe forward's observation.
        ops: the nonlinearities found between layers (`unit_ops.find_unit_ops`).
        hparams: the α's (`UMUP_DEFAULTS` keys).
        embedding_mult: α_embedding (the output of lookups).
        branches: the residual branches in forward order (None: none found).
        branch_error: why the branches could not be found (warned; no τ rule then).

    Returns:
        The `UMuPPlan`.
    """
    plan = UMuPPlan(hparams=dict(hparams), alpha_loss=hparams["alpha_loss_softmax"])
    modules = {n: m for n, m in model.named_modules()}
    found: ForwardConstants = []

    def add(module: str, side: scaled_forward.Side, c: float, what: str) -> None:
        found.append((module, side, c))
        plan.why.setdefault((module, str(side)), []).append(what)

    readout_mult = hparams["alpha_output"] * hparams["alpha_loss_softmax"]
    for name, info in infos.items():
        row = umup_row(info, seen)
        plan.rows[name] = row
        plan.fans[name] = umup_fans(info)
        if row in ("vector", "scalar") or info.layout is None:
            continue
        fi, fo = plan.fans[name]
        c = factor(UMUP[row].forward, fi, fo)
        weight_uses = [m for m, local in info.usages if local == "weight"]
        placeable = (
            weight_uses
            and len(weight_uses) == len(info.usages)
            and all(m in modules and _is_layer(modules[m]) and m in seen.called for m in weight_uses)
        )
        readouts = [m for m in info.tied_readouts]
        if row == "output":
            c *= readout_mult
            plan.vocab = fo
        if not placeable:
            if c != 1.0:
                plan.folded[name] = c
                used = ", ".join(m or "<model>" for m, _ in info.usages) or "no module"
                plan.fallbacks.append(
                    f"'{name}' is used by {used}, which is not a layer whose forward runs, so its multiplier "
                    f"{c:.4g} went into its init (std {c:.4g} instead of 1; the same function and Adam training)"
                )
            continue
        if row == "embedding":
            if embedding_mult != 1.0:
                for m in weight_uses:
                    if m not in readouts:
                        add(m, scaled_forward.Side.OUTPUT, embedding_mult, f"α_embedding {embedding_mult:g}")
        elif c != 1.0:
            what = {
                "hidden": f"scaled matmul 1/√fan_in (fan_in {fi})",
                "input": f"scaled matmul 1/√fan_in (fan_in {fi})",
                "output": f"readout α_output·α_loss_softmax/fan_in (fan_in {fi})",
            }[row]
            for m in weight_uses:
                _place_matmul_scale(plan, add, modules[m], m, c, what)
                if row != "output":
                    plan.matmul_scales[m] = c
        for m in readouts:  # a readout tied to this embedding: its own multiplier on its input
            if m in modules and m in seen.called:
                tied_c = readout_mult / fo
                plan.vocab = int(getattr(modules[m], "out_features", 0)) or plan.vocab
                # on the input: a factor on the output of a readout that shares the embedding's weight has
                # no place in a plain model (`mt.export` folds an input factor into the norm before it)
                what = f"tied readout α_output·α_loss_softmax/fan_in (fan_in {fo}), on the input (tied weight)"
                add(m, scaled_forward.Side.INPUT, tied_c, what)
            else:
                raise ModelError(
                    f"u-µP: the readout '{m}' tied to '{name}' does not run as a module on the probe forward, so its "
                    "multiplier 1/fan_in has no place; untie the readout or call it as a module"
                )

    alpha = hparams["alpha_ffn_act"]
    for use in ops.activations:
        sigma = activation_scale(use.function, alpha, use.kwargs)
        gate_ok = seen.output_uses.get(use.gate, 1) <= 1 and use.gate in modules and _is_layer(modules[use.gate])
        if alpha != 1.0 and not gate_ok:
            plan.fallbacks.append(
                f"α_ffn_act on {use.function}: its input comes from '{use.gate}', whose output is used elsewhere "
                "too, so α_ffn_act is not applied there"
            )
            sigma = activation_scale(use.function, 1.0, use.kwargs)
            a = 1.0
        else:
            a = alpha
        if a != 1.0:
            add(use.gate, scaled_forward.Side.OUTPUT, a, f"α_ffn_act {a:g} into {use.function}")
        add(
            use.consumer,
            scaled_forward.Side.INPUT,
            1.0 / (a * sigma),
            f"unit {use.function}{'·' + use.up if use.up else ''}: 1/(α·σ) = 1/{a * sigma:.4g}",
        )
        plan.activations.append((use.consumer, use.function, sigma))
    for att in ops.attention:
        add(
            att.consumer,
            scaled_forward.Side.INPUT,
            1.0 / att.scale,
            f"unit attention output: 1/{att.scale:.4g} (uniform attention over {'causal ' if att.causal else ''}"
            f"{att.keys} keys)",
        )
        plan.attention_outputs.append((att.consumer, att.scale))
    for consumer, names in ops.unknown.items():
        plan.fallbacks.append(
            f"the input of '{consumer}' comes through {', '.join(names)}, which has no unit rule: that layer's input "
            "keeps the op's own scale (µP's width scaling is unaffected: the op does not depend on the width)"
        )

    if branches:
        kinds = []
        attention_modules = [c.module for c in seen.attention]
        for b in branches:
            is_attn = any(a == b.module or a.startswith(b.module + ".") for a in attention_modules)
            kinds.append("attention" if is_attn else "mlp")
        for b, kind, c in zip(
            branches, kinds, umup_residual_mults(kinds, hparams["alpha_res"], hparams["alpha_res_attn_ratio"])
        ):
            plan.branches[b.module] = (kind, c)
            add(b.module, scaled_forward.Side.OUTPUT, c, f"τ rule: {kind} branch × {c:.4g}")
    elif branch_error:
        plan.fallbacks.append(f"no residual rule: {branch_error}")

    plan.constants = merge_constants(found)
    for msg in plan.fallbacks:
        warnings.warn(f"parametrize (u-mup): {msg}", MuPWarning, stacklevel=3)
    return plan


def _place_matmul_scale(
    plan: UMuPPlan, add: Callable[..., None], module: nn.Module, name: str, c: float, what: str
) -> None:
    """Put a matmul's scale `c` on its layer's output (u-µP's scaled matmul: unit operands), its bias
    shifted by abc-symmetry (b' = b/c, zero or not: `parametrize` rescales its value and `param_groups`
    its lr and ε). With the factor on the input instead, a layer with PyTorch's default nonzero bias fed
    its matmul an operand of RMS c (1/32 at fan_in 1024): 68 % of a GELU MLP's hidden-matmul inputs fell
    below E4M3's smallest normal at init."""
    bias = module._parameters.get("bias")
    add(name, scaled_forward.Side.OUTPUT, c, what)
    if bias is not None:
        bias_name = f"{name}.bias" if name else "bias"
        plan.folded[bias_name] = 1.0 / c
        plan.shifted[bias_name] = name


def unit_target(plan: UMuPPlan, name: str, init_mult: float) -> float | None:
    """The RMS u-µP gives parameter `name` at init (None: not a weight, µP's vector rule applies)."""
    row = plan.rows.get(name)
    if row is None or row in ("vector", "scalar"):
        return None
    return plan.folded.get(name, 1.0) * init_mult


def rescale_to(p: torch.Tensor, target: float) -> float:
    """Multiply `p` in place so that its RMS is `target`; returns the factor (1.0 for an all-zero tensor)."""
    current = float(p.detach().double().pow(2).mean().sqrt()) if p.numel() else 0.0
    if current == 0.0:
        return 1.0
    f = target / current
    p.mul_(f)
    return f
