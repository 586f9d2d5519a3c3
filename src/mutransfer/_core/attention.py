"""µP attention: logits × α·s₀·d₀/d, where s₀ is the base model's own scale at head dim d₀.

For the usual ``1/√d`` that is α·√d₀/d (equal to 1/√d at base width); for a model that keeps no
scale in its forward (T5 puts 1/√d into the query's init) it is α·d₀/d. µP needs the logits to
scale like 1/d because q and k become correlated during training.

**Measured, not assumed.** `parametrize` runs a probe forward (see `observe`) on the base and on
the target: every attention call (``scaled_dot_product_attention`` anywhere, a matmul reaching a
softmax, ``nn.MultiheadAttention``) is recorded with its head dim and the constant multiplying
q·kᵀ after any normalisation of q and k (QK-norm). Then, per module, the first that applies:

1. already µP's scale (more heads at a fixed head dim): left alone;
2. ``nn.MultiheadAttention``: switched to `MuMultiheadAttention` (same state_dict and arguments);
3. hand-written attention using the helper ``mt.attn_scale(self, head_dim)`` (or
   ``mt.attn_logits``): the helper returns the µP scale once the module is parametrized;
4. a float attribute that holds the scale (``scaling`` in Hugging Face, ``scale`` in timm,
   ``inv_norm_factor``, ``norm_factor`` as a divisor, …), found by a perturbation test (×2 on the
   attribute doubles or halves the measured scale): set to µP's value, no overhead;
5. SDPA calls with no such attribute (the scale computed inline, ``scale=None``): the module's
   SDPA calls get the correction through the `sdpa` wrapper;
6. an eager matmul→softmax whose constant is inline (``/ math.sqrt(head_dim)`` in code the user
   cannot edit): when q is the output of one leaf module (the query projection, or a QK-norm) that
   feeds q alone, that module gets an output multiplier s_µP/s — it scales q·kᵀ exactly, the same
   function and gradients as the scale itself — and `describe` says so ("query output <module>");
7. otherwise an error naming the module and the one-line change (``mt.attn_scale(self, d)``).

A second probe forward then measures every module again; any scale that is not µP's is an error
(and the changes are undone). `spec.attention` holds the measured scales that `describe` prints.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import scaled_forward
from ..errors import ModelError
from . import sdpa
from .naming import canonical_name

__all__ = [
    "AttentionFix",
    "AttentionScale",
    "MuMultiheadAttention",
    "attention_kind",
    "attn_logits",
    "attn_scale",
    "base_head_dims",
    "calls_helper",
    "head_dim_of",
    "install",
    "legacy_plan",
    "mha_in_projections",
    "mup_logit_scale",
]

_HEAD_DIM_ATTRS = ("head_dim", "d_head", "head_size", "attention_head_size")
_EMBED_ATTRS = ("embed_dim", "n_embd", "d_model", "hidden_size", "dim", "all_head_size")
_HEADS_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads")
_HELPER_NAME = "attn_scale"

# --------------------------------------------------------------------------- discovery


def attention_kind(module: nn.Module) -> str | None:
    """'mha', 'scaling', 'sdpa', 'helper' or None for a module that is not an attention module."""
    if isinstance(module, nn.MultiheadAttention):
        return "mha"
    if isinstance(getattr(module, "scaling", None), float) and head_dim_of(module) is not None:
        return "scaling"
    source = _forward_source(module)
    if "scaled_dot_product_attention" in source:
        return "sdpa"
    if calls_helper(module, source):
        return "helper"
    return None


def _forward_source(module: nn.Module) -> str:
    """The source of the module's own forward ("" for torch's modules or when it cannot be read)."""
    forward = type(module).forward
    if forward is nn.Module.forward or getattr(forward, "__module__", "").startswith("torch."):
        return ""
    return function_source(forward)


@functools.lru_cache(maxsize=1024)
def function_source(function: Callable) -> str:
    """`inspect.getsource(function)`, "" when it cannot be read; cached per function object (reading
    and tokenizing the file again for every module of every model built was a third of the time
    of parametrizing a Hugging Face model; a function redefined is a new object, read afresh)."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def calls_helper(module: nn.Module, source: str | None = None) -> bool:
    """Whether the module's forward computes its scale with `attn_scale` / `attn_logits`.

    Args:
        module: an attention module.
        source: its forward's source, when already read.

    Returns:
        True when the forward calls the helper.
    """
    source = _forward_source(module) if source is None else source
    return f"{_HELPER_NAME}(" in source or "attn_logits(" in source


