"""µP attention: logits scaled by α·√d₀/d (equal to 1/√d at the base head dim d₀).

Three paths, all found without editing the model:

1. ``nn.MultiheadAttention`` modules are switched to `MuMultiheadAttention` (same state_dict,
   same arguments), which passes the µP scale to ``scaled_dot_product_attention``.
2. Modules whose ``forward`` calls ``torch.nn.functional.scaled_dot_product_attention``
   (found by reading the forward's source) are switched to a subclass (see
   `scaled_forward`) whose forward makes the SDPA calls inside it use the µP scale.
   mutransfer wraps ``F.scaled_dot_product_attention`` once; outside a µP attention module
   the wrapper calls PyTorch unchanged.
3. Modules that keep their logit scale in a float attribute ``scaling`` (every Hugging Face
   attention module does, and passes it to whichever attention kernel is configured) get
   that attribute multiplied by α·√(d₀/d): no hook, no overhead.
4. Hand-written attention calls the helper ``mt.attn_scale(self, head_dim)`` in place of
   ``1 / math.sqrt(head_dim)``; it returns the µP scale on a parametrized module and
   ``1/√head_dim`` otherwise, so the same model code runs in both parametrizations.
   ``mt.attn_logits(self, q, k)`` computes the scaled logits with it, and lets the
   coordinate check record them.

The base head dim d₀ is read from the base model's attention modules: an attribute
``head_dim``/``d_head``/``head_size``, or an embedding size (``embed_dim``, ``n_embd``,
``d_model``, ``hidden_size``, ``dim``) divided by a head count (``num_heads``, ``n_head``,
``n_heads``, ``num_attention_heads``, ``heads``). When it cannot be found, pass
``attn_base_head_dim=`` to ``parametrize``. When heads are added at fixed head dim, d = d₀
and nothing changes.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .shapes import canonical_name

_HEAD_DIM_ATTRS = ("head_dim", "d_head", "head_size", "attention_head_size")
_EMBED_ATTRS = ("embed_dim", "n_embd", "d_model", "hidden_size", "dim", "all_head_size")
_HEADS_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads")
_HELPER_NAME = "attn_scale"

# --------------------------------------------------------------------------- discovery


def attention_kind(module: nn.Module) -> Optional[str]:
    """'mha', 'scaling', 'sdpa', 'helper' or None for a module that is not an attention module."""
    if isinstance(module, nn.MultiheadAttention):
        return "mha"
    if isinstance(getattr(module, "scaling", None), float) and head_dim_of(module) is not None:
        return "scaling"
    forward = type(module).forward
    if forward is nn.Module.forward or getattr(forward, "__module__", "").startswith("torch."):
        return None
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return None
    if "scaled_dot_product_attention" in source:
        return "sdpa"
    if f"{_HELPER_NAME}(" in source or "attn_logits(" in source:
        return "helper"
    return None


def head_dim_of(module: nn.Module) -> Optional[int]:
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
    cfg = getattr(module, "_mutransfer_attn", None)
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
    if LOGIT_RECORDER is not None:
        LOGIT_RECORDER(q, k, scale, False)
    return (q @ k.transpose(-2, -1)) * scale


# --------------------------------------------------------------------------- SDPA path

_ACTIVE: list[tuple[float, int]] = []  # (α, d₀) of the µP attention modules being run
_torch_sdpa = F.scaled_dot_product_attention
# Set by the coordinate check while it measures: called with (query, key, scale, is_causal).
LOGIT_RECORDER: Optional[Callable[[torch.Tensor, torch.Tensor, float, bool], None]] = None


def _mup_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    if _ACTIVE:
        alpha, d0 = _ACTIVE[-1]
        d = query.shape[-1]
        user = scale if scale is not None else 1.0 / math.sqrt(d)
        scale = user * alpha * math.sqrt(d0 / d)
    if LOGIT_RECORDER is not None:
        LOGIT_RECORDER(query, key, scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]), is_causal)
    return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                       is_causal=is_causal, scale=scale, **kwargs)


def _install_sdpa_wrapper() -> None:
    if F.scaled_dot_product_attention is not _mup_sdpa:
        F.scaled_dot_product_attention = _mup_sdpa


# --------------------------------------------------------------------------- nn.MultiheadAttention


def _as_additive(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    if mask is None or mask.dtype != torch.bool:
        return mask if mask is None else mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


class MuMultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention whose logits use the µP scale stored in `_mutransfer_attn`.

    Same parameters, buffers and arguments as the parent; modules are switched to this class
    in place by `parametrize`, so state_dicts stay interchangeable.
    """

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        alpha, d0 = self._mutransfer_attn
        scale = alpha * math.sqrt(d0) / self.head_dim
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        tgt_len, bsz, _ = query.shape
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        dtype = q.dtype
        attn_mask = _as_additive(attn_mask, dtype)
        key_padding_mask = _as_additive(key_padding_mask, dtype)
        if self.bias_k is not None:
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
                    torch.ones(tgt_len, src_len, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            if mask is not None:
                logits = logits + mask
            weights = logits.softmax(-1)
            out = F.dropout(weights, dropout, training=self.training) @ v
        else:
            weights = None
            out = _torch_sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale)
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


Plan = list[tuple[nn.Module, str, str, int, Optional[int]]]


def plan(model: nn.Module, base_heads: dict[str, int], alpha: float, override_d0: Optional[int] = None) -> Plan:
    """Find the attention modules that need the µP scale, checking everything before any change."""
    found: Plan = []
    for name, module in model.named_modules():
        kind = attention_kind(module)
        if kind is None:
            continue
        cname = canonical_name(name)
        d0 = override_d0 if override_d0 is not None else base_heads.get(cname)
        d = head_dim_of(module)
        if d0 is None:
            raise ValueError(
                f"attention module '{cname}' ({type(module).__name__}) calls {kind} attention but its "
                f"base head dim cannot be read from the base model; pass attn_base_head_dim=<head dim "
                f"of the base model> to parametrize, or attention=False if the model already scales "
                f"its logits the µP way")
        if kind == "mha" and module.add_zero_attn:
            raise ValueError(f"nn.MultiheadAttention '{cname}' uses add_zero_attn=True, which "
                             "mutransfer's µP attention does not support")
        if d == d0 and alpha == 1.0:
            continue  # the user's 1/√d is already µP's scale: leave the module untouched
        found.append((module, cname, kind, int(d0), d))
    return found


def install(found: Plan, alpha: float) -> list[tuple[str, str, int, Optional[int]]]:
    """Give every planned attention module the µP logit scale; returns (name, kind, d₀, d)."""
    for module, _, kind, d0, _ in found:
        module._mutransfer_attn = (float(alpha), d0)
        if kind == "mha":
            module.__class__ = MuMultiheadAttention
        elif kind == "scaling":
            module.scaling = module.scaling * float(alpha) * math.sqrt(d0 / head_dim_of(module))
        elif kind == "sdpa":
            from . import scaled_forward  # imports this module
            scaled_forward.install(module, sdpa=True)
    return [(cname, kind, d0, d) for _, cname, kind, d0, d in found]
