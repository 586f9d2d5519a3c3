"""What each graph node is, decided once before anything runs, from the model's own shapes.

The graph is run on an example input at the model's width n and at a second width (the base's, or
twice n for a model that is its own base); a dim whose size differs between the two grows with the
width: that is a node's *width dim*. Nothing else is guessed from sizes.

Kinds of values (how `program` holds them):

- "data": the inputs and what is computed from them alone (model layout, no Monte Carlo group);
- "width": a tensor with one width dim: (G, *shape) with the width dim held on particles, a dim of
  m = r·n coordinates on m·P/n particles (P: particles per group at width n). A head split
  (n → H × n/H) keeps P/H particles per head: the rep *is* the network at width P, whose every sum
  over a width dim stands for the width-n network's sum ×n/P — n·E[·], the master theorem's mean;
- "finite": no width dim but computed from width values ((G, *shape), e.g. attention logits
  E[Z^q Z^k], the readout's output): deterministic in the limit, always held detached;
- "const": no input at all; "meta": Python values (sizes).

Rules: a Linear's role from the kinds it reads and makes (input data → width, hidden width →
width, readout width → finite; a width dim of r·n: rectangular, e.g. fused qkv 3n or an MLP's 4n);
norms over the width dim; scaled dot-product attention; a product of two width tensors over their
width dim ("contract": the logits of a written-out attention); a mean over the width dim ("E");
ops that keep particles apart (elementwise, probed; reshapes, transposes, indexing, products and
sums over finite dims); ops on data or finite values. Anything else is a ValueError naming the node.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from .trace import NORMS, entrywise, node_error

__all__ = ["ATTENTION_FUNCTIONS", "Op", "analyse", "own_layers", "rep_size", "resolve_attention"]

ATTENTION_FUNCTIONS = ("scaled_dot_product_attention", "mup_sdpa")
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

# methods / functions that move or select entries without mixing particles (given the width dim
# is not indexed into), and casts (the limit runs in float64: a cast is the identity)
_RESHAPE = {"view", "reshape"}
_SPLIT = {"split"}
_LAYOUT = {
    "transpose",
    "permute",
    "contiguous",
    "flatten",
    "unflatten",
    "unsqueeze",
    "squeeze",
    "movedim",
    "swapaxes",
    "expand",
    "expand_as",
    "chunk",
    "unbind",
    "repeat",
    "cat",
    "stack",
    "clone",
}
_CASTS = {"to", "float", "double", "half", "bfloat16", "type_as", "type"}
_REDUCE = {"mean", "sum", "amax", "amin", "max", "min", "logsumexp"}
_MATMUL = {"matmul", "bmm", "einsum"}
_SIZE = {"size", "dim", "ndimension"}


@dataclass
class Op:
    """One node: its `kind` of output, what it does (`rule`), the callable for generic ops."""

    node: fx.Node
    kind: str  # "data", "width", "finite", "const", "meta"
    rule: str
    fn: Callable[..., Any] | None = None
    module: nn.Module | None = None
    params: dict[str, str] = field(default_factory=dict)  # "weight"/"bias" → qualified name
    inputs: list[fx.Node] = field(default_factory=list)  # the nodes `fn` takes, in order
    wdim: int | None = None  # the width dim of a "width" output, in the model's layout
    size: int = 0  # that dim's size at width n (the model's)
    scale: float = 1.0  # attention: the logit scale in effect (sdpa), or the µP correction (contract)


def name_of(node: fx.Node) -> str:
    """The method or function name a node calls."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return ""


def _callable(node: fx.Node, gm: fx.GraphModule) -> Callable[..., Any]:
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))
    if node.op == "call_method":
        name = str(node.target)
        return lambda self, *a, **k: getattr(self, name)(*a, **k)
    return node.target  # type: ignore[return-value]


class _Slot:
    def __init__(self, i: int):
        self.i = i


def substituted(node: fx.Node, fn: Callable[..., Any]) -> tuple[Callable[..., Any], list[fx.Node]]:
    """fn of the node's node arguments only (other arguments fixed), and those nodes in order."""
    slots: list[fx.Node] = []

    def mark(a: Any) -> Any:
        if isinstance(a, fx.Node):
            slots.append(a)
            return _Slot(len(slots) - 1)
        return a

    args = fx.node.map_aggregate(node.args, mark)
    kwargs = fx.node.map_aggregate(node.kwargs, mark)

    def call(*values: Any) -> Any:
        def fill(a: Any) -> Any:
            return values[a.i] if isinstance(a, _Slot) else a

        return fn(*fx.node.map_aggregate(args, fill), **fx.node.map_aggregate(kwargs, fill))

    return call, slots


