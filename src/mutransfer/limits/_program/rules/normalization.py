"""LayerNorm over the width axis: in the limit the mean over the width of a centred Gaussian is 0
and its mean square is the variance, so LN(h) = h / √(Var h + ε) per input and position."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..._fields import Field
from ..context import Pass  # the pass's protocol: the rules do not import `run`
from .elementwise import one_gaussian

__all__ = ["layer_norm"]


def layer_norm(run: Pass, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> Field:
    """LayerNorm (module or F.layer_norm) of a Gaussian width tensor over its width axis alone,
    with the gain all ones and the bias all zeros at init."""
    x = run.as_field(x)
    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) else (normalized_shape,)
    if len(shape) != 1 or x.axes[-1] != ("W",):
        run.fail(
            f"LayerNorm over {shape} on axes {x.axes}: only a LayerNorm over the width axis alone has a limit rule"
        )
    if len(x.parts) != 1:
        run.fail("LayerNorm of a concatenation")
    g, fn = one_gaussian(run, x.parts[0][1])
    if fn is not None:
        run.fail("LayerNorm of a non-Gaussian tensor (its mean over the width is not zero)")
    if weight is not None and not torch.all(weight == 1):
        run.fail("LayerNorm whose weight is not all ones at init")
    if bias is not None and not torch.all(bias == 0):
        run.fail("LayerNorm whose bias is not all zeros at init")
    if run.want_ntk and weight is not None and weight.requires_grad:
        run.fail(
            "LayerNorm with a trained gain: its tangent kernel is LN(h)_i(x)·LN(h)_i(x') per coordinate, "
            "correlated with the coordinate, which the NTK rules here do not carry (use "
            "elementwise_affine=False or freeze the gain with requires_grad_(False))"
        )
    lay = run.layout_here(x.layout.spatial)
    k = ntk = None
    if run.compute:
        k, th = run.input_kernels(replace(x, layout=lay))
        scale = {}
        for blk, kin in k.items():
            sa, sb = ("a", "b") if blk == "x" else (blk, blk)
            va, vb = lay.sides(run.combo_var(g, sa, lay), run.combo_var(g, sb, lay), blk)
            scale[blk] = torch.rsqrt((va + eps) * (vb + eps))
            k[blk] = kin * scale[blk]
        k = run.fill(k)
        if run.want_ntk:
            ntk = torch.zeros_like(k["x"]) if th is None else th * scale["x"]
            if bias is not None and bias.requires_grad:  # ∂y_i/∂β_i = 1 at PyTorch's own scale
                ntk = ntk + 1.0
    support = frozenset().union(*(run.bases[j].support for j, _ in g)) if g else frozenset()
    return run.field_of(run.new_basis(lay, k, ntk, support), x.axes, x.sizes, lay)
