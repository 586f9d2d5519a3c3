"""Reference models written in plain PyTorch (standard parametrization), width as an argument.

Nothing here knows about µP: they are what a user would write, so that `mt.parametrize`
is exercised the way users use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CNN",
    "GPT",
    "MLP",
    "BasicBlock",
    "Block",
    "CausalSelfAttention",
    "Llama",
    "MHATransformer",
    "ResBlock",
    "ResMLP",
    "ResNet",
]


class MLP(nn.Module):
    """`depth` hidden layers of size `width`, ReLU, PyTorch default init."""

    def __init__(self, width: int, d_in: int = 32, d_out: int = 10, depth: int = 2, bias: bool = True):
        super().__init__()
        self.input = nn.Linear(d_in, width, bias=bias)
        self.hidden = nn.ModuleList(nn.Linear(width, width, bias=bias) for _ in range(depth - 1))
        self.readout = nn.Linear(width, d_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.input(x))
        for layer in self.hidden:
            h = F.relu(layer(h))
        return self.readout(h)


class ResBlock(nn.Module):
    """Pre-LN residual MLP block: x + fc2(relu(fc1(norm(x))))."""

    def __init__(self, width: int, expansion: int = 1):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, expansion * width)
        self.fc2 = nn.Linear(expansion * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    """Residual MLP: input layer, `depth` pre-LN residual blocks, final LayerNorm, readout."""

    def __init__(self, width: int, depth: int = 2, d_in: int = 32, d_out: int = 10):
        super().__init__()
        self.input = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.readout = nn.Linear(width, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input(x)
        for block in self.blocks:
            h = block(h)
        return self.readout(self.norm(h))


class CNN(nn.Module):
    """Two conv layers with `width` channels, BatchNorm, global pooling, linear readout."""

    def __init__(self, width: int, in_channels: int = 3, n_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(width)
        self.readout = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return self.readout(h.mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    """ResNet basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).

    The shortcut is the identity, or a strided 1×1 conv + BatchNorm when the block changes the
    channel count or the resolution (He et al. 2016, option B).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """Small ResNet with BatchNorm for small images, `width` = the stem's channel count.

    Conv stem (3×3, BatchNorm, ReLU), then one stage per entry of `blocks`: stage i has
    `width · 2^i` channels and `blocks[i]` BasicBlocks, the first of which halves the resolution
    (from stage 1 on) with a 1×1-conv shortcut; global average pool; linear head. PyTorch's
    default init. `ResNet(16, blocks=(2, 2, 2))` is CIFAR's ResNet-14 at half width.
    """

    def __init__(self, width: int, in_channels: int = 3, n_classes: int = 10, blocks: tuple[int, ...] = (1, 1, 1)):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        layers, channels = [], width
        for i, n in enumerate(blocks):
            out = width * 2**i
            for j in range(n):
                layers.append(BasicBlock(channels, out, stride=2 if (i > 0 and j == 0) else 1))
                channels = out
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(F.relu(self.bn(self.stem(x))))
        return self.head(h.mean(dim=(2, 3)))


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.n_embd = d_model
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Pre-LN decoder-only transformer with tied input/output embeddings (nanoGPT-style init).

    Width grows through the head dim at a fixed head count, the case where µP's 1/d
    attention matters.
    """

    def __init__(
        self,
        width: int,
        vocab: int = 256,
        n_layer: int = 2,
        n_head: int = 4,
        ctx: int = 64,
        tied: bool = True,
        init_std: float | None = 0.02,
    ):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList(Block(width, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight
        if init_std is not None:  # None: PyTorch's default init
            self.apply(lambda m: self._init(m, init_std))

    @staticmethod
    def _init(module: nn.Module, std: float) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class MHATransformer(nn.Module):
    """Encoder using nn.MultiheadAttention (batch_first) and a classification readout."""

    def __init__(self, width: int, d_in: int = 16, n_classes: int = 10, n_head: int = 2):
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.attn = nn.MultiheadAttention(width, n_head, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Linear(width, width)
        self.readout = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        h = self.norm(h + a)
        h = h + F.relu(self.ff(h))
        return self.readout(h.mean(dim=1))


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (Llama's), ε inside the root."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def _rotate(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, positions, head_dim), computed from positions on
    x's device (no buffer: a model built on meta and materialised with `to_empty` needs no re-init)."""
    t, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angle = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LlamaAttention(nn.Module):
    """Grouped-query attention with separate q/k/v/o projections, rotary positions, SDPA (causal).

    The head count is read from the projections' own shapes in the forward, so that a tensor-parallel
    plan that shards q/k/v column-wise (each rank holds whole heads) needs no change to the module.
    """

    def __init__(self, width: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        if width % n_heads:
            raise ValueError(f"width {width} is not divisible by n_heads {n_heads}")
        self.head_dim = width // n_heads
        self.wq = nn.Linear(width, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(width, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.wq(x), self.wk(x), self.wv(x)))
        q, k = _rotate(q), _rotate(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)  # gate
        self.w3 = nn.Linear(width, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, width, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, width: int, n_heads: int, n_kv_heads: int, ffn: int):
        super().__init__()
        self.attention_norm = RMSNorm(width)
        self.attention = LlamaAttention(width, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(width)
        self.feed_forward = SwiGLU(width, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """A Llama written the torchtitan way: RMSNorm, separate q/k/v/o, SwiGLU, rotary, untied readout.

    `init_weights()` is the model's own (standard-parametrization) init, as torchtitan's models have
    one for after `to_empty`: it is *not* µP's; after `mt.parametrize`, use `mt.init_weights`.

    Args:
        width: d_model.
        vocab: vocabulary size.
        n_layers: number of blocks.
        n_heads: query heads (fixed across widths: head_dim grows with width).
        n_kv_heads: key/value heads (grouped-query attention when fewer than n_heads).
        ffn_mult: the SwiGLU hidden size as a multiple of width (rounded up to a multiple of `multiple_of`,
            as Llama does, so that tensor parallel can split it evenly).
        multiple_of: the SwiGLU hidden size is a multiple of this.
        init_std: std of the weights' normal init.
    """

    def __init__(
        self,
        width: int,
        vocab: int = 256,
        n_layers: int = 2,
        n_heads: int = 4,
        n_kv_heads: int | None = None,
        ffn_mult: float = 8 / 3,
        multiple_of: int = 16,
        init_std: float = 0.02,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.init_std = init_std
        self.tok_embeddings = nn.Embedding(vocab, width)
        ffn = multiple_of * -(-int(ffn_mult * width) // multiple_of)
        self.layers = nn.ModuleList(LlamaBlock(width, n_heads, n_kv_heads, ffn) for _ in range(n_layers))
        self.norm = RMSNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, init_std) weights, unit norm gains (standard parametrization)."""
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=self.init_std)
                elif isinstance(m, RMSNorm):
                    m.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))
