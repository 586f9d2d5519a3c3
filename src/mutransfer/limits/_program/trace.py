"""Tracing a module into a graph: torch.fx first (torch.nn's own layers stay whole), torch.export's
ATen graph where fx cannot trace it; and the ATen ops seen as the torch functions the rules know."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = ["ATEN", "ATEN_IDENTITY", "LAYER_ATEN", "LAYER_FNS", "Alias", "NotExact", "trace"]


class _NotExact(Exception):
    """An op the exact propagation has no rule for; `what` names it, `node` is the graph node.

    Control flow inside `mutransfer.limits`, never met by users: `model_kernels` turns it into a
    Monte Carlo fallback with a `KernelWarning`, or a ValueError with `exact=True`."""

    def __init__(self, what: str, node: fx.Node | None = None):
        self.what, self.node = what, node
        where = f" at graph node '{node.name}' ({node.op} {target_name(node)})" if node is not None else ""
        super().__init__(f"{what}{where}")


NotExact = _NotExact  # the name the other modules of limits raise and catch it by


def target_name(node: fx.Node) -> str:
    """The name of what a graph node calls (a module path, a method name or a function's name)."""
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", repr(t))


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def trace(model: nn.Module, example: torch.Tensor | None = None) -> fx.GraphModule:
    """torch.fx graph of `model` (torch.nn's own layers stay whole: fx's default leaves); where fx
    cannot trace it (Python control flow on shapes, say) and an `example` input is given,
    torch.export's ATen graph, with the batch axis dynamic."""
    try:
        return fx.symbolic_trace(model)
    except Exception as e:  # control flow on traced values, unsupported Python
        fx_error = _first_line(e)
    if example is None:
        raise NotExact(f"torch.fx cannot trace {type(model).__name__} ({fx_error})")
    try:
        batch = torch.export.Dim("batch")
        ep = torch.export.export(model, (example,), dynamic_shapes=({0: batch},), strict=False)
        gm = ep.module()
        gm._mutransfer_exported = True  # type: ignore[assignment]  # a marker attribute; nn.Module's __setattr__ stub only takes tensors and modules
        return gm
    except Exception as e:
        raise NotExact(
            f"neither torch.fx ({fx_error}) nor torch.export ({_first_line(e)}) can trace {type(model).__name__}"
        ) from e


def _aten_table() -> dict[Any, Any]:
    """ATen ops of a torch.export graph → the torch functions the rules know (same arguments)."""
    aten = torch.ops.aten
    return {
        aten.linear: F.linear,
        aten.conv1d: F.conv1d,
        aten.conv2d: F.conv2d,
        aten.conv3d: F.conv3d,
        aten.relu: torch.relu,
        aten.tanh: torch.tanh,
        aten.sigmoid: torch.sigmoid,
        aten.erf: torch.erf,
        aten.abs: torch.abs,
        aten.gelu: F.gelu,
        aten.silu: F.silu,
        aten.leaky_relu: F.leaky_relu,
        aten.softplus: F.softplus,
        aten.hardtanh: F.hardtanh,
        aten.mish: F.mish,
        aten.sin: torch.sin,
        aten.cos: torch.cos,
        aten.exp: torch.exp,
        aten.add: torch.add,
        aten.sub: torch.sub,
        aten.mul: torch.mul,
        aten.div: torch.div,
        aten.neg: torch.neg,
        aten.view: torch.reshape,
        aten.reshape: torch.reshape,
        aten._unsafe_view: torch.reshape,
        aten.flatten: torch.flatten,
        aten.permute: torch.permute,
        aten.transpose: torch.transpose,
        aten.unsqueeze: torch.unsqueeze,
        aten.squeeze: torch.squeeze,
        aten.mean: torch.mean,
        aten.sum: torch.sum,
        aten.cat: torch.cat,
        aten.dropout: F.dropout,
        aten.adaptive_avg_pool1d: F.adaptive_avg_pool1d,
        aten.adaptive_avg_pool2d: F.adaptive_avg_pool2d,
        aten.adaptive_avg_pool3d: F.adaptive_avg_pool3d,
        aten.avg_pool1d: F.avg_pool1d,
        aten.avg_pool2d: F.avg_pool2d,
        aten.avg_pool3d: F.avg_pool3d,
        aten.layer_norm: F.layer_norm,
        aten.pad: F.pad,
    }


ATEN = _aten_table()
ATEN_IDENTITY = {torch.ops.aten.clone, torch.ops.aten.contiguous, torch.ops.aten.alias, torch.ops.aten.detach}

LAYER_FNS = (F.linear, F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d)
LAYER_ATEN = {torch.ops.aten.linear, torch.ops.aten.conv1d, torch.ops.aten.conv2d, torch.ops.aten.conv3d}


class Alias:
    """An ATen node seen as the torch function with the same arguments."""

    def __init__(self, node: fx.Node, target: Any):
        self.node, self.target, self.op = node, target, "call_function"
        self.name, self.all_input_nodes = node.name, node.all_input_nodes