def rep_size(size: int, n: int, per: int, node: fx.Node) -> int:
    """Particles holding a width dim of `size` coordinates at width n (per: particles at width n)."""
    if (size * per) % n:
        raise node_error(
            node,
            f"a width dim of {size} at width {n} held on {size * per / n:g} particles; make particles / groups a "
            f"multiple of {n // _gcd(size, n)}",
        )
    return size * per // n


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _shapes(gm: fx.GraphModule, example: torch.Tensor) -> dict[str, Any]:
    """Each node's output shape(s) on `example` (a tensor's torch.Size, a tuple of them, or None)."""
    dtype = next((p.dtype for p in gm.parameters()), torch.float64)
    try:
        ShapeProp(gm).propagate(example.to(dtype))
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"FeatureLimit: the model does not run on an input of shape {tuple(example.shape)} ({type(e).__name__}: "
            f"{first}); pass example_input= of the shape fit and predict will get (e.g. (N, T, d) for sequences)"
        ) from e
    out: dict[str, Any] = {}
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta")
        if meta is None:
            out[node.name] = None
        elif hasattr(meta, "shape"):  # one tensor's TensorMetadata (itself a named tuple)
            out[node.name] = meta.shape
        else:
            out[node.name] = tuple(getattr(m, "shape", None) for m in meta)
    return out


def _wdim(node: fx.Node, a: Any, b: Any, ratio: float) -> int | None:
    """The one dim whose size grows with the width (a: at width n, b: at the other width)."""
    if isinstance(a, tuple) and not isinstance(a, torch.Size):
        dims = {_wdim(node, x, y, ratio) for x, y in zip(a, b, strict=True)}
        if len(dims) > 1:
            raise node_error(node, "a tuple of tensors whose width dims differ")
        return dims.pop() if dims else None
    if a is None:
        return None
    if len(a) != len(b):
        raise node_error(node, "a tensor whose number of dims depends on the width")
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(diff) > 1:
        raise node_error(node, f"a tensor with {len(diff)} dims that grow with the width (one is supported)")
    if diff and abs(a[diff[0]] / b[diff[0]] - ratio) > 1e-9 * ratio:
        raise node_error(node, f"a dim of {a[diff[0]]} (vs {b[diff[0]]}) that does not grow in proportion to the width")
    return diff[0] if diff else None


def analyse(
    gm: fx.GraphModule,
    other: fx.GraphModule,
    example: torch.Tensor,
    widths: tuple[int, int],
) -> tuple[list[Op], dict[str, str]]:
    """The ops of `gm` (the model at width n) in order and each parameter's role.

    Args:
        gm: the traced model.
        other: the same architecture traced at the other width (for the width dims).
        example: an input of the shape the limit will get (a few rows).
        widths: (n, the other width).
    """
    n, m = widths
    a_nodes, b_nodes = list(gm.graph.nodes), list(other.graph.nodes)
    if [(x.op, name_of(x) or str(x.target)) for x in a_nodes] != [(x.op, name_of(x) or str(x.target)) for x in b_nodes]:
        raise ValueError(
            "FeatureLimit: the model's forward pass traces to a different graph at the base width; the limit "
            "needs the same program at every width (no Python branches on sizes)"
        )
    sa, sb = _shapes(gm, example), _shapes(other, example)
    ops: list[Op] = []
    kinds: dict[fx.Node, str] = {}
    wdims: dict[fx.Node, int | None] = {}
    roles: dict[str, str] = {}
    for node, nb in zip(a_nodes, b_nodes, strict=True):
        sa_n, sb_n = sa[node.name], sb[nb.name]
        if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), nn.MultiheadAttention):
            sa_n, sb_n = sa_n[0], sb_n[0]  # (output, attention weights): the output's width dim
        elif _is_weights(node, gm):
            sa_n = sb_n = sa_n if not isinstance(sa_n, tuple) or isinstance(sa_n, torch.Size) else None
        wdim = _wdim(node, sa_n, sb_n, n / m)
        shape = sa_n
        in_kinds = {kinds[a] for a in node.all_input_nodes} - {"const", "meta"}
        if node.op == "placeholder":
            if node is not a_nodes[0]:
                raise node_error(node, "a second input (the limit takes one input tensor x of shape (N, …, d))")
            op = Op(node, "data", "placeholder")
        elif node.op == "output":
            op = Op(node, "finite", "output")
            if not isinstance(node.args[0], fx.Node) or kinds[node.args[0]] != "finite":
                raise node_error(node, "the output must be one tensor computed by a width → finite readout")
        elif node.op == "get_attr":
            value = _attr(gm, str(node.target))
            if isinstance(value, nn.Parameter):
                raise node_error(node, "a parameter used outside its module (wrap it in a module with a rule)")
            op = Op(node, "const", "const", fn=lambda v=value: v)
        else:
            op = _classify(node, gm, in_kinds, wdim, shape, kinds, wdims, n, roles)
        if op.kind == "width":
            if wdim is None:
                raise node_error(node, "a width-sized result with no width dim")
            op.wdim = wdim
            first = shape[0] if isinstance(shape, tuple) and not isinstance(shape, torch.Size) else shape
            op.size = int(first[wdim])
        elif wdim is not None and op.kind in ("finite", "data", "const"):
            raise node_error(node, "a value that grows with the width but is not a width tensor")
        kinds[node], wdims[node] = op.kind, op.wdim
        ops.append(op)
    return ops, roles


