"""Ops that move the axes of a width tensor without touching its values: view, reshape, permute,
transpose, flatten, (un)squeeze; concatenation along the width; and `.size()`. An axis is a
regrouping of atoms (the batch, the width, position axes); splitting an atom has no rule."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..._fields import Field
from ..context import Pass  # the pass's protocol: the rules do not import `run`
from ..values import Pair, common_layout

__all__ = ["atoms_of_axis", "cat", "flatten", "reshape_like", "size"]


def size(run: Pass, x: Field, dim: int | None = None) -> Any:
    """x.size(dim): per side (a `Pair`) where it reads the batch, else the int."""
    na, nb = run.xa.shape[0], run.xb.shape[0]
    sa, sb = x.shape(na), x.shape(nb)
    if dim is None:
        return Pair(torch.Size(sa), torch.Size(sb))
    d = dim % len(sa)
    return Pair(sa[d], sb[d]) if d == 0 or x.axes[d] == ("B",) or "B" in x.axes[d] else sa[d]


def flatten(run: Pass, x: Any, start_dim: int = 0, end_dim: int = -1) -> Field:
    """torch.flatten of a width tensor."""
    x = run.as_field(x)
    return reshape_like(run, x, lambda t: torch.flatten(t, start_dim, end_dim))


def reshape_like(run: Pass, x: Any, op: Callable[[torch.Tensor], torch.Tensor]) -> Field:
    """Any view/permute: the axes are regroupings of atoms (the batch, the width, positions);
    splitting an atom (the width into heads, a position axis in two) has no rule."""
    x = run.as_field(x)
    batch = run.xa.shape[0]  # the side-A batch: sizes read off the data (x.shape[0]) are side A's
    labels, shape = [], []
    for ax in x.axes:
        for a in ax:
            labels.append(a)
            shape.append(batch if a == "B" else x.sizes[a])
    # every element holds its flat index over the atoms; an axis's steps in that index say which
    # atoms it runs over
    probe = torch.arange(math.prod(shape), dtype=torch.float64).reshape(x.shape(batch))
    try:
        moved = op(probe)
    except Exception as e:
        run.fail(f"the reshape fails on the traced shape ({type(e).__name__}: {e})")
    strides_atom, st = {}, 1
    for lab, size_ in zip(reversed(labels), reversed(shape)):
        strides_atom[lab] = (st, size_)
        st *= size_
    new_axes: list[tuple] = []
    for d in range(moved.ndim):
        n = moved.shape[d]
        if n == 1:
            new_axes.append(("B",) if d == 0 and batch == 1 else ())
            continue
        line = moved.movedim(d, -1).reshape(-1, n)[0]
        group = atoms_of_axis((line - line[0]).long(), n, strides_atom)
        if group is None:
            run.fail("a reshape that splits the width or a position axis (into heads, say)")
        new_axes.append(tuple(group))
    if not new_axes or new_axes[0] != ("B",):
        run.fail("a reshape that moves or merges the batch axis")
    return replace(x, axes=new_axes)


def atoms_of_axis(steps: torch.Tensor, n: int, strides_atom: dict) -> list | None:
    """The atoms an axis of `n` elements runs over, outermost first, from the flat-index steps along it."""
    group: list = []
    covered = 1
    while covered < n:
        step = int(steps[covered])
        hit = [lab for lab, (st, sz) in strides_atom.items() if st == step and sz > 1]
        if not hit:
            return None
        lab = hit[0]
        st, sz = strides_atom[lab]
        if n % (covered * sz) != 0:
            return None
        # check the whole atom runs contiguously here
        for i in range(1, sz):
            if int(steps[covered * i]) != st * i:
                return None
        group.insert(0, lab)
        covered *= sz
    return group


def cat(run: Pass, xs: Any, dim: int) -> Field:
    """Concatenation of width tensors along the width: a field of several parts."""
    if not all(isinstance(v, Field) for v in xs):
        run.fail("concatenating a width tensor with a tensor from the input")
    d = dim % len(xs[0].axes)
    if xs[0].axes[d] != ("W",):
        run.fail("concatenation along an axis other than the width")
    total = sum(v.sizes["W"] for v in xs)
    for v in xs[1:]:
        if [ax for i, ax in enumerate(v.axes) if i != d] != [ax for i, ax in enumerate(xs[0].axes) if i != d]:
            run.fail("concatenating width tensors whose other axes differ")
    parts = [(fr * v.sizes["W"] / total, ts) for v in xs for fr, ts in v.parts]
    sizes = dict(xs[0].sizes)
    sizes["W"] = total
    return replace(xs[0], parts=parts, sizes=sizes, layout=common_layout(*xs))