def head_dim_of(module: nn.Module) -> int | None:
    """The head dim a module declares (``head_dim``, ``d_head``, …, or embed dim / heads), else None.

    Args:
        module: an attention module.

    Returns:
        The head dim read from its attributes, or None when they do not say.
    """
    for attr in _HEAD_DIM_ATTRS:
        v = getattr(module, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    heads = next((getattr(module, a) for a in _HEADS_ATTRS if isinstance(getattr(module, a, None), int)), None)
    embed = next((getattr(module, a) for a in _EMBED_ATTRS if isinstance(getattr(module, a, None), int)), None)
    if heads and embed and embed % heads == 0:
        return embed // heads
    return None


def base_head_dims(base: nn.Module) -> dict[str, int]:
    """Head dim of every attention module of the base model whose head dim can be read."""
    out = {}
    for name, module in base.named_modules():
        if attention_kind(module) is not None:
            d = head_dim_of(module)
            if d is not None:
                out[canonical_name(name)] = d
    return out


# --------------------------------------------------------------------------- the helper


def attn_scale(module: nn.Module, head_dim: int) -> float:
    """Scale for q·kᵀ in hand-written attention: µP's α·√d₀/d once parametrized, else 1/√d."""
    return mup_logit_scale(getattr(module, "_mutransfer_attn", None), head_dim)


def mup_logit_scale(cfg: tuple[float, int] | None, head_dim: int) -> float:
    """α·√d₀/d for a module parametrized with cfg = (α, d₀) (its own 1/√d was µP's at d₀), else 1/√d."""
    if cfg is None:
        return 1.0 / math.sqrt(head_dim)
    alpha, d0 = cfg
    return alpha * math.sqrt(d0) / head_dim


def attn_logits(module: nn.Module, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q·kᵀ × `attn_scale(module, head_dim)` for hand-written attention (q, k: (…, seq, head_dim)).

    Same as computing the logits with `attn_scale` by hand, but the coordinate check sees
    (and records) logits computed this way.
    """
    scale = attn_scale(module, q.shape[-1])
    return (q @ k.transpose(-2, -1)) * scale


# --------------------------------------------------------------------------- nn.MultiheadAttention


def _as_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


def mha_in_projections(mod: nn.MultiheadAttention) -> tuple[tuple[torch.Tensor, torch.Tensor | None], ...]:
    """((w_q, b_q), (w_k, b_k), (w_v, b_v)) of an nn.MultiheadAttention, fused or not."""
    if mod._qkv_same_embed_dim:
        ws = mod.in_proj_weight.chunk(3)
    else:
        ws = (mod.q_proj_weight, mod.k_proj_weight, mod.v_proj_weight)
    bs = mod.in_proj_bias.chunk(3) if mod.in_proj_bias is not None else (None, None, None)
    return tuple(zip(ws, bs))


class MuMultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention whose logits use the µP scale stored in `_mutransfer_attn`.

    Same parameters, buffers and arguments as the parent; modules are switched to this class
    in place by `parametrize`, so state_dicts stay interchangeable.
    """

    _mutransfer_attn: tuple[float, int] | None  # (α_attention, base head dim d₀), set by parametrize

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """nn.MultiheadAttention's forward with µP's logit scale α·√d₀/d instead of 1/√d.

        Args:
            query: as nn.MultiheadAttention's.
            key: as nn.MultiheadAttention's.
            value: as nn.MultiheadAttention's.
            key_padding_mask: as nn.MultiheadAttention's.
            need_weights: as nn.MultiheadAttention's.
            attn_mask: as nn.MultiheadAttention's.
            average_attn_weights: as nn.MultiheadAttention's.
            is_causal: as nn.MultiheadAttention's.

        Returns:
            (attention output, attention weights or None), as nn.MultiheadAttention's.
        """
        scale = mup_logit_scale(self._mutransfer_attn, self.head_dim)
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        tgt_len, bsz, _ = query.shape
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = mha_in_projections(self)
        q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        dtype = q.dtype
        attn_mask = _as_additive(attn_mask, dtype)
        key_padding_mask = _as_additive(key_padding_mask, dtype)
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.expand(1, bsz, -1)])
            v = torch.cat([v, self.bias_v.expand(1, bsz, -1)])
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        src_len = k.shape[0]
        h, hd = self.num_heads, self.head_dim

        def heads(x, n):
            return x.reshape(n, bsz, h, hd).permute(1, 2, 0, 3)  # (bsz, h, n, hd)

        q, k, v = heads(q, tgt_len), heads(k, src_len), heads(v, src_len)
        mask = None
        if attn_mask is not None:
            mask = attn_mask.reshape(bsz, h, tgt_len, src_len) if attn_mask.dim() == 3 else attn_mask
        if key_padding_mask is not None:
            kpm = key_padding_mask.reshape(bsz, 1, 1, src_len)
            mask = kpm if mask is None else mask + kpm
        causal = is_causal and mask is None
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            logits = (q @ k.transpose(-2, -1)) * scale
            if causal:
                logits = logits.masked_fill(
                    torch.ones(tgt_len, src_len, dtype=torch.bool, device=q.device).triu(1), float("-inf")
                )
            if mask is not None:
                logits = logits + mask
            weights = logits.softmax(-1)
            out = F.dropout(weights, dropout, training=self.training) @ v
        else:
            weights = None
            out = sdpa.torch_sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim)
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean(1)
            if not batched:
                weights = weights.squeeze(0)
        return out, weights


# --------------------------------------------------------------------------- installation


