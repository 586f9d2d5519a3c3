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
