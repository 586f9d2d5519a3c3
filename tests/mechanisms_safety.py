"""Small hand-written models, one per mechanism of issue 29 that the safety work covers (items 4, 5, 8, 11).

Each factory takes the width (the hidden size) and builds a randomly initialised model; head count and
head dim follow the zoo's convention (fixed heads, head dim grows with width). All run at widths 32-256.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HEADS = 4
IMAGE, PATCH = 16, 4  # a 16-pixel image cut into 4×4 patches: 16 patches + a class token
VOCAB = 50


class _Attention(nn.Module):
    """Multi-head self-attention through SDPA at its default scale 1/√d (what µP must change)."""

    def __init__(self, width: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.head_dim = width // HEADS  # readable without a probe: the old fallback assumed 1/√head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = (z.view(b, t, HEADS, w // HEADS).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, w))


# item 4: an image model whose first layer is a patch Conv (a 32-pixel image gives 64 patches, not 16)
class PatchViT(nn.Module):
    def __init__(self, width: int, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, width, PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, width) * 0.02)
        self.attn = _Attention(width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.attn(x))[:, 0])


# item 4: a model with two inputs (token ids and an image), fused by attention over both
class TwoInput(nn.Module):
    def __init__(self, width: int, classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.patch = nn.Conv2d(3, width, PATCH, stride=PATCH)
        self.attn = _Attention(width)
        self.head = nn.Linear(width, classes)

    def forward(self, token_ids: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.embed(token_ids), self.patch(image).flatten(2).transpose(1, 2)], 1)
        return self.head(self.attn(x).mean(1))


# item 4: attention the probe cannot reach without help (its input is a dict of named tensors)
class DictInput(nn.Module):
    def __init__(self, width: int, classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.attn = _Attention(width)
        self.head = nn.Linear(width, classes)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.head(self.attn(self.embed(batch["tokens"])).mean(1))


# item 5: a state-space mixer (Mamba-2 style) with a log-decay per head, a time-step bias and a skip D,
# none of them a random init that scales with width
class TinySSM(nn.Module):
    HEAD_DIM = 8

    def __init__(self, width: int):
        super().__init__()
        heads = width // self.HEAD_DIM
        self.embed = nn.Embedding(VOCAB, width)
        self.in_proj = nn.Linear(width, 2 * width, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
        dt = torch.exp(torch.rand(heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.D = nn.Parameter(torch.ones(heads))
        self.dt_proj = nn.Linear(width, heads, bias=False)
        self.out_proj = nn.Linear(width, width, bias=False)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        u = self.embed(ids)
        x, z = self.in_proj(u).chunk(2, -1)
        b, t, w = x.shape
        dt = F.softplus(self.dt_proj(u) + self.dt_bias)  # (b, t, heads)
        decay = torch.exp(-dt * torch.exp(self.A_log))  # (b, t, heads)
        xh = x.view(b, t, -1, self.HEAD_DIM)
        state, ys = torch.zeros_like(xh[:, 0]), []
        for i in range(t):
            state = decay[:, i, :, None] * state + dt[:, i, :, None] * xh[:, i]
            ys.append(state + self.D[:, None] * xh[:, i])
        y = torch.stack(ys, 1).reshape(b, t, w) * F.silu(z)
        return self.head(u + self.out_proj(y))


# item 11: a deep model whose forward is a closure set on the instance (as wrappers that trace or
# checkpoint a model do), scaled in width and depth
class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class ClosureForward(nn.Module):
    def __init__(self, width: int, depth: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(_Block(width) for _ in range(depth))
        self.head = nn.Linear(width, VOCAB)

        def forward(ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

        self.forward = forward  # the closure: an instance attribute, not the class's method
