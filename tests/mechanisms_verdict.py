"""Models for the coordinate check's verdict (issue 29, items 3, 7 and 10), written by hand.

Each is small (widths 32…256 run in well under a second per step on a CPU) and takes
``make(width)``; the head count is fixed, so the head dim grows with width. `data(...)` gives
``(inputs, targets)`` batches for `mt.coord_check`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt

VOCAB = 64
SEQ = 8
BATCH = 8
HEADS = 4
EXPERTS = 4


def tokens(seed: int = 0, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


def lm_data(n: int = 2) -> list:
    """Next-token batches: inputs (BATCH, SEQ), targets shifted by one."""
    out = []
    for i in range(n):
        x = tokens(i, seq=SEQ + 1)
        out.append((x[:, :-1], x[:, 1:]))
    return out


class _FFN(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


# Mechanism 3 (item 3): router + shared-expert gate, whose early changes are noise that shrinks
# like 1/√width under correct µP (a per-step "vanishing" rule failed it).
class MoE(nn.Module):
    """Top-2 of 4 experts with a softmax router and a sigmoid-gated shared expert (Qwen2-MoE layout)."""

    def __init__(self, d: int):
        super().__init__()
        self.router = nn.Linear(d, EXPERTS, bias=False)
        self.experts = nn.ModuleList(_FFN(d, 2 * d) for _ in range(EXPERTS))
        self.shared_expert = _FFN(d, 2 * d)
        self.shared_expert_gate = nn.Linear(d, 1, bias=False)

    def forward(self, x):
        probs = self.router(x).softmax(-1)
        weight, chosen = probs.topk(2, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            w = (weight * (chosen == e)).sum(-1, keepdim=True)
            out = out + w * expert(x)
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class MoELM(nn.Module):
    """Embedding → 2 pre-norm MoE blocks → norm → untied readout."""

    def __init__(self, d: int, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.moes = nn.ModuleList(MoE(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for norm, moe in zip(self.norms, self.moes, strict=True):
            x = x + moe(norm(x))
        return self.lm_head(self.norm(x))


# Mechanism 3 (item 3): post-norm blocks with QK-norm, whose MLP output change fell like 1/width
# at the first steps under correct µP.
class QKNormAttention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.q_norm = nn.LayerNorm(d // HEADS)
        self.k_norm = nn.LayerNorm(d // HEADS)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class PostNormBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.attn = QKNormAttention(d)
        self.ln_1 = nn.LayerNorm(d)
        self.mlp = _FFN(d, 4 * d)
        self.ln_2 = nn.LayerNorm(d)

    def forward(self, x):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class PostNormLM(nn.Module):
    """Embedding → 2 post-norm blocks with QK-norm → untied readout (BERT-like layout, causal)."""

    def __init__(self, d: int, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(PostNormBlock(d) for _ in range(layers))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


# Mechanism 7 (item 7): a model returning (loss, logits), whose "(model output)" row was the loss.
class DualEncoder(nn.Module):
    """Two towers (token bag, dense features) → fixed-size projections → contrastive logits; returns
    ``(loss, logits)`` like a CLIP-style model called with ``return_loss=True``."""

    def __init__(self, d: int, features: int = 16, proj: int = 8):
        super().__init__()
        self.text_embed = nn.EmbeddingBag(VOCAB, d)
        self.text_hidden = nn.Linear(d, d)
        self.text_proj = nn.Linear(d, proj, bias=False)
        self.image_in = nn.Linear(features, d)
        self.image_hidden = nn.Linear(d, d)
        self.image_proj = nn.Linear(d, proj, bias=False)
        self.dropout = nn.Dropout(0.1)

    def forward(self, text, image):
        a = self.text_proj(self.dropout(torch.relu(self.text_hidden(self.text_embed(text)))))
        b = self.image_proj(torch.relu(self.image_hidden(torch.relu(self.image_in(image)))))
        logits = a @ b.T
        loss = F.cross_entropy(logits, torch.arange(len(logits), device=logits.device))
        return loss, logits


def dual_data(n: int = 2) -> list:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(2000 + i)
        text = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        image = torch.randn(BATCH, 16, generator=g)
        out.append(({"text": text, "image": image}, None))
    return out


def factory(cls, base: int = 32, seed: int | None = None, **parametrize_kw):
    """``make(width)`` in µP relative to `base`; with `seed`, the factory seeds itself (mechanism 10:
    ``torch.manual_seed(seed)`` inside the factory makes every seed of a check the same model)."""

    def make(width: int) -> nn.Module:
        if seed is not None:
            torch.manual_seed(seed)
        model = cls(width)
        return mt.parametrize(model, base=cls(base), delta=cls(2 * base), **parametrize_kw)

    return make
