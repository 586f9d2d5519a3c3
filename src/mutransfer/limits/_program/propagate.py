"""`program_kernels`: trace a module, run the structure and needs passes, then the kernel pass in
chunks of x1 rows (every rule is independent across input pairs), float64."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import fx, nn

from .._fields import Field
from .analysis import needs
from .run import Run
from .trace import NotExact, trace

__all__ = ["prepare_inputs", "program_kernels"]

# float64 entries of one (chunk, n2, *S, *S) block: 32 MB, so a layer's passes stay in cache
_CHUNK_ELEMENTS = 4_000_000


def prepare_inputs(x: Any, name: str) -> torch.Tensor:
    """`x` (a tensor or numpy array with a batch axis first) as a float64 tensor."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(x).__name__}")
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"{name} must have a batch axis first, got shape {tuple(x.shape)}")
    return x.detach().to(torch.float64)


def program_kernels(
    model: nn.Module,
    x1: Any,
    x2: Any = None,
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    ntk: bool = True,
    gm: fx.GraphModule | None = None,
    self_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(NNGP, NTK or None) of one output unit of `model` in the infinite-width limit, exactly.
    `self_only`: just K(x, x) per row of x1, (n1, …). Raises NotExact naming the op and graph node
    where no rule applies."""
    a = prepare_inputs(x1, "x1")
    same = x2 is None
    b = a if same else prepare_inputs(x2, "x2")
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(
            f"x1 and x2 must have the same shape after the batch axis, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    graph = gm if gm is not None else trace(model, a[:2].to(dtype) if len(a) >= 2 else torch.cat([a, a]).to(dtype))
    originals: dict[str, torch.Tensor] = dict(model.named_parameters())
    originals.update(dict(model.named_buffers()))

    def make_run(xa, xb, same_inputs, compute, full, want_ntk, self_only=False) -> Run:
        return Run(
            graph,
            xa,
            xb,
            same_inputs,
            weight_var,
            bias_var,
            compute,
            full,
            want_ntk,
            originals=originals,
            self_only=self_only,
        )

    probe = make_run(a[:1], b[:1], same, False, {}, ntk)  # the structure pass
    out = probe.run()
    if not isinstance(out, Field):
        raise NotExact(
            f"the model's output is not a single tensor computed through a Linear or Conv (got {type(out).__name__})"
        )
    full = needs(graph, probe.requires)
    if self_only:
        run = make_run(a, a, True, True, full, False, self_only=True)
        res = run.run()
        return res.layout.diagonal(run.field_kernel(res, "a"), "a"), None
    # chunks of x1 rows, so one block stays near _CHUNK_ELEMENTS; with x2 = x1 only the upper
    # triangle of row chunks is computed (the kernel is symmetric), the rest mirrored
    per_row = len(b) * max(
        [1] + [math.prod(bs.layout.spatial) ** (2 if full.get(bs.node) else 1) for bs in probe.bases.values()]
    )
    rows = max(1, min(len(a), _CHUNK_ELEMENTS // max(1, per_row)))
    k: Any = None
    t: Any = None
    for s in range(0, len(a), rows):
        e = min(len(a), s + rows)
        whole = s == 0 and e == len(a)
        cols = slice(s, None) if same else slice(None)
        run = make_run(a[s:e], b[cols], same and whole, True, full, ntk)
        res = run.run()
        kk, th = run.field_kernels(res, "x", ntk)
        kk = res.layout.diagonal(kk, "x")
        tt = (res.layout.diagonal(th, "x") if th is not None else torch.zeros_like(kk)) if ntk else None
        if whole:
            k, t = kk, tt
            break
        if k is None:
            k = kk.new_empty(len(a), len(b), *kk.shape[2:])
            t = torch.empty_like(k) if ntk else None
        for dest, part in ((k, kk), (t, tt)):
            if dest is None:
                continue
            assert part is not None  # t and tt are both set when the NTK is wanted
            dest[s:e, cols] = part
            if same:
                dest[s:, s:e] = part.transpose(0, 1)
    if same and k.ndim == 2:
        k = (k + k.T) / 2
        t = None if t is None else (t + t.T) / 2
    return k, t
