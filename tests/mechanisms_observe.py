"""Small models for issue 29's mechanisms 1, 2 and 9 (what the probe forward observes).

Each is a tiny causal language model over `VOCAB` tokens: width = hidden size, `HEADS` heads (so the
head dim grows with width), one block, untied readout. ``make(width, seed)`` builds it; ``batch()``
gives one (inputs, targets) batch for `mt.coord_check`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, BATCH, HEADS = 64, 8, 4, 2


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of token ids and next-token targets."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


class _Mlp(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class _Attention(nn.Module):
    """q, k, v projections; `logits(q, k)` is what each mechanism varies."""

    def __init__(self, d: int):
        super().__init__()
        self.n_heads, self.head_dim = HEADS, d // HEADS
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def heads(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def attend(self, q, k, v):
        raise NotImplementedError

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
        out = self.attend(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class _SdpaAttention(_Attention):
    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _PrescaledAttention(_Attention):
    """Mechanism 2: q pre-multiplied by `scaling` (1/√d) in the forward; `attend` gets q·scaling."""

    def __init__(self, d: int):
        super().__init__(d)
        self.scaling = self.head_dim**-0.5

    def forward(self, x):
        b, t, d = x.shape
        q = self.heads(self.q_proj(x) * self.scaling)
        k, v = self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
        return self.o_proj(self.attend(q, k, v).transpose(1, 2).reshape(b, t, d))


class _PrescaledSdpaAttention(_PrescaledAttention):
    """Mechanism 2: then SDPA with scale=1."""

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)


class _PrescaledMatmulAttention(_PrescaledAttention):
    """Mechanism 2: then a plain matmul → softmax."""

    def attend(self, q, k, v):
        t = q.shape[-2]
        logits = q @ k.transpose(-2, -1)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        return logits.masked_fill(mask, float("-inf")).softmax(-1) @ v


class _AlibiAttention(_Attention):
    """Mechanism 2: ALiBi added inside ``baddbmm`` (as Bloom does), scale in a float attribute."""

    def __init__(self, d: int):
        super().__init__(d)
        self.inv_norm_factor = 1.0 / math.sqrt(self.head_dim)
        slopes = torch.tensor([2.0 ** -(i + 1.0) for i in range(HEADS)])  # the steepest heads of a 16-head Bloom
        self.register_buffer("slopes", slopes, persistent=False)

    def attend(self, q, k, v):
        b, h, t, hd = q.shape
        alibi = (self.slopes[:, None] * torch.arange(t, dtype=q.dtype)[None, :]).repeat(b, 1)[:, None, :]
        logits = torch.baddbmm(
            alibi,
            q.reshape(b * h, t, hd),
            k.reshape(b * h, t, hd).transpose(1, 2),
            beta=1.0,
            alpha=self.inv_norm_factor,
        ).view(b, h, t, t)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        return logits.masked_fill(mask, float("-inf")).softmax(-1) @ v


class _InlineSqrtAttention(_Attention):
    """Mechanism 9: a third-party attention dividing by ``math.sqrt(head_dim)`` inline, no attribute."""

    def attend(self, q, k, v):
        t = q.shape[-2]
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        return logits.masked_fill(mask, float("-inf")).softmax(-1) @ v


class ScaledEmbedding(nn.Embedding):
    """An embedding whose forward multiplies its output by a buffer √hidden (Gemma 3's scaled embedding)."""

    def __init__(self, vocab: int, d: int):
        super().__init__(vocab, d)
        self.register_buffer("embed_scale", torch.tensor(d**0.5), persistent=False)

    def forward(self, ids):
        return super().forward(ids) * self.embed_scale


class Block(nn.Module):
    def __init__(self, d: int, attention: type[_Attention]):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.mlp = attention(d), _Mlp(d)

    def forward(self, h):
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class _FusedInlineSqrtAttention(_Attention):
    """Mechanism 9, unreachable: one fused qkv projection, so no module's output is q alone."""

    def __init__(self, d: int):
        super().__init__(d)
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (self.heads(y) for y in self.qkv(x).split(d, dim=-1))
        logits = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        return self.o_proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class TinyLM(nn.Module):
    """Embedding (× `embed_scale`) → one pre-norm block → norm → readout."""

    def __init__(self, d: int, attention: type[_Attention] = _SdpaAttention, embed_scale: str | None = None):
        super().__init__()
        self.embed = ScaledEmbedding(VOCAB, d) if embed_scale == "buffer" else nn.Embedding(VOCAB, d)
        self.block = Block(d, attention)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.embed_scale = embed_scale
        self.d = d

    def forward(self, ids):
        h = self.embed(ids)
        if self.embed_scale == "float":
            h = h * math.sqrt(self.d)
        elif self.embed_scale == "fixed":
            h = h * 0.5  # not width-dependent: nothing to compensate
        out = self.lm_head(self.ln_f(self.block(h)))
        return out * self.d**-0.5 if self.embed_scale == "logits" else out


class PositionSumLM(TinyLM):
    """Mechanism 1 with a sum after it: token embedding × √hidden plus a learned position embedding (fairseq)."""

    def __init__(self, d: int):
        super().__init__(d)
        self.pos = nn.Embedding(SEQ, d)

    def forward(self, ids):
        h = self.embed(ids) * math.sqrt(self.d) + self.pos(torch.arange(ids.shape[1]))
        return self.lm_head(self.ln_f(self.block(h)))


class RawTableLM(TinyLM):
    """Mechanism 1, not compensable: the table is a raw parameter looked up in the model's own forward."""

    def __init__(self, d: int):
        super().__init__(d)
        self.table = nn.Parameter(torch.randn(VOCAB, d))

    def forward(self, ids):
        h = F.embedding(ids, self.table) * math.sqrt(self.d)
        return self.lm_head(self.ln_f(self.block(h)))


def _factory(cls: type[TinyLM] = TinyLM, **kwargs):
    def make(width: int, seed: int = 0) -> TinyLM:
        torch.manual_seed(seed)
        return cls(width, **kwargs)

    return make


MECHANISMS = {
    # mechanism 1: the embedding output × √hidden as a Python float (Gemma's normalizer)
    "embed_sqrt_float": _factory(embed_scale="float"),
    # mechanism 1: the same constant held in a one-element buffer, inside the embedding's own forward (Gemma 3)
    "embed_sqrt_buffer": _factory(embed_scale="buffer"),
    # mechanism 2: q × scaling, then SDPA(scale=1)
    "prescaled_sdpa": _factory(attention=_PrescaledSdpaAttention),
    # mechanism 2: q × scaling, then a plain matmul → softmax
    "prescaled_matmul": _factory(attention=_PrescaledMatmulAttention),
    # mechanism 2: ALiBi bias added inside baddbmm (Bloom)
    "alibi_baddbmm": _factory(attention=_AlibiAttention),
    # mechanism 9: inline / math.sqrt(head_dim) in an attention the user cannot edit
    "inline_sqrt": _factory(attention=_InlineSqrtAttention),
}


def gemma(width: int, seed: int = 0) -> nn.Module:
    """Mechanism 1 in a real family: Hugging Face's Gemma (embedding × √hidden in its scaled embedding), tied."""
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    config = GemmaConfig(
        vocab_size=VOCAB,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=width // 4,
        max_position_embeddings=4 * SEQ,
        attn_implementation="eager",
    )
    return GemmaForCausalLM(config)


OTHERS = {
    # mechanism 1: × √hidden, then + a position embedding from another module
    "embed_sqrt_plus_position": _factory(PositionSumLM),
    # mechanism 1: × √hidden on a raw parameter's lookup: reported, not compensable
    "raw_table_sqrt": _factory(RawTableLM),
    # mechanism 1 at the other end: the logits × hidden_size**-0.5 after the readout
    "logits_inv_sqrt": _factory(embed_scale="logits"),
    # mechanism 1's control: a constant that does not depend on width
    "embed_fixed_constant": _factory(embed_scale="fixed"),
    # mechanism 9 where no module's output is q alone (fused qkv): still an error naming the fix
    "inline_sqrt_fused": _factory(attention=_FusedInlineSqrtAttention),
}
