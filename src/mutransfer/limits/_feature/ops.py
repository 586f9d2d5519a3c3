"""What each graph node is, decided once before anything runs: a Linear's role (input, hidden,
readout) from the kind of tensor it reads, norms over the width dim, elementwise ops on width
tensors (probed), and ops on data or on the readout's finite outputs. Anything else is a
ValueError naming the node.

Kinds of values: "data" (the inputs, (B, d), before any width layer), "width" ((G, P, B):
particles × inputs), "finite" ((G, B, k): a value per Monte Carlo group, after a readout)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from .trace import NORMS, entrywise, node_error

__all__ = ["Op", "analyse"]


@dataclass
class Op:
    """One node: its `kind` of output, what it does (`rule`), the callable for generic ops."""

    node: fx.Node
    kind: str  # "data", "width", "finite", "const"
    rule: str  # "input", "hidden", "readout", "norm", "elementwise", "data", "finite", "output", "placeholder"
    fn: Callable[..., Any] | None = None
    module: nn.Module | None = None
    params: dict[str, str] = field(default_factory=dict)  # "weight"/"bias" → qualified name
    inputs: list[fx.Node] = field(default_factory=list)  # the nodes `fn` takes, in order


def _callable(node: fx.Node, gm: fx.GraphModule) -> Callable[..., Any]:
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))
    if node.op == "call_method":
        name = str(node.target)
        return lambda self, *a, **k: getattr(self, name)(*a, **k)
    return node.target  # type: ignore[return-value]


def _substituted(node: fx.Node, fn: Callable[..., Any]) -> tuple[Callable[..., Any], list[fx.Node]]:
    """fn of the node's tensor arguments only (other arguments fixed), and how many there are."""
    slots: list[tuple[str, Any]] = []

    def mark(a: Any) -> Any:
        if isinstance(a, fx.Node):
            slots.append(("t", a))
            return _Slot(len(slots) - 1)
        return a

    args = fx.node.map_aggregate(node.args, mark)
    kwargs = fx.node.map_aggregate(node.kwargs, mark)

    def fill(values: tuple[Any, ...]) -> Callable[[Any], Any]:
        return lambda a: values[a.i] if isinstance(a, _Slot) else a

    def call(*values: Any) -> Any:
        f = fill(values)
        return fn(*fx.node.map_aggregate(args, f), **fx.node.map_aggregate(kwargs, f))

    return call, [a for _, a in slots]


class _Slot:
    def __init__(self, i: int):
        self.i = i


def analyse(gm: fx.GraphModule, n: int) -> tuple[list[Op], dict[str, str]]:
    """The ops of `gm` in order and each parameter's role; `n` is the model's width."""
    ops: list[Op] = []
    kinds: dict[fx.Node, str] = {}
    roles: dict[str, str] = {}
    for node in gm.graph.nodes:
        in_kinds = {kinds[a] for a in node.all_input_nodes} - {"const"}
        if node.op == "placeholder":
            if node is not next(iter(gm.graph.nodes)):
                raise node_error(node, "a second input (the limit takes one input tensor x of shape (N, d))")
            op = Op(node, "data", "placeholder")
        elif node.op == "output":
            op = Op(node, "finite", "output")
            if in_kinds != {"finite"} or not isinstance(node.args[0], fx.Node):
                raise node_error(node, "the output must be one tensor computed by a width → finite readout")
        elif node.op == "get_attr":
            raise node_error(node, "a parameter or buffer used outside its module")
        elif len(in_kinds) > 1:
            raise node_error(node, f"an op mixing {' and '.join(sorted(in_kinds))} tensors")
        else:
            kind = in_kinds.pop() if in_kinds else "const"
            op = _classify(node, gm, kind, n, roles)
        kinds[node] = op.kind
        ops.append(op)
    return ops, roles


def _classify(node: fx.Node, gm: fx.GraphModule, kind: str, n: int, roles: dict[str, str]) -> Op:
    fn = _callable(node, gm)
    if node.op == "call_module":
        m = gm.get_submodule(str(node.target))
        name = str(node.target)
        own = {k: f"{name}.{k}" for k, _ in m.named_parameters(recurse=False)}
        if type(m) is nn.Linear:
            if len(node.args) != 1 or node.kwargs:
                raise node_error(node, "a Linear called with more than one argument")
            if kind == "data" and m.out_features == n:
                roles[own["weight"]] = "input"
                rule = "input"
            elif kind == "width" and m.in_features == n and m.out_features == n:
                roles[own["weight"]] = "hidden"
                rule = "hidden"
            elif kind == "width" and m.in_features == n:
                roles[own["weight"]] = "output"
                rule = "readout"
            else:
                raise node_error(node, f"a Linear ({m.in_features} → {m.out_features}) on a {kind} tensor")
            if "bias" in own:
                roles[own["bias"]] = "output_bias" if rule == "readout" else "vector"
            return Op(node, "finite" if rule == "readout" else "width", rule, module=m, params=own)
        if isinstance(m, nn.Linear):
            raise node_error(
                node,
                f"a {type(m).__name__} (a subclass of nn.Linear, e.g. a forward constant from "
                "parametrize(formulation='readout_multiplier')); use the default formulation",
            )
        if type(m) in NORMS:
            if kind != "width" or tuple(m.normalized_shape) != (n,):  # type: ignore[arg-type]
                raise node_error(node, f"a {type(m).__name__} not over the width dim")
            for k in own.values():
                roles[k] = "vector"
            return Op(node, "width", "norm", module=m, params=own)
        if own:
            raise node_error(node, f"{type(m).__name__}, a layer with parameters and no rule")
    if kind == "const":
        call, inputs = _substituted(node, fn)
        return Op(node, "const", "data", call, inputs=inputs)
    call, inputs = _substituted(node, fn)
    if kind == "width" and not entrywise(call, len(inputs)):
        raise node_error(node, "an op that is not elementwise on width tensors (it mixes particles)")
    return Op(node, kind, "elementwise" if kind == "width" else kind, call, inputs=inputs)
