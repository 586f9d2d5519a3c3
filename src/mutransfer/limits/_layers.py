"""One propagation rule per layer, on kernel tensors. Each works on one block of a kernel in a
`Layout` (see `fields`): `x` (n1, n2, …) or `a`/`b` (n, …), spatial positions full (*S, *S) or
diagonal (*S). Costs are per block; n1·n2 is the number of input pairs, P the positions.

Conventions (the PyTorch layer, and where neural-tangents defines the same layer, its name):

- `nn.Linear` = `stax.Dense(parameterization="ntk")`: K' = σ_w² K + σ_b²; Θ' = K' + σ_w² Θ.
  On the network's input, K = ⟨x, x'⟩ / fan_in. A Linear on (n, *T, C) acts per position.
  Cost O(n1·n2·P) (diagonal) or O(n1·n2·P²) (full).
- `nn.Conv{1,2,3}d` = `stax.Conv`: K'[p, p'] = σ_w²/|filter| Σ_o K[s·p + d·o, s·p' + d·o] + σ_b², the
  input zero-padded as PyTorch pads (`padding=k//2` for odd k at stride 1 is neural-tangents'
  `SAME`; `padding=0` is `VALID`; `padding_mode="circular"` is `CIRCULAR`; reflect and replicate
  pad the kernel the same way). The diagonal needs only the diagonal. Cost
  O(n1·n2·P·Σ k_i) diagonal, O(n1·n2·P²·Σ k_i) full (the filter sum is separable per axis).
- `nn.AvgPool*` = `stax.AvgPool`: `count_include_pad=True` (PyTorch's default) is
  `normalize_edges=False`, `False` is `True`. Needs the full kernel. Cost O(n1·n2·P²·Σ k_i).
- global mean (`AdaptiveAvgPool*(1)`, `x.mean(dims)`) = `stax.GlobalAvgPool`: the mean of K over
  all pairs of positions. Needs the full kernel; cost O(n1·n2·P²).
- `nn.Flatten` then Linear = `stax.Flatten` then `Dense`: the mean of the same-position kernel
  (the fan-in counts channels × positions). Needs the diagonal only.
- elementwise nonlinearities (`fields.expect`): per pair of terms of the value, relu/erf/identity
  closed forms O(n1·n2·P) or O(n1·n2·P²); Mehler's series × its 240 terms; the 2-D quadrature
  fallback × 160² nodes, only on entries where it is needed. `nn.LayerNorm` (= `stax.LayerNorm`,
  eps as the module's: PyTorch's default 1e-5, neural-tangents' 1e-12), `+`, `torch.cat`: one pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from ._fields import Layout

# The layers whose weights are the width limit's random matrices (the rules below and the Monte
# Carlo networks treat exactly these): W ~ N(0, σ_w²/fan_in), b ~ N(0, σ_b²).
LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)

__all__ = [
    "LAYER_TYPES",
    "AxisOp",
    "contract_diagonal",
    "conv",
    "global_mean",
    "input_kernel",
    "pad_index",
    "pool",
    "pool_mean",
    "to_layout",
]


class AxisOp:
    """A sliding window along one spatial axis: size k, stride s, dilation d, padding (lo, hi) in
    `mode` (zeros, circular, reflect, replicate); `out` output positions."""

    def __init__(self, length: int, k: int, s: int, d: int, lo: int, hi: int, mode: str = "zeros"):
        self.length, self.k, self.s, self.d, self.lo, self.hi, self.mode = length, k, s, d, lo, hi, mode
        self.out = (length + lo + hi - d * (k - 1) - 1) // s + 1
        if self.out < 1:
            raise ValueError(f"a window of {k} (dilation {d}) does not fit {length} positions padded by ({lo}, {hi})")
        self.index = pad_index(length, lo, hi, mode)

    def counts(self) -> torch.Tensor:
        """Real (non-padding) positions in each window."""
        real = (self.index >= 0).to(torch.float64)
        return cast(
            torch.Tensor,
            sum(real[self.d * t : self.d * t + self.s * (self.out - 1) + 1 : self.s] for t in range(self.k)),
        )


def pad_index(length: int, lo: int, hi: int, mode: str) -> torch.Tensor:
    """For each padded position, the input position it reads, or −1 for a zero."""
    q = torch.arange(-lo, length + hi)
    if mode == "zeros":
        return torch.where((q >= 0) & (q < length), q, torch.full_like(q, -1))
    if mode == "circular":
        return q % length
    if mode == "replicate":
        return q.clamp(0, length - 1)
    if mode == "reflect":
        period = 2 * (length - 1)
        r = q.abs() % period if period else torch.zeros_like(q)
        return torch.where(r >= length, period - r, r)
    raise ValueError(f"padding mode {mode!r} is not one of zeros, circular, reflect, replicate")


def _padded(k: torch.Tensor, dim: int, op: AxisOp) -> torch.Tensor:
    padding = bool((op.index < 0).any())  # decided on the CPU, where the (structural) index is made
    idx = op.index.to(k.device)
    out = k.index_select(dim, idx.clamp_min(0))
    if padding:
        shape = [1] * k.ndim
        shape[dim] = len(idx)
        out = out * (idx >= 0).to(k.dtype).reshape(shape)
    return out


def _axes(layout: Layout, block: str, atom: int) -> tuple[int, ...]:
    nb, ns = layout.batch_dims(block), len(layout.spatial)
    return (nb + atom, nb + ns + atom) if layout.full else (nb + atom,)


def _window(k: torch.Tensor, dim: int, op: AxisOp, t: int) -> torch.Tensor:
    start = op.d * t
    return k.narrow(dim, start, op.s * (op.out - 1) + 1)[(slice(None),) * dim + (slice(None, None, op.s),)]


def conv(k: torch.Tensor, layout: Layout, block: str, ops: dict[int, AxisOp], average: bool = True) -> torch.Tensor:
    """Σ over filter offsets of K at the same offset on both sides, averaged over the filter
    (`average=False`: the sum, for a caller that folds 1/|filter| into its own scaling);
    `ops` maps a spatial atom to its window."""
    for atom, op in ops.items():
        dims = _axes(layout, block, atom)
        if op.mode == "zeros":
            k = _conv_zeros(k, dims, op)
            continue
        for dim in dims:
            k = _padded(k, dim, op)
        total: torch.Tensor | None = None
        for t in range(op.k):
            part = k
            for dim in dims:
                part = _window(part, dim, op, t)
            total = part if total is None else total + part
        assert total is not None  # op.k ≥ 1
        k = total
    return k / math.prod(op.k for op in ops.values()) if average else k


def _conv_zeros(k: torch.Tensor, dims: tuple[int, ...], op: AxisOp) -> torch.Tensor:
    """The zero-padded filter sum without padding copies: for each offset t, output o reads input
    q = s·o + d·t − lo where that is inside; the same o-range on every paired axis."""
    shape = list(k.shape)
    for dim in dims:
        shape[dim] = op.out
    out = None
    for t in sorted(range(op.k), key=lambda t: t != op.k // 2):  # the centre offset first: it covers all
        shift = op.d * t - op.lo
        if out is None:
            if shift >= 0 and op.s * (op.out - 1) + shift <= op.length - 1:
                src = k
                for dim in dims:
                    src = src.narrow(dim, shift, op.s * (op.out - 1) + 1)
                    if op.s > 1:
                        src = src[(slice(None),) * dim + (slice(None, None, op.s),)]
                out = src.clone()
                continue
            out = k.new_zeros(shape)
        shift = op.d * t - op.lo
        o_lo = max(0, -(shift // op.s) if shift < 0 else 0)
        while op.s * o_lo + shift < 0:
            o_lo += 1
        o_hi = min(op.out - 1, (op.length - 1 - shift) // op.s)
        if o_hi < o_lo:
            continue
        n = o_hi - o_lo + 1
        q0 = op.s * o_lo + shift
        src, dst = k, out
        for dim in dims:
            src = src.narrow(dim, q0, op.s * (n - 1) + 1)
            if op.s > 1:
                src = src[(slice(None),) * dim + (slice(None, None, op.s),)]
            dst = dst.narrow(dim, o_lo, n)
        dst.add_(src)
    assert out is not None  # op.k ≥ 1
    return out


def _window_mean(t: torch.Tensor, dim: int, op: AxisOp, count_include_pad: bool) -> torch.Tensor:
    """The windows of `op` along one axis, summed and divided by the window size (or by the real
    positions in it)."""
    norm = (
        torch.full((op.out,), float(op.k), dtype=t.dtype, device=t.device)
        if count_include_pad
        else op.counts().to(t.device)
    )
    t = _padded(t, dim, op)
    t = cast(torch.Tensor, sum(_window(t, dim, op, i) for i in range(op.k)))
    shape = [1] * t.ndim
    shape[dim] = op.out
    return t / norm.reshape(shape)


def pool(k: torch.Tensor, layout: Layout, block: str, ops: dict[int, AxisOp], count_include_pad: bool) -> torch.Tensor:
    """Average pooling of a full kernel: the window mean on each side independently."""
    if not layout.full:
        raise ValueError("average pooling needs the full spatial kernel")
    for atom, op in ops.items():
        for dim in _axes(layout, block, atom):
            k = _window_mean(k, dim, op, count_include_pad)
    return k


def pool_mean(m: torch.Tensor, ops: dict[int, AxisOp], count_include_pad: bool) -> torch.Tensor:
    """Average pooling of a per-position mean (n, *S)."""
    for atom, op in ops.items():
        m = _window_mean(m, 1 + atom, op, count_include_pad)
    return m


def contract_diagonal(k: torch.Tensor, layout: Layout, block: str, atoms: Sequence[int]) -> torch.Tensor:
    """Mean over the listed spatial atoms of the same-position kernel (a Linear after Flatten);
    the kernel comes back in `layout` without those atoms."""
    if not atoms:
        return k
    nb, ns = layout.batch_dims(block), len(layout.spatial)
    keep = [a for a in range(ns) if a not in atoms]
    if layout.full:
        # move the contracted pairs to the end, take their diagonal, average
        perm = (
            list(range(nb))
            + [nb + a for a in keep]
            + [nb + ns + a for a in keep]
            + [nb + a for a in atoms]
            + [nb + ns + a for a in atoms]
        )
        k = k.permute(perm)
        p = math.prod(layout.spatial[a] for a in atoms)
        k = k.reshape(*k.shape[: nb + 2 * len(keep)], p, p)
        return k.diagonal(dim1=-2, dim2=-1).mean(-1)
    return k.mean(dim=tuple(nb + a for a in atoms))


def global_mean(k: torch.Tensor, layout: Layout, block: str, atoms: Sequence[int]) -> torch.Tensor:
    """Mean over all pairs of positions of the listed atoms (global average pooling)."""
    if not atoms:
        return k
    if not layout.full:
        raise ValueError("a global mean needs the full spatial kernel")
    nb, ns = layout.batch_dims(block), len(layout.spatial)
    return k.mean(dim=tuple(nb + a for a in atoms) + tuple(nb + ns + a for a in atoms))


def to_layout(k: torch.Tensor, have: Layout, want: Layout, block: str) -> torch.Tensor:
    if have.full == want.full or not have.spatial:
        return k
    if want.full:
        raise RuntimeError("internal: a kernel kept diagonal was asked for in full")
    return have.diagonal(k, block)


def input_kernel(a: torch.Tensor, b: torch.Tensor, layout: Layout, block: str) -> torch.Tensor:
    """⟨x, x'⟩ / C of the network's input, channels on axis 1 for (n, C, *S) images, last for
    (n, *T, C) sequences (the caller moves them last): a (n, *S, C) and b (m, *S, C)."""
    c = a.shape[-1]
    ns = a.ndim - 2
    sp = "".join(chr(ord("p") + i) for i in range(ns))
    sq = "".join(chr(ord("f") + i) for i in range(ns))
    if block == "x":
        if layout.full:
            return torch.einsum(f"i{sp}c,j{sq}c->ij{sp}{sq}", a, b) / c
        return torch.einsum(f"i{sp}c,j{sp}c->ij{sp}", a, b) / c
    if layout.full:
        return torch.einsum(f"i{sp}c,i{sq}c->i{sp}{sq}", a, b) / c
    return (a * b).sum(-1) / c