def _is_weights(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether `node` takes nn.MultiheadAttention's second output (its attention weights: finite)."""
    src = node.args[0] if node.args else None
    return bool(
        name_of(node) == "getitem"
        and isinstance(src, fx.Node)
        and src.op == "call_module"
        and isinstance(gm.get_submodule(str(src.target)), nn.MultiheadAttention)
        and node.args[1] == 1
    )


def _attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _classify(
    node: fx.Node,
    gm: fx.GraphModule,
    in_kinds: set[str],
    wdim: int | None,
    shape: Any,
    kinds: dict[fx.Node, str],
    wdims: dict[fx.Node, int | None],
    n: int,
    roles: dict[str, str],
) -> Op:
    fn = _callable(node, gm)
    name = name_of(node)
    widths_in = [a for a in node.all_input_nodes if kinds[a] == "width"]
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        return _module(node, mod, in_kinds, wdim, widths_in, wdims, roles)
    call, inputs = substituted(node, fn)
    if not in_kinds & {"width", "finite"}:  # data, constants, sizes: computed as written
        return Op(node, "data" if "data" in in_kinds else "const", "data", call, inputs=inputs)
    if name in _SIZE or (name == "getattr" and node.args[1:] and node.args[1] in ("shape", "ndim")):
        return Op(node, "meta", "size", call, inputs=inputs)
    if name in ATTENTION_FUNCTIONS:
        return _sdpa(node, kinds, wdims, shape)
    if _is_weights(node, gm):
        return Op(node, "finite", "getitem", call, inputs=inputs)
    if wdim is None and widths_in:  # a width value reduced to a finite one
        if name in _MATMUL or node.target is operator.matmul:
            if len(widths_in) != 2:
                raise node_error(node, "a product of a width tensor and a finite one over the width dim")
            return Op(node, "finite", "contract", call, inputs=inputs)
        if name == "mean" and len(widths_in) == 1:
            return Op(node, "finite", "E", call, inputs=inputs)
        raise node_error(
            node,
            f"{name or node.op}, an op that reduces over the width dim (only means, and attention's q·kᵀ, have a limit)",
        )
    kind = "width" if widths_in else "finite"
    if kind == "finite":
        return Op(node, "finite", "finite", call, inputs=inputs)
    if name in _RESHAPE or name == "reshape":
        return Op(node, kind, "reshape", call, inputs=inputs)
    if name in _SPLIT:
        return Op(node, kind, "split", call, inputs=inputs)
    if name == "getitem":
        return Op(node, kind, "getitem", call, inputs=inputs)
    if name in _CASTS:
        return Op(node, kind, "cast", call, inputs=inputs)
    if name in _LAYOUT or name in _REDUCE or name in _MATMUL or node.target is operator.matmul:
        return Op(node, kind, "local", call, inputs=inputs)
    if not entrywise(call, len(inputs)):
        raise node_error(node, "an op that is not elementwise on width tensors (it mixes particles)")
    return Op(node, kind, "elementwise", call, inputs=inputs)


def _module(
    node: fx.Node,
    m: nn.Module,
    in_kinds: set[str],
    wdim: int | None,
    widths_in: list[fx.Node],
    wdims: dict[fx.Node, int | None],
    roles: dict[str, str],
) -> Op:
    name = str(node.target)
    own = {k: f"{name}.{k}" for k, _ in m.named_parameters(recurse=False)}
    kind = "width" if "width" in in_kinds else "finite" if "finite" in in_kinds else "data"
    if type(m) is nn.Linear:
        if len(node.args) != 1 or node.kwargs:
            raise node_error(node, "a Linear called with more than one argument")
        src = node.args[0]
        src_w = wdims.get(src) if isinstance(src, fx.Node) else None
        if kind == "data" and wdim is not None:
            rule = roles[own["weight"]] = "input"
        elif kind == "width" and wdim is not None:
            rule = roles[own["weight"]] = "hidden"
        elif kind == "width" and wdim is None:
            roles[own["weight"]] = "output"
            rule = "readout"
        else:
            raise node_error(node, f"a Linear ({m.in_features} → {m.out_features}) on a {kind} tensor")
        if kind == "width" and isinstance(src, fx.Node) and src_w is not None and not _last(src_w, src):
            raise node_error(node, "a Linear whose input's width dim is not its last dim")
        if "bias" in own:
            roles[own["bias"]] = "output_bias" if rule == "readout" else "vector"
        return Op(node, "finite" if rule == "readout" else "width", rule, module=m, params=own)
    if isinstance(m, nn.Linear):
        raise node_error(
            node,
            f"a {type(m).__name__} (a subclass of nn.Linear, e.g. a forward constant from "
            "parametrize(formulation='readout_multiplier')); use the default formulation",
        )
    if isinstance(m, nn.MultiheadAttention):
        return _mha(node, m, kind, widths_in, wdims, roles)
    if type(m) in NORMS:
        src = node.args[0]
        if kind != "width" or len(tuple(m.normalized_shape)) != 1 or wdims.get(src) is None:  # type: ignore[arg-type]
            raise node_error(node, f"a {type(m).__name__} not over the width dim")
        for k in own.values():
            roles[k] = "vector"
        return Op(node, "width", "norm", module=m, params=own)
    if own:
        raise node_error(node, f"{type(m).__name__}, a layer with parameters and no rule")
    if isinstance(m, nn.Dropout) and m.p > 0:
        raise node_error(node, f"dropout (p = {m.p}); the limit is deterministic: build the model with p = 0")
    call, inputs = substituted(node, m)
    if kind == "width":
        if wdim is None:
            raise node_error(node, f"{type(m).__name__}, a module that reduces over the width dim")
        if isinstance(m, (nn.Softmax, nn.LogSoftmax)) or not entrywise(call, len(inputs)):
            raise node_error(node, f"{type(m).__name__}, a module that is not elementwise on width tensors")
        return Op(node, "width", "elementwise", call, inputs=inputs)
    return Op(node, kind if kind != "data" else "data", "finite" if kind == "finite" else "data", call, inputs=inputs)


def _mha(
    node: fx.Node,
    m: nn.MultiheadAttention,
    kind: str,
    widths_in: list[fx.Node],
    wdims: dict[fx.Node, int | None],
    roles: dict[str, str],
) -> Op:
    """nn.MultiheadAttention as self-attention: its fused in-projection (a 3n × n hidden matrix), heads,
    µP's logit scale (parametrize's), its out-projection."""
    name = str(node.target)
    if kind != "width" or len(set(widths_in)) != 1:
        raise node_error(
            node, "an nn.MultiheadAttention that is not self-attention on one width tensor (query = key = value)"
        )
    if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn or m.dropout:
        raise node_error(
            node, "an nn.MultiheadAttention with kdim/vdim, add_bias_kv, add_zero_attn or dropout (build it without)"
        )
    src = widths_in[0]
    meta: Any = src.meta.get("tensor_meta")
    if wdims[src] != len(meta.shape) - 1 or len(meta.shape) != 3:
        raise node_error(node, "an nn.MultiheadAttention whose input is not (batch, positions, width) or its transpose")
    own = {k: f"{name}.{k}" for k, _ in m.named_parameters()}
    roles[own["in_proj_weight"]] = roles[own["out_proj.weight"]] = "hidden"
    for k in ("in_proj_bias", "out_proj.bias"):
        if k in own:
            roles[own[k]] = "vector"
    return Op(node, "width", "mha", module=m, params=own, inputs=list(node.all_input_nodes))


def _last(wdim: int, src: fx.Node) -> bool:
    meta = src.meta.get("tensor_meta")
    nd = len(meta.shape) if meta is not None and hasattr(meta, "shape") else wdim + 1
    return wdim == nd - 1


def _sdpa(node: fx.Node, kinds: dict[fx.Node, str], wdims: dict[fx.Node, int | None], shape: Any) -> Op:
    bound = dict(zip(_SDPA_ARGS, node.args, strict=False))
    bound.update(node.kwargs)
    for key in ("query", "key", "value"):
        a = bound.get(key)
        if not isinstance(a, fx.Node) or kinds.get(a) != "width":
            raise node_error(node, f"an attention whose {key} is not a width tensor")
        meta: Any = a.meta.get("tensor_meta")
        if wdims[a] != len(meta.shape) - 1:
            raise node_error(node, f"an attention whose {key}'s width dim is not its last (head) dim")
    if bound.get("dropout_p", 0.0):
        raise node_error(node, "attention dropout (dropout_p > 0); the limit is deterministic")
    if bound.get("enable_gqa", False):
        raise node_error(node, "grouped-query attention (enable_gqa=True)")
    mask = bound.get("attn_mask")
    if isinstance(mask, fx.Node) and kinds.get(mask) in ("width", "finite"):
        raise node_error(node, "an attention mask computed from the model's features")
    if isinstance(bound.get("scale"), fx.Node) or isinstance(bound.get("is_causal"), fx.Node):
        raise node_error(node, "an attention scale or is_causal computed in the forward pass")
    return Op(node, "width", "sdpa", inputs=[a for a in node.all_input_nodes])


def own_layers(gm: fx.GraphModule, own: nn.Module, n: int) -> dict[str, tuple[str, nn.Module]]:
    """For a model that is its own base: each Linear's and norm's rule ("input", "hidden", "readout",
    "norm") from the kinds of what it reads (the inputs, or a width tensor: anything computed from a
    Linear whose outputs are a multiple of the width n), with `own`'s module of that name — what
    `scaling.widened` doubles. (A readout to a multiple of n outputs cannot be told from a hidden layer
    here: give base= for such a model.)"""
    width: set[fx.Node] = set()
    layers: dict[str, tuple[str, nn.Module]] = {}
    for node in gm.graph.nodes:
        reads = any(a in width for a in node.all_input_nodes)
        if node.op == "call_module":
            m = gm.get_submodule(str(node.target))
            name = str(node.target)
            if type(m) is nn.Linear:
                grows = m.out_features % n == 0
                rule = ("hidden" if grows else "readout") if reads else "input" if grows else ""
                if rule:
                    layers[name] = (rule, own.get_submodule(name))
                if grows:
                    width.add(node)
                continue
            if type(m) in NORMS and reads:
                layers[name] = ("norm", own.get_submodule(name))
        if reads:
            width.add(node)
    return layers


def resolve_attention(ops: list[Op], laws: dict[str, Any]) -> None:
    """Give each attention op its logit scale, from what `mt.parametrize` measured on the module it
    belongs to (`laws`: module name → `scaling.AttentionLaw`): an SDPA call runs at the scale s in
    effect; a written-out q·kᵀ gets s/s_before (the constants written after it then make s). The
    limit exists only if s·d is the same at both widths (µP's 1/d); else a ValueError."""
    for op in ops:
        if op.rule not in ("sdpa", "contract", "mha"):
            continue
        scope = op.node.meta.get("fl_scope", ())
        law = next((laws[m] for m in (*reversed(scope), "") if m in laws), None)  # "": the model itself
        if law is None:
            what = "an attention" if op.rule == "sdpa" else "a product of two width tensors over the width dim"
            raise node_error(
                op.node,
                f"{what} that mt.parametrize gave no µP logit scale (it found no attention module around it): its "
                "logits grow with the width (1/√d, or no scale) and there is no limit. Write the attention as "
                "SDPA, nn.MultiheadAttention or q @ k.transpose(-2, -1) followed by softmax inside one module",
            )
        c, c0 = law.scale * law.d, law.scale0 * law.d0
        if abs(c - c0) > 1e-6 * max(abs(c), abs(c0)):
            raise node_error(
                op.node,
                f"attention in '{law.module}' with logit scale × head dim = {c0:.6g} at head dim {law.d0} but {c:.6g} "
                f"at {law.d}: not µP's 1/d (1/√d grows the logits like √width), so it has no infinite-width limit",
            )
        op.scale = law.scale / law.before if op.rule == "contract" else law.scale
