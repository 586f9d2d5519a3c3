"""Zoo models for issue 29, mechanism 5 (second half): fused projections whose output rows scale differently."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Tap(nn.Module):
    """Names a tensor for the coordinate check (a copy, so that the check does not skip it as a pass-through)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class ToyMamba2(nn.Module):
    """Mechanism 5 of issue 29: a Mamba-2-style block whose fused in_proj gives z, x (grow), B, C (fixed: d_state) and dt.

    in_proj = Linear(width, 2·d_inner + 2·d_state + nheads); its output is split into z, x, B, C, dt;
    a selective scan in plain torch (one group, scalar decay per head), gated RMS-free LayerNorm,
    out_proj back to the residual stream, and a readout over a small vocabulary.
    """

    def __init__(self, width: int = 64, d_state: int = 8, headdim: int = 16, vocab: int = 64, split: str = "split"):
        super().__init__()
        self.d_inner = 2 * width
        self.d_state = d_state
        self.headdim = headdim
        self.nheads = self.d_inner // headdim
        self.split = split
        self.emb = nn.Embedding(vocab, width)
        self.in_proj = nn.Linear(width, 2 * self.d_inner + 2 * d_state + self.nheads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, self.nheads)))
        self.dt_bias = nn.Parameter(torch.log(torch.expm1(torch.linspace(0.01, 0.1, self.nheads))))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.b_tap, self.c_tap = Tap(), Tap()
        self.norm = nn.LayerNorm(self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)

    def _pieces(self, zxbcdt: torch.Tensor):
        sizes = [self.d_inner, self.d_inner, self.d_state, self.d_state, self.nheads]
        if self.split == "split":
            return torch.split(zxbcdt, sizes, dim=-1)
        out, start = [], 0  # slicing
        for s in sizes:
            out.append(zxbcdt[..., start : start + s])
            start += s
        return out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        u = self.emb(ids)
        z, x, B, C, dt = self._pieces(self.in_proj(u))
        B, C = self.b_tap(B), self.c_tap(C)
        batch, length, _ = x.shape
        x = F.silu(x).view(batch, length, self.nheads, self.headdim)
        dt = F.softplus(dt + self.dt_bias)  # (b, l, h)
        A = -torch.exp(self.A_log)
        state = x.new_zeros(batch, self.nheads, self.headdim, self.d_state)
        ys = []
        for t in range(length):
            decay = torch.exp(dt[:, t] * A)[:, :, None, None]
            inject = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, None, None, :]
            state = state * decay + inject
            ys.append((state * C[:, t, None, None, :]).sum(-1) + self.D[:, None] * x[:, t])
        y = torch.stack(ys, dim=1).reshape(batch, length, self.d_inner)
        y = self.norm(y * F.silu(z))
        return self.head(u + self.out_proj(y))


class ConcatInput(nn.Module):
    """Mechanism 5 of issue 29, the reverse fusion: a fixed-size input concatenated beside a width-sized one
    into one projection's columns (mix: columns 0:width hidden-like, width:width+16 input-like)."""

    def __init__(self, width: int = 64, features: int = 16):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.mix = nn.Linear(width + features, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        return self.head(F.relu(self.mix(torch.cat([h, x], dim=-1))))


def hf_mamba2(width: int, seed: int = 0) -> nn.Module:
    """Mechanism 5 of issue 29 on Hugging Face's Mamba-2: in_proj → split → transpose → depthwise conv1d → split
    into x, B, C (B and C: n_groups·state_size = 8 rows at every width)."""
    import transformers as tf

    cfg = tf.Mamba2Config(
        vocab_size=64,
        hidden_size=width,
        state_size=8,
        num_heads=width * 2 // 16,
        head_dim=16,
        n_groups=1,
        expand=2,
        num_hidden_layers=1,
        chunk_size=8,
        use_cache=False,
    )
    torch.manual_seed(seed)
    return tf.Mamba2ForCausalLM(cfg)