@dataclass(frozen=True)
class AttentionScale:
    """The logit scale of one attention module, as parametrize left it (`spec.attention`).

    ``scale`` is what the module computes after `parametrize` (measured on a probe forward when
    ``verified``), ``target`` µP's α·s₀·d₀/d, ``before`` the module's own scale; ``how`` says what
    was changed: "unchanged", "attribute <name>", "sdpa", "mha" or "helper". ``attribute_value``:
    for "attribute <name>", the value the attribute held before (what `export` puts back).
    """

    module: str
    how: str
    d0: int
    d: int
    before: float
    target: float
    scale: float
    verified: bool
    attribute_value: float | None = None


@dataclass
class AttentionFix:
    """How one attention module gets µP's logit scale: planned by `plan`/`legacy_plan`, applied by `install`.

    `before`/`target` are logit scales (the constant multiplying q·kᵀ) at head dims `d` (the model's)
    and `d0` (the base's); `how` names the mechanism ("attribute …", "sdpa", "mha", "helper",
    "unchanged"); `attr` is the float attribute holding the scale, if any (`divides` when the forward
    divides by it).
    """

    module: nn.Module
    name: str
    how: str
    d0: int
    d: int
    before: float
    target: float
    attr: str | None = None
    divides: bool = False
    query: str | None = None  # for "query output …": the module whose output is q (the correction goes there)
    query_module: nn.Module | None = None


def install(fixes: list[AttentionFix], alpha: float) -> Callable[[], None]:
    """Give every planned module its µP logit scale; returns a function that undoes it."""
    undo: list[Callable[[], None]] = []
    for f in fixes:
        module = f.module
        correction = f.target / f.before
        if f.how == "unchanged":
            continue
        if f.how.startswith("query output") and f.query_module is not None:
            qmodule = f.query_module
            old_cls, old = qmodule.__class__, qmodule.__dict__.get(scaled_forward.OUTPUT_ATTR)
            scaled_forward.install(qmodule, output_mult=correction)
            undo.append(functools.partial(_restore_output, qmodule, old_cls, old))
            continue
        if f.attr is not None:
            old = getattr(module, f.attr)
            setattr(module, f.attr, old / correction if f.divides else old * correction)
            undo.append(functools.partial(setattr, module, f.attr, old))
            continue
        undo.append(functools.partial(_restore_class, module, module.__class__))
        if f.how == "mha":
            module.__dict__["_mutransfer_attn"] = (float(alpha), f.d0)
            module.__class__ = MuMultiheadAttention
        elif f.how == "helper":
            module.__dict__["_mutransfer_attn"] = (float(alpha), f.d0)
        elif f.how == "sdpa":
            scaled_forward.install(module, sdpa=correction)

    def revert() -> None:
        for u in reversed(undo):
            u()

    return revert


# --------------------------------------------------------------------------- without a probe forward


def legacy_plan(
    model: nn.Module, base_heads: dict[str, int], alpha: float, override_d0: int | None = None
) -> list[AttentionFix]:
    """Attention found from module attributes and source when no probe forward could run.

    Assumes each module's own scale is 1/√d (what nearly every model computes); parametrize
    warns that the scales are not verified.
    """
    fixes: list[AttentionFix] = []
    for name, module in model.named_modules():
        kind = attention_kind(module)
        if kind is None:
            continue
        cname = canonical_name(name)
        d0 = override_d0 if override_d0 is not None else base_heads.get(cname)
        d = head_dim_of(module)
        if d0 is None or d is None:
            raise ModelError(
                f"attention module '{cname}' ({type(module).__name__}) calls {kind} attention but its "
                f"head dim cannot be read (no probe forward ran); pass example_inputs= to parametrize so that it "
                f"is measured, attn_base_head_dim=<head dim of the base model>, or attention=False if the "
                f"model already scales its logits the µP way"
            )
        if kind == "mha" and module.add_zero_attn:
            raise ModelError(
                f"nn.MultiheadAttention '{cname}' uses add_zero_attn=True, which "
                "mutransfer's µP attention does not support"
            )
        before, target = mup_logit_scale(None, d), mup_logit_scale((alpha, d0), d)
        how = {"mha": "mha", "helper": "helper", "sdpa": "sdpa", "scaling": "attribute scaling"}[kind]
        if math.isclose(target, before, rel_tol=1e-9):
            how = "unchanged"
        fixes.append(
            AttentionFix(module, cname, how, int(d0), int(d), before, target, "scaling" if kind == "scaling" else None)
        )
    return fixes


def _restore_output(module: nn.Module, cls: type, old: float | None) -> None:
    """Undo of a correction installed as a query projection's output multiplier."""
    module.__class__ = cls
    if old is None:
        module.__dict__.pop(scaled_forward.OUTPUT_ATTR, None)
    else:
        module.__dict__[scaled_forward.OUTPUT_ATTR] = old


def _restore_class(module: nn.Module, cls: type) -> None:
    """Undo of an installed scale that switched the class or stored a config: back to `cls`, both removed."""
    module.__class__ = cls
    module.__dict__.pop("_mutransfer_attn", None)
    module.__dict__.pop(scaled_forward.SDPA_ATTR, None)
