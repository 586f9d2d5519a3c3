"""Linear maps over position axes: average pools (windows), adaptive average pools, padding,
and mean/sum over position axes (reductions). Each reads its input's full spatial kernel; a
Gaussian input gives a Gaussian basis, anything else an opaque one that carries its own kernel,
tangent kernel and means."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from ... import _layers as L
from ..._fields import Field, Layout
from ..context import Pass  # the pass's protocol: the rules do not import `run`
from .elementwise import scale

__all__ = ["adaptive_pool", "avg_pool", "pad", "pool_field", "reduce"]


def reduce(run: Pass, x: Any, how: str, dim: Any = None, keepdim: bool = False, **kw: Any) -> Field:
    """x.mean(dim) or x.sum(dim) over position axes (`how` is "mean" or "sum")."""
    x = run.as_field(x)
    if dim is None:
        run.fail(f"{how} over every axis of a width tensor")
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = sorted(d % len(x.axes) for d in dims)
    atoms: list = []
    for d in dims:
        if "W" in x.axes[d] or "B" in x.axes[d]:
            run.fail(f"{how} over the width or the batch axis (the width is infinite here)")
        atoms += list(x.axes[d])
    count = math.prod(x.sizes[a] for a in atoms)
    out = pool_field(run, x, atoms, None, True)
    axes = []
    for i, ax in enumerate(out.axes):
        if i in dims:
            if keepdim:
                axes.append(())
        else:
            axes.append(ax)
    out = replace(out, axes=axes)
    return scale(run, out, float(count)) if how == "sum" else out


def adaptive_pool(run: Pass, x: Any, output_size: Any) -> Field:
    """Adaptive average pooling where every output window is whole (or the global mean)."""
    x = run.as_field(x)
    nd = len(x.axes) - 2
    outs = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    atoms = [ax[0] if len(ax) == 1 else None for ax in x.axes[2:]]
    if None in atoms or x.axes[1] != ("W",):
        run.fail(f"adaptive pooling on axes {x.axes}")
    ops = {}
    globals_ = []
    for a, o in zip(atoms, outs):
        n = x.sizes[a]
        o = n if o is None else o
        if o == 1:
            globals_.append(a)
        elif n % o == 0:
            ops[a] = L.AxisOp(n, n // o, n // o, 1, 0, 0)
        else:
            run.fail(f"adaptive average pooling of {n} positions to {o} (not a whole window)")
    return pool_field(run, x, globals_, ops, True)


def pad(run: Pass, x: Any, pads: Any, mode: str, value: Any) -> Field:
    """F.pad on position axes: the kernel read through the padding's index map (zeros: 0)."""
    x = run.as_field(x)
    if mode == "constant" and value not in (None, 0, 0.0):
        run.fail(f"padding with the constant {value} (only zeros keep the kernel's rules)")
    modes = {"constant": "zeros", "circular": "circular", "reflect": "reflect", "replicate": "replicate"}
    if mode not in modes:
        run.fail(f"padding mode {mode!r}")
    pads = list(pads)
    ops = {}
    for i in range(len(pads) // 2):
        lo, hi = pads[2 * i], pads[2 * i + 1]
        ax = x.axes[len(x.axes) - 1 - i]
        if lo == hi == 0:
            continue
        if len(ax) != 1 or ax[0] in ("W", "B"):
            run.fail(f"padding axis {len(x.axes) - 1 - i} ({ax}), which is not one position axis")
        ops[ax[0]] = L.AxisOp(x.sizes[ax[0]], 1, 1, 1, lo, hi, modes[mode])
    return pool_field(run, x, [], ops, True) if ops else x


def avg_pool(run: Pass, x: Any, kernel_size: Any, stride: Any, padding: Any, count_include_pad: bool) -> Field:
    """AvgPool1d/2d/3d (module or function) with ceil_mode=False and no divisor_override."""
    x = run.as_field(x)
    nd = len(x.axes) - 2

    def tup(v: Any) -> tuple:
        return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd

    ks, st, pd = tup(kernel_size), tup(stride if stride else kernel_size), tup(padding)
    atoms = [ax[0] if len(ax) == 1 else None for ax in x.axes[-nd:]]
    if None in atoms or "W" in atoms or "B" in atoms:
        run.fail(f"average pooling on axes {x.axes}")
    ops = {a: L.AxisOp(x.sizes[a], k, s, 1, p, p) for a, k, s, p in zip(atoms, ks, st, pd)}
    return pool_field(run, x, [], ops, bool(count_include_pad))


def pool_field(run: Pass, x: Field, global_atoms: list, ops: dict | None, count_include_pad: bool) -> Field:
    """A linear map over positions: windows (`ops`) and/or a global mean over `global_atoms`.
    A Gaussian input gives a Gaussian basis; anything else an opaque one (kernel, NTK, means)."""
    run.need(run.node.all_input_nodes[0], "full") if run.node.all_input_nodes else None
    ops = ops or {}
    sizes_after = list(x.layout.spatial)
    for a, op in ops.items():
        sizes_after[a] = op.out
    keep = [a for a in range(len(sizes_after)) if a not in global_atoms]
    renum = {a: i for i, a in enumerate(keep)}
    spatial = tuple(sizes_after[a] for a in keep)
    lay = run.layout_here(spatial)
    gaussian = (
        all(len(p[1]) > 0 for p in x.parts)
        and len(x.parts) == 1
        and all(t.f.kind == "identity" and run.opaque(t) is None for t in x.parts[0][1])
    )
    k = ntk = means = None
    xin = replace(x, layout=replace(x.layout, full=True)) if x.layout.spatial else x
    mid = Layout(tuple(sizes_after), True)
    if run.compute:
        k, th = run.input_kernels(xin)
        for blk, kk in k.items():
            if ops:
                kk = L.pool(kk, xin.layout, blk, ops, count_include_pad)
            kk = L.global_mean(kk, mid, blk, global_atoms)
            k[blk] = L.to_layout(kk, Layout(spatial, True), lay, blk)
        k = run.fill(k)
        if run.want_ntk:
            if th is None:
                ntk = torch.zeros_like(k["x"])
            else:
                if ops:
                    th = L.pool(th, xin.layout, "x", ops, count_include_pad)
                th = L.global_mean(th, mid, "x", global_atoms)
                ntk = L.to_layout(th, Layout(spatial, True), lay, "x")
        if not gaussian:
            means = {}
            for side in ("a", "b"):
                m = run.field_means(xin, side)
                if not isinstance(m, torch.Tensor):
                    m = torch.zeros(
                        (run.xa if side == "a" else run.xb).shape[0],
                        *x.layout.spatial,
                        dtype=torch.float64,
                        device=run.xa.device,
                    )
                if ops:
                    m = L.pool_mean(m, ops, count_include_pad)
                if global_atoms:
                    m = m.mean(dim=tuple(1 + a for a in global_atoms))
                means[side] = m
    support: frozenset = frozenset()
    for _, terms in x.parts:
        for t in terms:
            for j, _ in t.combo:
                support |= run.bases[j].support
    bid = run.new_basis(lay, k, ntk, support, means, gaussian)
    axes = []
    for ax in x.axes:
        new = tuple(renum[a] if isinstance(a, int) else a for a in ax if not (isinstance(a, int) and a not in renum))
        axes.append(new)
    sizes: dict = {renum[a]: spatial[renum[a]] for a in keep}
    sizes["W"] = x.sizes["W"]
    return run.field_of(bid, axes, sizes, lay)
