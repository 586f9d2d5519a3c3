"""The graph `FeatureLimit` runs: torch.fx with torch.nn's layers kept whole, each node tagged with
the modules it was traced inside (so `features(x, layer="blocks.1")` finds a container's output),
and the probe that decides whether a function acts entrywise (elementwise ops are the ones that
keep particles independent)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

__all__ = ["NORMS", "SUPPORTED", "FeatureTracer", "entrywise", "node_error", "scope_output", "trace_module"]

SUPPORTED = (
    "nn.Linear (input: data → width, hidden: width → width or r·width, readout: width → finite; biases), "
    "elementwise functions and modules, nn.LayerNorm / nn.RMSNorm over the width dim, self-attention (SDPA, "
    "nn.MultiheadAttention, or "
    "q @ kᵀ → softmax → @ v written out; masks, µP's 1/d scale), reshapes into heads, transposes, indexing, sums "
    "and means over positions, means over the width dim (see docs/limits/transformers.md)"
)
NORMS: tuple[type, ...] = (nn.LayerNorm,) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def node_error(node: fx.Node, what: str) -> ValueError:
    """The error for a node `FeatureLimit` has no rule for, naming it and what is supported."""
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", repr(node.target))
    return ValueError(
        f"FeatureLimit: {what} at graph node '{node.name}' ({node.op} {target}); this cut supports {SUPPORTED}"
    )


class FeatureTracer(fx.Tracer):
    """fx's default tracer (torch.nn's own modules are leaves) that records, on every node, the
    qualified names of the modules being traced when it was made (`node.meta["fl_scope"]`)."""

    def __init__(self) -> None:
        super().__init__()
        self._scope: list[str] = []

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        name = self.path_of_module(m)
        self._scope.append(name)
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self._scope.pop()

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta["fl_scope"] = tuple(self._scope)
        return node


def trace_module(model: nn.Module) -> fx.GraphModule:
    """The fx graph of `model`, or a ValueError saying why fx cannot trace it."""
    tracer = FeatureTracer()
    try:
        graph = tracer.trace(model)
    except Exception as e:  # control flow on traced values, unsupported Python
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"FeatureLimit: torch.fx cannot trace {type(model).__name__} ({type(e).__name__}: {first}); "
            "the limit needs a module fx can trace (no Python control flow on tensor values)"
        ) from e
    return fx.GraphModule(tracer.root, graph)


def scope_output(graph: fx.Graph, layer: str) -> fx.Node:
    """The node whose value is module `layer`'s output: the call of that module itself when it is a
    leaf, else the last node traced inside it."""
    last = None
    for node in graph.nodes:
        if node.op == "call_module" and node.target == layer:
            last = node
        elif layer in node.meta.get("fl_scope", ()):
            last = node
    if last is None:
        raise ValueError(f"layer {layer!r} is not a module the forward pass calls; give a qualified module name")
    return last


_PROBE_SHAPE = (3, 4)


def entrywise(fn: Callable[..., Any], n_tensors: int) -> bool:
    """Whether fn(t₁, …, t_k) acts entry by entry on tensors of one shape: the output keeps the
    shape and each entry equals fn on that entry alone (so it keeps particles independent)."""
    g = torch.Generator().manual_seed(1234)
    ts = [torch.randn(_PROBE_SHAPE, generator=g, dtype=torch.float64) * 0.9 + 0.1 for _ in range(n_tensors)]
    try:
        with torch.no_grad():
            full = fn(*ts)
            if not isinstance(full, torch.Tensor) or full.shape != torch.Size(_PROBE_SHAPE):
                return False
            for i in range(_PROBE_SHAPE[0]):
                for j in range(_PROBE_SHAPE[1]):
                    one = fn(*[t[i : i + 1, j : j + 1] for t in ts])
                    if not torch.allclose(one.reshape(()), full[i, j], rtol=1e-12, atol=1e-12):
                        return False
    except Exception:
        return False
    return True
