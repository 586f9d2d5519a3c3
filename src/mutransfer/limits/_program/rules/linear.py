"""The random matrices: Linear and Conv layers, W ~ N(0, σ_w²/fan_in), b ~ N(0, σ_b²). A layer's
output is a new Gaussian basis family with kernel σ_w² E[x x'] (+ σ_b²), contracted over the
fan-in (and, for a convolution, averaged over the filter's window), and tangent kernel its own
parameters' part plus σ_w² times its input's tangent kernel read the same way."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, cast

import torch
from torch import nn

from ... import _layers as L
from ..._fields import Field, Layout
from ..context import Pass  # the pass's protocol: the rules do not import `run`
from ..values import Pair

__all__ = ["affine", "conv", "linear", "own_ntk", "shared"]


def shared(run: Pass, weight: torch.Tensor) -> None:
    """A weight used by a second layer call (weight sharing, a module applied twice): its
    outputs are correlated and its NTK gets cross terms the rules here do not carry."""
    key = weight.data_ptr()
    if key in run.used_weights:
        run.fail(
            f"a weight used by two layer calls (first at graph node '{run.used_weights[key]}'): "
            "weight sharing has no exact rule here"
        )
    run.used_weights[key] = run.node.name


def own_ntk(run: Pass, k: torch.Tensor, weight: Any, bias: Any) -> torch.Tensor:
    """The layer's own parameters' part of Θ: σ_w² K_in for a trained weight, σ_b² for a trained
    bias (k = σ_w² K_in + σ_b² when it has a bias). Frozen parameters (requires_grad=False) do
    not train, so they add nothing."""
    w_tr = bool(getattr(weight, "requires_grad", True))
    b_tr = bias is not None and bool(getattr(bias, "requires_grad", True))
    has_b = bias is not None
    if w_tr and (b_tr or not has_b):
        return k  # read-only: kernels are never changed in place once stored
    if w_tr:  # bias frozen
        return k - run.bv
    return torch.full_like(k, run.bv if b_tr else 0.0)


def affine(run: Pass, k: torch.Tensor, bias: Any, scale: float = 1.0) -> torch.Tensor:
    """σ_w² · scale · K (+ σ_b²), one pass, out of place."""
    return torch.add(
        torch.tensor(run.bv if bias is not None else 0.0, dtype=k.dtype, device=k.device), k, alpha=run.wv * scale
    )


def linear(run: Pass, x: Any, weight: Any, bias: Any) -> Field:
    """A Linear layer (module or F.linear) over the last axis: the input layer on data, or a
    hidden/readout layer on a width tensor whose last axis holds the width."""
    if isinstance(weight, Field) or not isinstance(weight, torch.Tensor):
        run.fail("a linear layer whose weight is computed from the network's activations")
    shared(run, weight)
    fan_in, fan_out = weight.shape[1], weight.shape[0]
    if isinstance(x, Pair):  # the input layer
        xa, xb = x.a, x.b
        if xa.shape[-1] != fan_in:
            run.fail(f"input of {tuple(xa.shape)} into a Linear with fan_in {fan_in}")
        spatial = tuple(xa.shape[1:-1])
        lay = run.layout_here(spatial)
        axes: list = [("B",)] + [(i,) for i in range(len(spatial))] + [("W",)]
        sizes: dict = {i: s for i, s in enumerate(spatial)}
        sizes["W"] = fan_out
        k = ntk = None
        if run.compute:
            k = {
                blk: affine(run, L.input_kernel(*run.input_sides(xa, xb, blk), lay, blk), bias) for blk in run.blocks()
            }
            k = run.fill(k)
            ntk = own_ntk(run, k["x"], weight, bias) if run.want_ntk else None
        return run.field_of(run.new_basis(lay, k, ntk), axes, sizes, lay)
    x = run.as_field(x)
    last = x.axes[-1]
    if "W" not in last:
        run.fail(
            "a Linear over an axis that is not the width (it mixes positions or the batch with a finite random matrix)"
        )
    if x.sizes["W"] * math.prod(x.sizes[a] for a in last if a != "W") != fan_in:
        run.fail(f"a Linear with fan_in {fan_in} on an axis of {x.shape(1)[-1]}")
    contracted = [a for a in last if a != "W"]
    keep = [a for a in range(len(x.layout.spatial)) if a not in contracted]
    renum = {a: i for i, a in enumerate(keep)}
    spatial = tuple(x.layout.spatial[a] for a in keep)
    lay = run.layout_here(spatial)
    k = ntk = None
    if run.compute:
        k, th = run.input_kernels(x)
        for blk, kin in k.items():
            kin = L.contract_diagonal(kin, x.layout, blk, contracted)
            k[blk] = affine(run, L.to_layout(kin, Layout(spatial, x.layout.full), lay, blk), bias)
        k = run.fill(k)
        if run.want_ntk:
            if th is not None:
                th = L.contract_diagonal(th, x.layout, "x", contracted)
                ntk = torch.add(
                    own_ntk(run, k["x"], weight, bias),
                    L.to_layout(th, Layout(spatial, x.layout.full), lay, "x"),
                    alpha=run.wv,
                )
            else:
                ntk = own_ntk(run, k["x"], weight, bias)
    axes = [tuple(renum[a] if a in renum else a for a in ax) for ax in x.axes[:-1]] + [("W",)]
    sizes = {renum[a]: s for a, s in x.sizes.items() if a in renum}
    sizes["W"] = fan_out
    return run.field_of(run.new_basis(lay, k, ntk), axes, sizes, lay)


def conv(
    run: Pass,
    x: Any,
    weight: Any,
    stride: tuple,
    padding: Any,
    dilation: tuple,
    groups: int,
    padding_mode: str,
    kernel_size: tuple,
    bias: Any,
) -> Field:
    """A 1-, 2- or 3-d convolution (module or F.conv*d) with groups=1: over the data (the input
    layer) or over a width tensor laid out (batch, width, *positions)."""
    w = cast(torch.Tensor, weight.weight if isinstance(weight, nn.Module) else weight)
    shared(run, w)
    if groups != 1:
        run.fail(f"a convolution with groups={groups} (each group's fan-in stays finite)")
    nd = len(kernel_size)
    c_in = w.shape[1]
    if isinstance(x, Pair):
        xa = x.a
        if xa.ndim != nd + 2 or xa.shape[1] != c_in:
            run.fail(f"input of {tuple(xa.shape)} into a {nd}-d convolution with {c_in} input channels")
        in_sizes = tuple(xa.shape[2:])
        atoms = list(range(nd))
        src_layout = None
    else:
        x = run.as_field(x)
        if (
            len(x.axes) != nd + 2
            or x.axes[1] != ("W",)
            or any(len(ax) != 1 or ax[0] in ("W", "B") for ax in x.axes[2:])
        ):
            run.fail(
                f"a {nd}-d convolution on a tensor laid out as {x.axes} (it needs (batch, width, {nd} position axes))"
            )
        if x.sizes["W"] != c_in:
            run.fail(f"a convolution with {c_in} input channels on {x.sizes['W']}")
        atoms = [ax[0] for ax in x.axes[2:]]
        in_sizes = tuple(x.sizes[a] for a in atoms)
        src_layout = x.layout
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            pads = []
            for i in range(nd):
                total = dilation[i] * (kernel_size[i] - 1)
                pads.append((total // 2, total - total // 2))
        else:
            run.fail(f"padding {padding!r}")
    else:
        pads = [(p, p) for p in padding]
    ops = {}
    for i, a in enumerate(atoms):
        try:
            ops[a] = L.AxisOp(in_sizes[i], kernel_size[i], stride[i], dilation[i], *pads[i], mode=padding_mode)
        except ValueError as e:
            run.fail(str(e))
    n_sp = len(src_layout.spatial) if src_layout is not None else nd
    filter_size = math.prod(kernel_size)
    sizes_after = list(src_layout.spatial) if src_layout is not None else list(in_sizes)
    for a, op in ops.items():
        sizes_after[a] = op.out
    spatial_out = tuple(sizes_after)
    lay = run.layout_here(spatial_out)
    k = ntk = None
    if run.compute:
        th = None
        if src_layout is None:
            inner = Layout(in_sizes, lay.full)
            k = {}
            for blk in run.blocks():
                xa_, xb_ = run.input_sides(x.a, x.b, blk)
                k[blk] = L.input_kernel(xa_.movedim(1, -1), xb_.movedim(1, -1), inner, blk)
        else:
            inner = replace(src_layout, full=lay.full)
            k, th = run.input_kernels(x)
            k = {blk: L.to_layout(kin, src_layout, inner, blk) for blk, kin in k.items()}
        for blk, kin in k.items():
            k[blk] = affine(run, L.conv(kin, inner, blk, ops, average=False), bias, 1.0 / filter_size)
        k = run.fill(k)
        if run.want_ntk:
            if src_layout is not None and th is not None:
                th = L.to_layout(th, src_layout, inner, "x")
                ntk = torch.add(
                    own_ntk(run, k["x"], w, bias),
                    L.conv(th, inner, "x", ops, average=False),
                    alpha=run.wv / filter_size,
                )
            else:
                ntk = own_ntk(run, k["x"], w, bias)
    axes: list = [("B",), ("W",)] + [(a,) for a in atoms]
    sizes: dict = {a: spatial_out[a] for a in range(n_sp)}
    sizes["W"] = w.shape[0]
    return run.field_of(run.new_basis(lay, k, ntk), axes, sizes, lay)
