"""The master theorem run on a PyTorch module: trace it with torch.fx into a program and
propagate NNGP and NTK kernels through it, one rule per op (see `layers` for each rule's
convention and cost, `fields` for what is propagated).

Three passes over the traced graph:

1. **structure** (on one example per side): which values are input data, which are width tensors
   and how their axes map to the width and to spatial positions; every op without an exact rule
   raises `NotExact` naming the op and the graph node;
2. **needs** (backwards): which width tensors need their full spatial covariance (a global mean
   or an average pool downstream) and which only its diagonal (everything else);
3. **kernels**, in chunks of x1 rows (every rule is independent across input pairs), float64.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from . import layers as L
from .fields import ERF, IDENTITY, ONE, RELU, STEP, Basis, Elem, Field, Layout, Term, expect_both, generic, mean

__all__ = ["NotExact", "prepare_inputs", "program_kernels", "trace"]

_CHUNK_ELEMENTS = (
    4_000_000  # float64 entries of one (chunk, n2, *S, *S) block: 32 MB, so a layer's passes stay in cache
)


class NotExact(Exception):
    """An op the exact propagation has no rule for; `what` names it, `node` is the graph node."""

    def __init__(self, what: str, node: fx.Node | None = None):
        self.what, self.node = what, node
        where = f" at graph node '{node.name}' ({node.op} {_target_name(node)})" if node is not None else ""
        super().__init__(f"{what}{where}")


def _target_name(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", repr(t))


def trace(model: nn.Module, example: torch.Tensor | None = None) -> fx.GraphModule:
    """torch.fx graph of `model` (torch.nn's own layers stay whole: fx's default leaves); where fx
    cannot trace it (Python control flow on shapes, say) and an `example` input is given,
    torch.export's ATen graph, with the batch axis dynamic."""
    try:
        return fx.symbolic_trace(model)
    except Exception as e:  # control flow on traced values, unsupported Python
        fx_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if example is None:
        raise NotExact(f"torch.fx cannot trace {type(model).__name__} ({fx_error})")
    try:
        batch = torch.export.Dim("batch")
        ep = torch.export.export(model, (example,), dynamic_shapes=({0: batch},), strict=False)
        gm = ep.module()
        gm._mutransfer_exported = True
        return gm
    except Exception as e:
        raise NotExact(
            f"neither torch.fx ({fx_error}) nor torch.export ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}) can trace {type(model).__name__}"
        ) from e


# ---- values --------------------------------------------------------------------------------------


@dataclass
class Pair:
    """A value computed from the inputs alone, once per side (x1 chunk, x2)."""

    a: Any
    b: Any


def _side(v, s: int):
    if isinstance(v, Pair):
        return v.a if s == 0 else v.b
    if isinstance(v, (list, tuple)):
        return type(v)(_side(u, s) for u in v)
    if isinstance(v, dict):
        return {k: _side(u, s) for k, u in v.items()}
    if isinstance(v, slice):
        return slice(_side(v.start, s), _side(v.stop, s), _side(v.step, s))
    return v


def _has(v, cls) -> bool:
    if isinstance(v, cls):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has(u, cls) for u in v)
    if isinstance(v, dict):
        return any(_has(u, cls) for u in v.values())
    if isinstance(v, slice):
        return any(_has(u, cls) for u in (v.start, v.stop, v.step))
    return False


def _scalar(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.requires_grad and v.ndim == 0:
        return float(v)
    return None


# ---- elementwise functions -------------------------------------------------------------------------


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _elementwise(name: str, node: fx.Node, **kw) -> list[tuple[float, Elem, float]]:
    """A nonlinearity as a list of (coef, Elem, sign) to apply to one Gaussian u: φ(u) = Σ coef·f(sign·u)."""
    if name == "relu":
        return [(1.0, RELU, 1.0)]
    if name == "erf":
        return [(1.0, ERF, 1.0)]
    if name == "leaky_relu":
        a = float(kw.get("negative_slope", 0.01))
        return [(a, IDENTITY, 1.0), (1.0 - a, RELU, 1.0)]
    if name == "abs":
        return [(1.0, RELU, 1.0), (1.0, RELU, -1.0)]
    fns = {
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "silu": F.silu,
        "mish": F.mish,
        "sin": torch.sin,
        "cos": torch.cos,
        "exp": torch.exp,
        "selu": F.selu,
        "softsign": F.softsign,
        "gelu": (_gelu_tanh if kw.get("approximate", "none") == "tanh" else F.gelu),
    }
    if name in fns:
        return [(1.0, generic(fns[name], name), 1.0)]
    if name == "elu":
        alpha = float(kw.get("alpha", 1.0))
        return [(1.0, generic(lambda x: F.elu(x, alpha), "elu"), 1.0)]
    if name == "celu":
        alpha = float(kw.get("alpha", 1.0))
        return [(1.0, generic(lambda x: F.celu(x, alpha), "celu"), 1.0)]
    if name == "softplus":
        beta, threshold = float(kw.get("beta", 1.0)), float(kw.get("threshold", 20.0))
        return [(1.0, generic(lambda x: F.softplus(x, beta, threshold), "softplus"), 1.0)]
    if name == "sign":  # 2·1(u > 0) − 1: the step's closed form; its derivative is 0 a.e.
        return [(2.0, STEP, 1.0), (-1.0, ONE, 1.0)]
    if name == "clamp":
        lo, hi = kw.get("min"), kw.get("max")
        if lo is not None and hi is None and float(lo) == 0.0:
            return [(1.0, RELU, 1.0)]
        if hi is not None and lo is None and float(hi) == 0.0:  # min(u, 0) = −relu(−u)
            return [(-1.0, RELU, -1.0)]
        return [(1.0, generic(lambda x: torch.clamp(x, lo, hi), "clamp"), 1.0)]
    if name == "pow":
        e = kw.get("exponent")
        return [(1.0, generic(lambda x: torch.pow(x, e), f"pow {e}"), 1.0)]
    if name == "relu6":
        return [(1.0, generic(F.relu6, "relu6"), 1.0)]
    if name == "hardtanh":
        lo, hi = float(kw.get("min_val", -1.0)), float(kw.get("max_val", 1.0))
        return [(1.0, generic(lambda x: F.hardtanh(x, lo, hi), "hardtanh"), 1.0)]
    raise NotExact(f"no rule for the elementwise function {name}", node)


_MODULE_ACT = {
    nn.ReLU: "relu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.SiLU: "silu",
    nn.GELU: "gelu",
    nn.LeakyReLU: "leaky_relu",
    nn.ELU: "elu",
    nn.CELU: "celu",
    nn.SELU: "selu",
    nn.Softplus: "softplus",
    nn.Mish: "mish",
    nn.Hardtanh: "hardtanh",
    nn.Softsign: "softsign",
    nn.ReLU6: "relu6",
}
_FN_ACT = {
    torch.relu: "relu",
    F.relu: "relu",
    torch.tanh: "tanh",
    F.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    F.silu: "silu",
    F.gelu: "gelu",
    F.leaky_relu: "leaky_relu",
    F.elu: "elu",
    F.celu: "celu",
    F.selu: "selu",
    torch.selu: "selu",
    F.softplus: "softplus",
    F.mish: "mish",
    F.hardtanh: "hardtanh",
    F.softsign: "softsign",
    F.relu6: "relu6",
    torch.erf: "erf",
    torch.special.erf: "erf",
    torch.abs: "abs",
    torch.sin: "sin",
    torch.cos: "cos",
    torch.exp: "exp",
}
_METHOD_FN = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "neg": torch.neg,
    "__add__": operator.add,
    "__radd__": operator.add,
    "__sub__": operator.sub,
    "__mul__": operator.mul,
    "__rmul__": operator.mul,
    "__truediv__": operator.truediv,
    "__neg__": operator.neg,
    "pow": torch.pow,
    "__pow__": torch.pow,
    "square": torch.square,
    "sign": torch.sign,
    "clamp": torch.clamp,
    "clip": torch.clip,
    "clamp_min": torch.clamp_min,
    "clamp_max": torch.clamp_max,
    "mean": torch.mean,
    "sum": torch.sum,
}
_POSITIONAL = {
    "leaky_relu": ("negative_slope",),
    "softplus": ("beta", "threshold"),
    "hardtanh": ("min_val", "max_val"),
    "elu": ("alpha",),
    "celu": ("alpha",),
    "gelu": ("approximate",),
}
_METHOD_ACT = {
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "erf": "erf",
    "abs": "abs",
    "sin": "sin",
    "cos": "cos",
    "exp": "exp",
}
_MODULE_KW = {
    nn.LeakyReLU: ("negative_slope",),
    nn.ELU: ("alpha",),
    nn.CELU: ("alpha",),
    nn.GELU: ("approximate",),
    nn.Softplus: ("beta", "threshold"),
    nn.Hardtanh: ("min_val", "max_val"),
}


def _aten_table() -> dict:
    """ATen ops of a torch.export graph → the torch functions the rules know (same arguments)."""
    aten = torch.ops.aten
    table = {
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
    return table


_ATEN = _aten_table()
_ATEN_IDENTITY = {torch.ops.aten.clone, torch.ops.aten.contiguous, torch.ops.aten.alias, torch.ops.aten.detach}

_LAYER_FNS = (F.linear, F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d)
_LAYER_ATEN = {torch.ops.aten.linear, torch.ops.aten.conv1d, torch.ops.aten.conv2d, torch.ops.aten.conv3d}


class _Alias:
    """An ATen node seen as the torch function with the same arguments."""

    def __init__(self, node: fx.Node, target):
        self.node, self.target, self.op = node, target, "call_function"
        self.name, self.all_input_nodes = node.name, node.all_input_nodes


# ---- the run -----------------------------------------------------------------------------------------


class _Run:
    """One pass over the graph. `compute=False` is the structure pass (no kernel tensors)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        xa: torch.Tensor,
        xb: torch.Tensor,
        same: bool,
        weight_var: float,
        bias_var: float,
        compute: bool,
        full: dict,
        want_ntk: bool,
        *,
        originals: dict,
        self_only: bool = False,
    ):
        self.gm, self.xa, self.xb, self.same = gm, xa, xb, same
        self.wv, self.bv = weight_var, bias_var
        self.compute, self.full, self.want_ntk = compute, full, want_ntk
        self.bases: dict[int, Basis] = {}
        self.requires: dict[fx.Node, list[tuple[fx.Node, str]]] = {}
        self.node: fx.Node | None = None
        self._float64: dict[str, nn.Module] = {}
        self.self_only = self_only  # only each input with itself (the 'a' block): K(x, x) per row
        self.used_weights: dict[int, str] = {}
        self.originals = originals  # torch.export copies parameters; the model's own say requires_grad

    # -- helpers
    def fail(self, what: str):
        raise NotExact(what, self.node)

    def need(self, arg, how: str = "pass"):
        if isinstance(arg, fx.Node):
            self.requires.setdefault(self.node, []).append((arg, how))

    def layout_here(self, spatial: tuple) -> Layout:
        return Layout(tuple(spatial), bool(self.full.get(self.node, False)) and len(spatial) > 0)

    def new_basis(
        self,
        layout: Layout,
        k: dict | None,
        ntk,
        support: frozenset = frozenset(),
        means: dict | None = None,
        gaussian: bool = True,
    ) -> int:
        bid = len(self.bases)
        self.bases[bid] = Basis(bid, layout, k or {}, ntk, frozenset(support) | {bid}, gaussian, means, self.node)
        return bid

    @staticmethod
    def _field_of(bid: int, axes: list, sizes: dict, layout: Layout) -> Field:
        """A width tensor that is one basis family itself."""
        return Field([(1.0, [Term(1.0, IDENTITY, ((bid, 1.0),))])], axes, sizes, layout)

    # -- field kernels
    def _combo_k(self, g1, g2, block: str, layout: Layout) -> torch.Tensor:
        return self._combo_sum(g1, g2, lambda b: L.to_layout(b.k[block], b.layout, layout, block))

    def _combo_ntk(self, g1, g2, layout: Layout):
        return self._combo_sum(g1, g2, lambda b: L.to_layout(b.ntk, b.layout, layout, "x"))

    def _combo_sum(self, g1, g2, get):
        """Σ_j a_j a'_j · get(basis j) over the bases both combinations use (a read-only result)."""
        d2 = dict(g2)
        pairs = [(self.bases[j], a * d2[j]) for j, a in g1 if j in d2]
        if not pairs:
            return None
        if len(pairs) == 1 and pairs[0][1] == 1.0:
            return get(pairs[0][0])
        out = get(pairs[0][0]) * pairs[0][1]
        for b, w in pairs[1:]:
            out.add_(get(b), alpha=w)
        return out

    def _combo_var(self, g, side: str, layout: Layout) -> torch.Tensor:
        """Same-position variance of combination g on side 'a' or 'b': (n, *S)."""
        out = None
        for j, a in g:
            b = self.bases[j]
            d = b.layout.diagonal(b.k[side], side) * (a * a)
            out = d if out is None else out + d
        n = (self.xa if side == "a" else self.xb).shape[0]
        return out if out is not None else torch.zeros(n, *layout.spatial, dtype=torch.float64, device=self.xa.device)

    def _opaque(self, t: Term) -> Basis | None:
        if len(t.combo) == 1 and not self.bases[t.combo[0][0]].gaussian:
            return self.bases[t.combo[0][0]]
        return None

    def _term_mean(self, t: Term, side: str, layout: Layout) -> torch.Tensor:
        """E[f(g)] of a term on one side, per point and position (its coefficient not applied)."""
        o = self._opaque(t)
        if o is not None:
            return o.means[side]
        return mean(t.f, self._combo_var(t.combo, side, layout))

    def field_kernel(self, f: Field, block: str) -> torch.Tensor:
        """E[h(x) h(x')] of one width coordinate, in f.layout."""
        return self.field_kernels(f, block, False)[0]

    def field_kernels(self, f: Field, block: str, ntk: bool):
        """(kernel, tangent kernel or None) of one width coordinate in f.layout: Σ over pairs of
        terms of E[f_t f_s] and E[f_t' f_s'] · Θ of their combinations."""
        lay = f.layout
        sa, sb = ("a", "b") if block == "x" else (block, block)
        k_total, t_total = 0.0, 0.0
        for frac, terms in f.parts:
            k_part, t_part = 0.0, 0.0
            for t in terms:
                ot = self._opaque(t)
                for s in terms:
                    os_ = self._opaque(s)
                    w = t.coef * s.coef
                    if ot is not None or os_ is not None:
                        if ot is not None and os_ is not None and ot.id == os_.id:
                            k_part = _acc(k_part, L.to_layout(ot.k[block], ot.layout, lay, block), w)
                            if ntk:
                                t_part = _acc(t_part, L.to_layout(ot.ntk, ot.layout, lay, "x"), w)
                        else:  # independent (checked in the structure pass): product of means; no Θ
                            k_part = _acc(
                                k_part,
                                self._outer(self._term_mean(t, sa, lay), self._term_mean(s, sb, lay), lay, block),
                                w,
                            )
                        continue
                    c = self._combo_k(t.combo, s.combo, block, lay)
                    va, vb = lay.sides(self._combo_var(t.combo, sa, lay), self._combo_var(s.combo, sb, lay), block)
                    if c is None:
                        c = torch.zeros(
                            torch.broadcast_shapes(va.shape, vb.shape), dtype=torch.float64, device=va.device
                        )
                    th = self._combo_ntk(t.combo, s.combo, lay) if ntk else None
                    v, dv = expect_both(t.f, s.f, va, vb, c, th is not None)
                    k_part = _acc(k_part, v, w)
                    if th is not None and dv is not None:
                        t_part = _acc(t_part, dv * th, w)
            k_total = _acc(k_total, k_part, frac)
            t_total = _acc(t_total, t_part, frac)
        return k_total, (None if isinstance(t_total, float) else t_total)

    def input_kernels(self, x: Field) -> tuple[dict, torch.Tensor | None]:
        """What a layer reads of its input: the kernel of x in each block this run computes, in
        x.layout, and (when the NTK is wanted) its tangent kernel, computed with the cross block."""
        k, th = {}, None
        for blk in self._blocks():
            k[blk], t = self.field_kernels(x, blk, self.want_ntk and blk == "x")
            th = t if blk == "x" else th
        return k, th

    @staticmethod
    def _outer(ma: torch.Tensor, mb: torch.Tensor, lay: Layout, block: str) -> torch.Tensor:
        """E[A]·E[B'] for independent A (side a) and B (side b), broadcast to the block."""
        va, vb = lay.sides(ma, mb, block)
        return va * vb

    def field_means(self, f: Field, side: str) -> torch.Tensor:
        total = 0.0
        for frac, terms in f.parts:
            total = total + frac * sum(t.coef * self._term_mean(t, side, f.layout) for t in terms)
        return total

    # -- structure checks
    def check_independent(self, parts):
        """Terms mixing layer outputs that depend on each other in ways the rules cannot see
        (a LayerNorm or pooled output added to its own input) are refused."""
        for _, terms in parts:
            ids = set()
            for t in terms:
                ids |= {j for j, _ in t.combo}
            for j in ids:
                for k in ids:
                    if j < k and (self.bases[j].support & self.bases[k].support):
                        self.fail(
                            "a sum of a derived tensor (LayerNorm or pooling output) and a tensor it was "
                            "computed from, or of two derived from the same tensor"
                        )

    # -- per node
    def run(self):
        env: dict[fx.Node, Any] = {}
        out = None
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                if node is placeholders[0]:
                    env[node] = Pair(self.xa, self.xb)
                elif node.kwargs.get("default", None) is not None or node.args:
                    env[node] = node.args[0] if node.args else None
                else:
                    self.fail(f"the model takes more than one input ('{node.name}')")
                continue
            if node.op == "output":
                result = node.args[0]
                while isinstance(result, (tuple, list)) and len(result) == 1:  # torch.export's pytree output
                    result = result[0]
                out = fx.node.map_arg(result, lambda n: env[n])
                self.need(result, "diag") if isinstance(result, fx.Node) else None
                break
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = self.eval(node, args, kwargs)
        return out

    def eval(self, node: fx.Node, args, kwargs):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            return None  # torch.export's shape guards
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            packet = node.target.overloadpacket
            if packet is torch.ops.aten.sym_size and isinstance(args[0], Field):
                return self.size(args[0], args[1])
            if packet is torch.ops.aten.layer_norm:
                args = args[:5]
            if packet in _ATEN_IDENTITY and (_has(args, Field)):
                return args[0]
            if packet in _ATEN and (_has(args, Field) or _has(kwargs, Field) or packet in _LAYER_ATEN):
                node = _Alias(node, _ATEN[packet])
        if node.op == "get_attr":
            obj = self.gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            return self.originals.get(node.target, obj)
        fields = _has(args, Field) or _has(kwargs, Field)
        layer = (node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), L.LAYER_TYPES)) or (
            node.op == "call_function" and node.target in _LAYER_FNS
        )
        if layer and (_has(args, Pair) or _has(kwargs, Pair)):  # the network's input layer
            fields = True
        if not fields:  # data (or constants) only: evaluate per side
            fn = self._callable(node)
            if _has(args, Pair) or _has(kwargs, Pair):
                return Pair(fn(*_side(args, 0), **_side(kwargs, 0)), fn(*_side(args, 1), **_side(kwargs, 1)))
            return fn(*args, **kwargs)
        for a in node.all_input_nodes:
            self.need(a)
        if node.op == "call_module":
            return self.module(self.gm.get_submodule(node.target), args, kwargs)
        if node.op == "call_method":
            return self.method(node.target, args, kwargs)
        return self.function(node.target, args, kwargs)

    def _callable(self, node: fx.Node):
        if node.op == "call_module":
            m = self.gm.get_submodule(node.target)
            if any(True for _ in m.parameters()) or any(True for _ in m.buffers()):
                if node.target not in self._float64:  # a module on input data runs in float64
                    import copy

                    self._float64[node.target] = copy.deepcopy(m).to(device=self.xa.device, dtype=torch.float64)
                return self._float64[node.target]
            return m
        if node.op == "call_method":
            return lambda obj, *a, **k: getattr(obj, node.target)(*a, **k)
        return node.target

    # ---- ops on fields
    def module(self, m: nn.Module, args, kwargs):
        x = args[0] if args else kwargs.get("input")
        if isinstance(m, (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)):
            return x
        if isinstance(m, nn.Linear):
            return self.linear(x, m.weight, m.bias)
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return self.conv(x, m, m.stride, m.padding, m.dilation, m.groups, m.padding_mode, m.kernel_size, m.bias)
        for cls, name in _MODULE_ACT.items():
            if type(m) is cls:
                kw = {k: getattr(m, k) for k in _MODULE_KW.get(cls, ())}
                return self.activate(x, name, **kw)
        if isinstance(m, nn.LayerNorm):
            return self.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)
        if isinstance(m, nn.Flatten):
            return self.flatten(x, m.start_dim, m.end_dim)
        if isinstance(m, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
            if m.ceil_mode:
                self.fail("AvgPool with ceil_mode=True has no rule")
            if getattr(m, "divisor_override", None):
                self.fail("AvgPool with divisor_override has no rule")
            return self.avg_pool(x, m.kernel_size, m.stride, m.padding, m.count_include_pad)
        if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
            return self.adaptive_pool(x, m.output_size)
        if isinstance(m, nn.Unflatten):
            return self.reshape_like(x, lambda t: m(t))
        self.fail(f"no exact rule for {type(m).__name__}")

    def method(self, name: str, args, kwargs):
        x = args[0]
        if (
            name.endswith("_")
            and not name.startswith("_")
            and name[:-1] in _METHOD_ACT.keys() | {"add", "sub", "mul", "div", "neg"}
        ):
            name = name[:-1]  # x.relu_(), x.add_(y): the same value as the out-of-place op
        if name in _METHOD_ACT:
            return self.activate(x, _METHOD_ACT[name])
        if name in ("contiguous", "float", "double", "clone", "detach", "to"):
            return x
        if name in (
            "view",
            "reshape",
            "flatten",
            "permute",
            "transpose",
            "unsqueeze",
            "squeeze",
            "unflatten",
            "swapaxes",
            "movedim",
        ) and isinstance(x, Field):
            rest = [_side(a, 0) for a in args[1:]]
            kw = {k: _side(v, 0) for k, v in kwargs.items()}
            return self.reshape_like(x, lambda t: getattr(t, name)(*rest, **kw))
        if name == "size" and isinstance(x, Field):
            return self.size(x, *args[1:], **kwargs)
        if name in _METHOD_FN:  # x.f(*rest) is f(x, *rest)
            return self.function(_METHOD_FN[name], args, kwargs)
        self.fail(f"no exact rule for the method .{name}() on a width tensor")

    def function(self, fn, args, kwargs):
        if fn in _FN_ACT:
            name = _FN_ACT[fn]
            kw = dict(zip(_POSITIONAL.get(name, ()), args[1:]))
            kw.update(kwargs)
            return self.activate(args[0], name, **kw)
        if fn in (torch.clamp, torch.clip, torch.clamp_min, torch.clamp_max):
            names = {torch.clamp_min: ("min",), torch.clamp_max: ("max",)}.get(fn, ("min", "max"))
            kw = dict(zip(names, args[1:]))
            kw.update(kwargs)
            return self._clamp(args[0], kw.get("min"), kw.get("max"))
        if fn in (operator.pow, torch.pow):
            return self._pow(args[0], args[1] if len(args) > 1 else kwargs.get("exponent"))
        if fn is torch.square:
            return self._pow(args[0], 2)
        if fn is torch.sign:
            return self.activate(args[0], "sign")
        if fn in (operator.add, torch.add, operator.sub, torch.sub, operator.iadd, operator.isub):
            a, b = args[0], args[1]
            alpha = kwargs.get("alpha", 1)
            if fn in (operator.sub, torch.sub, operator.isub):
                return self.add(a, b, 1.0, -float(alpha))
            return self.add(a, b, 1.0, float(alpha))
        if fn in (operator.mul, torch.mul, operator.imul):
            return self.mul(args[0], args[1])
        if fn in (operator.truediv, torch.div, operator.itruediv):
            s = _scalar(args[1])
            if s is None or isinstance(args[1], Field):
                self.fail("division by a tensor has no rule")
            return self.scale(args[0], 1.0 / s)
        if fn in (operator.neg, torch.neg):
            return self.scale(args[0], -1.0)
        if fn in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout):
            return args[0]
        if fn is F.linear:
            return self.linear(args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"))
        if fn in (F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d):
            x, w = args[0], args[1]
            names = ("bias", "stride", "padding", "dilation", "groups")
            vals = dict(zip(names, list(args[2:]) + [None] * 5))
            vals.update({k: v for k, v in kwargs.items() if k in names})
            nd = w.ndim - 2
            tup = lambda v, d: tuple(v) if isinstance(v, (tuple, list)) else (v if v is not None else d,) * nd  # noqa
            pad = vals["padding"] if isinstance(vals["padding"], str) else tup(vals["padding"], 0)
            return self.conv(
                x,
                w,
                tup(vals["stride"], 1),
                pad,
                tup(vals["dilation"], 1),
                vals["groups"] or 1,
                "zeros",
                tuple(w.shape[2:]),
                vals["bias"],
            )
        if fn in (torch.flatten,):
            return self.flatten(args[0], *(args[1:]), **kwargs)
        if fn in (
            torch.reshape,
            torch.permute,
            torch.transpose,
            torch.squeeze,
            torch.unsqueeze,
            torch.swapaxes,
            torch.movedim,
        ):
            rest = [_side(a, 0) for a in args[1:]]
            kw = {k: _side(v, 0) for k, v in kwargs.items()}
            return self.reshape_like(args[0], lambda t: fn(t, *rest, **kw))
        if fn in (torch.cat, torch.concat, torch.concatenate):
            return self.cat(args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0))
        if fn in (torch.mean, torch.sum):
            return self.reduce(args[0], fn.__name__, *args[1:], **kwargs)
        if fn in (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d):
            names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
            vals = dict(zip(names, args[1:]))
            vals.update(kwargs)
            if vals.get("ceil_mode") or vals.get("divisor_override"):
                self.fail("avg_pool with ceil_mode or divisor_override has no rule")
            return self.avg_pool(
                args[0],
                vals["kernel_size"],
                vals.get("stride") or vals["kernel_size"],
                vals.get("padding", 0),
                vals.get("count_include_pad", True),
            )
        if fn in (F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d):
            return self.adaptive_pool(args[0], args[1] if len(args) > 1 else kwargs["output_size"])
        if fn is F.pad:
            names = ("pad", "mode", "value")
            vals = dict(zip(names, args[1:]))
            vals.update(kwargs)
            return self.pad(args[0], vals["pad"], vals.get("mode", "constant") or "constant", vals.get("value"))
        if fn is F.layer_norm:
            names = ("normalized_shape", "weight", "bias", "eps")
            vals = dict(zip(names, args[1:]))
            vals.update(kwargs)
            return self.layer_norm(
                args[0], vals["normalized_shape"], vals.get("weight"), vals.get("bias"), vals.get("eps", 1e-5)
            )
        if fn is getattr and isinstance(args[0], Field):
            if args[1] == "shape":
                return self.size(args[0])
            self.fail(f"attribute .{args[1]} of a width tensor has no rule")
        if fn is operator.getitem and isinstance(args[0], Field):
            self.fail("indexing or slicing a width tensor has no rule")
        name = getattr(fn, "__name__", repr(fn))
        self.fail(f"no exact rule for {name} on a width tensor")

    def size(self, x: Field, dim=None):
        na, nb = self.xa.shape[0], self.xb.shape[0]
        sa, sb = x.shape(na), x.shape(nb)
        if dim is None:
            return Pair(torch.Size(sa), torch.Size(sb))
        d = dim % len(sa)
        return Pair(sa[d], sb[d]) if d == 0 or x.axes[d] == ("B",) or "B" in x.axes[d] else sa[d]

    # ---- rules
    def _as_field(self, v) -> Field:
        if not isinstance(v, Field):
            self.fail("this op mixes a width tensor with a tensor computed from the input or a parameter")
        return v

    def activate(self, x, name: str, **kw):
        x = self._as_field(x)
        pieces = _elementwise(name, self.node, **kw)
        parts = []
        for frac, terms in x.parts:
            g, fn = self._one_gaussian(terms)
            if fn is None:  # a Gaussian combination: closed forms stay available
                new = [Term(c, f, tuple((j, a * sign) for j, a in g)) for c, f, sign in pieces]
            else:

                def comp(u, fn=fn):
                    v = fn(u)
                    return sum(c * f.fn(sign * v) for c, f, sign in pieces)

                new = [Term(1.0, generic(comp, f"{name}∘…"), g)]
            parts.append((frac, new))
        return replace(x, parts=parts)

    def _clamp(self, x, lo, hi):
        for v, what in ((lo, "min"), (hi, "max")):
            if v is not None and _scalar(v) is None:
                self.fail(f"clamp with a tensor {what}")
        return self.activate(
            x, "clamp", min=None if lo is None else _scalar(lo), max=None if hi is None else _scalar(hi)
        )

    def _pow(self, x, exponent):
        e = _scalar(exponent)
        if e is None or isinstance(exponent, Field):
            self.fail("a power with a tensor exponent")
        return self.activate(x, "pow", exponent=e)

    def _one_gaussian(self, terms: list[Term]):
        """(g, None) if the terms sum to the Gaussian g; (g, F) if they are F(g) for one Gaussian g
        (every combination a multiple of g); otherwise not exact."""
        if any(self._opaque(t) is not None for t in terms):
            self.fail(
                "a nonlinearity applied to a pooled non-Gaussian tensor (the master theorem needs a "
                "Gaussian input: put a Linear or Conv before it)"
            )
        lin: dict[int, float] = {}
        for t in terms:
            if t.f.kind == "identity":
                for j, a in t.combo:
                    lin[j] = lin.get(j, 0.0) + t.coef * a
        others = [t for t in terms if t.f.kind not in ("identity",)]
        lin_combo = tuple(sorted((j, a) for j, a in lin.items() if a != 0.0))
        if not others:
            return lin_combo, None
        # pick a reference direction and express every term as f(λ·u)
        ref = lin_combo or next(t.combo for t in others if t.combo)
        pieces = []
        for t in terms:
            if not t.combo:
                pieces.append((t.coef, t.f, 0.0))
                continue
            lam = _ratio(t.combo, ref)
            if lam is None:
                self.fail(
                    "a nonlinearity applied to a sum of non-Gaussian tensors of different Gaussian "
                    "combinations (the master theorem needs one Gaussian input)"
                )
            pieces.append((t.coef, t.f, lam))

        def fn(u):
            return sum(c * (f.fn(lam * u) if f.kind != "one" else torch.ones_like(u)) for c, f, lam in pieces)

        return ref, fn

    def add(self, a, b, ca: float, cb: float):
        sa, sb = _scalar(a), _scalar(b)
        if isinstance(a, Field) and isinstance(b, Field):
            if a.axes != b.axes:
                self.fail(f"adding width tensors whose axes differ ({a.shape(1)} and {b.shape(1)})")
            if len(a.parts) != len(b.parts) or any(abs(p[0] - q[0]) > 1e-12 for p, q in zip(a.parts, b.parts)):
                self.fail("adding concatenations with different splits of the width")
            parts = [
                (p[0], [replace(t, coef=t.coef * ca) for t in p[1]] + [replace(t, coef=t.coef * cb) for t in q[1]])
                for p, q in zip(a.parts, b.parts)
            ]
            self.check_independent(parts)
            return replace(a, parts=parts, layout=_common_layout(a, b))
        if isinstance(a, Field) and sb is not None:
            return replace(
                a,
                parts=[
                    (fr, [replace(t, coef=t.coef * ca) for t in ts] + [Term(sb * cb, ONE, ())]) for fr, ts in a.parts
                ],
            )
        if isinstance(b, Field) and sa is not None:
            return self.add(b, a, cb, ca)
        self.fail(
            "adding a tensor computed from the input or a parameter to a width tensor has no rule "
            "(a learned or fixed per-position offset is not in the master theorem's ops here)"
        )

    def scale(self, x, s: float):
        x = self._as_field(x)
        return replace(x, parts=[(fr, [replace(t, coef=t.coef * s) for t in ts]) for fr, ts in x.parts])

    def mul(self, a, b):
        if isinstance(a, Field) and _scalar(b) is not None:
            return self.scale(a, _scalar(b))
        if isinstance(b, Field) and _scalar(a) is not None:
            return self.scale(b, _scalar(a))
        if isinstance(a, Field) and isinstance(b, Field) and a.axes == b.axes and len(a.parts) == len(b.parts) == 1:
            ga, fa = self._one_gaussian(a.parts[0][1])
            gb, fb = self._one_gaussian(b.parts[0][1])
            fa = fa or (lambda u: u)
            fb = fb or (lambda u: u)
            lam = _ratio(gb, ga) if ga and gb else None
            if lam is not None:
                return replace(
                    a,
                    parts=[(1.0, [Term(1.0, generic(lambda u: fa(u) * fb(lam * u), "product"), ga)])],
                    layout=_common_layout(a, b),
                )
        self.fail(
            "a product of two width tensors that are not functions of one Gaussian (a gated unit) has no "
            "exact rule here"
        )

    def _shared(self, weight: torch.Tensor):
        """A weight used by a second layer call (weight sharing, a module applied twice): its
        outputs are correlated and its NTK gets cross terms the rules here do not carry."""
        key = weight.data_ptr()
        if key in self.used_weights:
            self.fail(
                f"a weight used by two layer calls (first at graph node '{self.used_weights[key]}'): "
                "weight sharing has no exact rule here"
            )
        self.used_weights[key] = self.node.name

    def linear(self, x, weight, bias):
        if isinstance(weight, Field) or not isinstance(weight, torch.Tensor):
            self.fail("a linear layer whose weight is computed from the network's activations")
        self._shared(weight)
        fan_in, fan_out = weight.shape[1], weight.shape[0]
        if isinstance(x, Pair):  # the input layer
            xa, xb = x.a, x.b
            if xa.shape[-1] != fan_in:
                self.fail(f"input of {tuple(xa.shape)} into a Linear with fan_in {fan_in}")
            spatial = tuple(xa.shape[1:-1])
            lay = self.layout_here(spatial)
            axes = [("B",)] + [(i,) for i in range(len(spatial))] + [("W",)]
            sizes = {i: s for i, s in enumerate(spatial)}
            sizes["W"] = fan_out
            k = ntk = None
            if self.compute:
                k = {
                    blk: self._affine(L.input_kernel(*self._input_sides(xa, xb, blk), lay, blk), bias)
                    for blk in self._blocks()
                }
                k = self._fill(k)
                ntk = self._own_ntk(k["x"], weight, bias) if self.want_ntk else None
            return self._field_of(self.new_basis(lay, k, ntk), axes, sizes, lay)
        x = self._as_field(x)
        last = x.axes[-1]
        if "W" not in last:
            self.fail(
                "a Linear over an axis that is not the width (it mixes positions or the batch with a "
                "finite random matrix)"
            )
        if x.sizes["W"] * math.prod(x.sizes[a] for a in last if a != "W") != fan_in:
            self.fail(f"a Linear with fan_in {fan_in} on an axis of {x.shape(1)[-1]}")
        contracted = [a for a in last if a != "W"]
        keep = [a for a in range(len(x.layout.spatial)) if a not in contracted]
        renum = {a: i for i, a in enumerate(keep)}
        spatial = tuple(x.layout.spatial[a] for a in keep)
        lay = self.layout_here(spatial)
        k = ntk = None
        if self.compute:
            k, th = self.input_kernels(x)
            for blk, kin in k.items():
                kin = L.contract_diagonal(kin, x.layout, blk, contracted)
                k[blk] = self._affine(L.to_layout(kin, Layout(spatial, x.layout.full), lay, blk), bias)
            k = self._fill(k)
            if self.want_ntk:
                if th is not None:
                    th = L.contract_diagonal(th, x.layout, "x", contracted)
                    ntk = torch.add(
                        self._own_ntk(k["x"], weight, bias),
                        L.to_layout(th, Layout(spatial, x.layout.full), lay, "x"),
                        alpha=self.wv,
                    )
                else:
                    ntk = self._own_ntk(k["x"], weight, bias)
        axes = [tuple(renum[a] if a in renum else a for a in ax) for ax in x.axes[:-1]] + [("W",)]
        sizes = {renum[a]: s for a, s in x.sizes.items() if a in renum}
        sizes["W"] = fan_out
        return self._field_of(self.new_basis(lay, k, ntk), axes, sizes, lay)

    def _blocks(self):
        if self.self_only:
            return ("a",)
        return ("x", "a") if self.same else ("x", "a", "b")

    def _fill(self, k: dict) -> dict:
        if self.same or self.self_only:
            k["b"] = k["a"]
        return k

    def _input_sides(self, xa, xb, blk):
        if blk == "x":
            return xa, xb
        return (xa, xa) if blk == "a" else (xb, xb)

    def _own_ntk(self, k: torch.Tensor, weight, bias) -> torch.Tensor:
        """The layer's own parameters' part of Θ: σ_w² K_in for a trained weight, σ_b² for a trained
        bias (k = σ_w² K_in + σ_b² when it has a bias). Frozen parameters (requires_grad=False) do
        not train, so they add nothing."""
        w_tr = bool(getattr(weight, "requires_grad", True))
        b_tr = bias is not None and bool(getattr(bias, "requires_grad", True))
        has_b = bias is not None
        if w_tr and (b_tr or not has_b):
            return k  # read-only: kernels are never changed in place once stored
        if w_tr:  # bias frozen
            return k - self.bv
        return torch.full_like(k, self.bv if b_tr else 0.0)

    def _affine(self, k: torch.Tensor, bias, scale: float = 1.0) -> torch.Tensor:
        """σ_w² · scale · K (+ σ_b²), one pass, out of place."""
        return torch.add(
            torch.tensor(self.bv if bias is not None else 0.0, dtype=k.dtype, device=k.device), k, alpha=self.wv * scale
        )

    def conv(self, x, weight, stride, padding, dilation, groups, padding_mode, kernel_size, bias):
        w = weight.weight if isinstance(weight, nn.Module) else weight
        self._shared(w)
        if groups != 1:
            self.fail(f"a convolution with groups={groups} (each group's fan-in stays finite)")
        nd = len(kernel_size)
        c_in = w.shape[1]
        if isinstance(x, Pair):
            xa = x.a
            if xa.ndim != nd + 2 or xa.shape[1] != c_in:
                self.fail(f"input of {tuple(xa.shape)} into a {nd}-d convolution with {c_in} input channels")
            in_sizes = tuple(xa.shape[2:])
            atoms = list(range(nd))
            src_layout = None
        else:
            x = self._as_field(x)
            if (
                len(x.axes) != nd + 2
                or x.axes[1] != ("W",)
                or any(len(ax) != 1 or ax[0] in ("W", "B") for ax in x.axes[2:])
            ):
                self.fail(
                    f"a {nd}-d convolution on a tensor laid out as {x.axes} (it needs (batch, width, "
                    f"{nd} position axes))"
                )
            if x.sizes["W"] != c_in:
                self.fail(f"a convolution with {c_in} input channels on {x.sizes['W']}")
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
                self.fail(f"padding {padding!r}")
        else:
            pads = [(p, p) for p in padding]
        mode = padding_mode
        ops = {}
        for i, a in enumerate(atoms):
            try:
                ops[a] = L.AxisOp(in_sizes[i], kernel_size[i], stride[i], dilation[i], *pads[i], mode=mode)
            except ValueError as e:
                self.fail(str(e))
        n_sp = len(src_layout.spatial) if src_layout is not None else nd
        filter_size = math.prod(kernel_size)
        sizes_after = list(src_layout.spatial) if src_layout is not None else list(in_sizes)
        for a, op in ops.items():
            sizes_after[a] = op.out
        spatial_out = tuple(sizes_after)
        lay = self.layout_here(spatial_out)
        k = ntk = None
        if self.compute:
            if src_layout is None:
                inner = Layout(in_sizes, lay.full)
                k, th = {}, None
                for blk in self._blocks():
                    xa_, xb_ = self._input_sides(x.a, x.b, blk)
                    k[blk] = L.input_kernel(xa_.movedim(1, -1), xb_.movedim(1, -1), inner, blk)
            else:
                inner = replace(src_layout, full=lay.full)
                k, th = self.input_kernels(x)
                k = {blk: L.to_layout(kin, src_layout, inner, blk) for blk, kin in k.items()}
            for blk, kin in k.items():
                k[blk] = self._affine(L.conv(kin, inner, blk, ops, average=False), bias, 1.0 / filter_size)
            k = self._fill(k)
            if self.want_ntk:
                if src_layout is not None and th is not None:
                    th = L.to_layout(th, src_layout, inner, "x")
                    ntk = torch.add(
                        self._own_ntk(k["x"], w, bias),
                        L.conv(th, inner, "x", ops, average=False),
                        alpha=self.wv / filter_size,
                    )
                else:
                    ntk = self._own_ntk(k["x"], w, bias)
        axes = [("B",), ("W",)] + [(a,) for a in atoms]
        sizes = {a: spatial_out[a] for a in range(n_sp)}
        sizes["W"] = w.shape[0]
        return self._field_of(self.new_basis(lay, k, ntk), axes, sizes, lay)

    def layer_norm(self, x, normalized_shape, weight, bias, eps):
        x = self._as_field(x)
        shape = (
            tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) else (normalized_shape,)
        )
        if len(shape) != 1 or x.axes[-1] != ("W",):
            self.fail(
                f"LayerNorm over {shape} on axes {x.axes}: only a LayerNorm over the width axis alone has a limit rule"
            )
        if len(x.parts) != 1:
            self.fail("LayerNorm of a concatenation")
        g, fn = self._one_gaussian(x.parts[0][1])
        if fn is not None:
            self.fail("LayerNorm of a non-Gaussian tensor (its mean over the width is not zero)")
        if weight is not None and not torch.all(weight == 1):
            self.fail("LayerNorm whose weight is not all ones at init")
        if bias is not None and not torch.all(bias == 0):
            self.fail("LayerNorm whose bias is not all zeros at init")
        if self.want_ntk and weight is not None and weight.requires_grad:
            self.fail(
                "LayerNorm with a trained gain: its tangent kernel is LN(h)_i(x)·LN(h)_i(x') per coordinate, "
                "correlated with the coordinate, which the NTK rules here do not carry (use "
                "elementwise_affine=False or freeze the gain with requires_grad_(False))"
            )
        lay = self.layout_here(x.layout.spatial)
        k = ntk = None
        if self.compute:
            k, th = self.input_kernels(replace(x, layout=lay))
            scale = {}
            for blk, kin in k.items():
                sa, sb = ("a", "b") if blk == "x" else (blk, blk)
                va, vb = lay.sides(self._combo_var(g, sa, lay), self._combo_var(g, sb, lay), blk)
                scale[blk] = torch.rsqrt((va + eps) * (vb + eps))
                k[blk] = kin * scale[blk]
            k = self._fill(k)
            if self.want_ntk:
                ntk = torch.zeros_like(k["x"]) if th is None else th * scale["x"]
                if bias is not None and bias.requires_grad:  # ∂y_i/∂β_i = 1 at PyTorch's own scale
                    ntk = ntk + 1.0
        support = frozenset().union(*(self.bases[j].support for j, _ in g)) if g else frozenset()
        return self._field_of(self.new_basis(lay, k, ntk, support), x.axes, x.sizes, lay)

    def flatten(self, x, start_dim=0, end_dim=-1):
        x = self._as_field(x)
        return self.reshape_like(x, lambda t: torch.flatten(t, start_dim, end_dim))

    def reshape_like(self, x, op):
        """Any view/permute: the axes are regroupings of atoms (the batch, the width, positions);
        splitting an atom (the width into heads, a position axis in two) has no rule."""
        x = self._as_field(x)
        batch = self.xa.shape[0]  # the side-A batch: sizes read off the data (x.shape[0]) are side A's
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
            self.fail(f"the reshape fails on the traced shape ({type(e).__name__}: {e})")
        strides_atom, st = {}, 1
        for lab, size in zip(reversed(labels), reversed(shape)):
            strides_atom[lab] = (st, size)
            st *= size
        new_axes = []
        for d in range(moved.ndim):
            size = moved.shape[d]
            if size == 1:
                new_axes.append(("B",) if d == 0 and batch == 1 else ())
                continue
            line = moved.movedim(d, -1).reshape(-1, size)[0]
            group = self._atoms_of_axis((line - line[0]).long(), size, strides_atom)
            if group is None:
                self.fail("a reshape that splits the width or a position axis (into heads, say)")
            new_axes.append(tuple(group))
        if not new_axes or new_axes[0] != ("B",):
            self.fail("a reshape that moves or merges the batch axis")
        return replace(x, axes=new_axes)

    @staticmethod
    def _atoms_of_axis(steps: torch.Tensor, size: int, strides_atom: dict):
        """The atoms an axis of `size` runs over, outermost first, from the flat-index steps along it."""
        group = []
        covered = 1
        while covered < size:
            step = int(steps[covered])
            hit = [lab for lab, (st, sz) in strides_atom.items() if st == step and sz > 1]
            if not hit:
                return None
            lab = hit[0]
            st, sz = strides_atom[lab]
            if size % (covered * sz) != 0:
                return None
            # check the whole atom runs contiguously here
            for i in range(1, sz):
                if int(steps[covered * i]) != st * i:
                    return None
            group.insert(0, lab)
            covered *= sz
        return group

    def cat(self, xs, dim):
        if not all(isinstance(v, Field) for v in xs):
            self.fail("concatenating a width tensor with a tensor from the input")
        d = dim % len(xs[0].axes)
        if xs[0].axes[d] != ("W",):
            self.fail("concatenation along an axis other than the width")
        total = sum(v.sizes["W"] for v in xs)
        for v in xs[1:]:
            if [ax for i, ax in enumerate(v.axes) if i != d] != [ax for i, ax in enumerate(xs[0].axes) if i != d]:
                self.fail("concatenating width tensors whose other axes differ")
        parts = [(fr * v.sizes["W"] / total, ts) for v in xs for fr, ts in v.parts]
        sizes = dict(xs[0].sizes)
        sizes["W"] = total
        return replace(xs[0], parts=parts, sizes=sizes, layout=_common_layout(*xs))

    def reduce(self, x, how: str, dim=None, keepdim=False, **kw):
        x = self._as_field(x)
        if dim is None:
            self.fail(f"{how} over every axis of a width tensor")
        dims = [dim] if isinstance(dim, int) else list(dim)
        dims = sorted(d % len(x.axes) for d in dims)
        atoms = []
        for d in dims:
            if "W" in x.axes[d] or "B" in x.axes[d]:
                self.fail(f"{how} over the width or the batch axis (the width is infinite here)")
            atoms += list(x.axes[d])
        count = math.prod(x.sizes[a] for a in atoms)
        out = self._pool_field(x, atoms, None, True)
        axes = []
        for i, ax in enumerate(out.axes):
            if i in dims:
                if keepdim:
                    axes.append(())
            else:
                axes.append(ax)
        out = replace(out, axes=axes)
        return self.scale(out, float(count)) if how == "sum" else out

    def adaptive_pool(self, x, output_size):
        x = self._as_field(x)
        nd = len(x.axes) - 2
        outs = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * nd
        atoms = [ax[0] if len(ax) == 1 else None for ax in x.axes[2:]]
        if None in atoms or x.axes[1] != ("W",):
            self.fail(f"adaptive pooling on axes {x.axes}")
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
                self.fail(f"adaptive average pooling of {n} positions to {o} (not a whole window)")
        return self._pool_field(x, globals_, ops, True)

    def pad(self, x, pads, mode: str, value):
        """F.pad on position axes: the kernel read through the padding's index map (zeros: 0)."""
        x = self._as_field(x)
        if mode == "constant" and value not in (None, 0, 0.0):
            self.fail(f"padding with the constant {value} (only zeros keep the kernel's rules)")
        modes = {"constant": "zeros", "circular": "circular", "reflect": "reflect", "replicate": "replicate"}
        if mode not in modes:
            self.fail(f"padding mode {mode!r}")
        pads = list(pads)
        ops = {}
        for i in range(len(pads) // 2):
            lo, hi = pads[2 * i], pads[2 * i + 1]
            ax = x.axes[len(x.axes) - 1 - i]
            if lo == hi == 0:
                continue
            if len(ax) != 1 or ax[0] in ("W", "B"):
                self.fail(f"padding axis {len(x.axes) - 1 - i} ({ax}), which is not one position axis")
            ops[ax[0]] = L.AxisOp(x.sizes[ax[0]], 1, 1, 1, lo, hi, modes[mode])
        return self._pool_field(x, [], ops, True) if ops else x

    def avg_pool(self, x, kernel_size, stride, padding, count_include_pad):
        x = self._as_field(x)
        nd = len(x.axes) - 2
        tup = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd  # noqa: E731
        ks, st, pd = tup(kernel_size), tup(stride if stride else kernel_size), tup(padding)
        atoms = [ax[0] if len(ax) == 1 else None for ax in x.axes[-nd:]]
        if None in atoms or "W" in atoms or "B" in atoms:
            self.fail(f"average pooling on axes {x.axes}")
        ops = {a: L.AxisOp(x.sizes[a], k, s, 1, p, p) for a, k, s, p in zip(atoms, ks, st, pd)}
        return self._pool_field(x, [], ops, bool(count_include_pad))

    def _pool_field(self, x: Field, global_atoms: list, ops: dict | None, count_include_pad: bool) -> Field:
        """A linear map over positions: windows (`ops`) and/or a global mean over `global_atoms`.
        A Gaussian input gives a Gaussian basis; anything else an opaque one (kernel, NTK, means)."""
        self.need(self.node.all_input_nodes[0], "full") if self.node.all_input_nodes else None
        ops = ops or {}
        sizes_after = list(x.layout.spatial)
        for a, op in ops.items():
            sizes_after[a] = op.out
        keep = [a for a in range(len(sizes_after)) if a not in global_atoms]
        renum = {a: i for i, a in enumerate(keep)}
        spatial = tuple(sizes_after[a] for a in keep)
        lay = self.layout_here(spatial)
        gaussian = (
            all(len(p[1]) > 0 for p in x.parts)
            and len(x.parts) == 1
            and all(t.f.kind == "identity" and self._opaque(t) is None for t in x.parts[0][1])
        )
        k = ntk = means = None
        xin = replace(x, layout=replace(x.layout, full=True)) if x.layout.spatial else x
        mid = Layout(tuple(sizes_after), True)
        if self.compute:
            k, th = self.input_kernels(xin)
            for blk, kk in k.items():
                if ops:
                    kk = L.pool(kk, xin.layout, blk, ops, count_include_pad)
                kk = L.global_mean(kk, mid, blk, global_atoms)
                k[blk] = L.to_layout(kk, Layout(spatial, True), lay, blk)
            k = self._fill(k)
            if self.want_ntk:
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
                    m = self.field_means(xin, side)
                    if not isinstance(m, torch.Tensor):
                        m = torch.zeros(
                            (self.xa if side == "a" else self.xb).shape[0],
                            *x.layout.spatial,
                            dtype=torch.float64,
                            device=self.xa.device,
                        )
                    if ops:
                        m = L.pool_mean(m, ops, count_include_pad)
                    if global_atoms:
                        m = m.mean(dim=tuple(1 + a for a in global_atoms))
                    means[side] = m
        support = frozenset()
        for _, terms in x.parts:
            for t in terms:
                for j, _ in t.combo:
                    support |= self.bases[j].support
        bid = self.new_basis(lay, k, ntk, support, means, gaussian)
        axes = []
        for ax in x.axes:
            new = tuple(
                renum[a] if isinstance(a, int) else a for a in ax if not (isinstance(a, int) and a not in renum)
            )
            axes.append(new)
        sizes = {renum[a]: spatial[renum[a]] for a in keep}
        sizes["W"] = x.sizes["W"]
        return self._field_of(bid, axes, sizes, lay)


def _ratio(combo, ref) -> float | None:
    """λ if the Gaussian combination `combo` is λ·`ref` (same layer outputs, proportional weights)."""
    d, r = dict(combo), dict(ref)
    if set(d) != set(r):
        return None
    lam = [d[j] / r[j] for j in d]
    return lam[0] if max(lam) - min(lam) <= 1e-12 * max(1.0, abs(max(lam))) else None


def _common_layout(*fields: Field) -> Layout:
    """Where branches meet, the diagonal unless every branch kept the full spatial kernel (a branch
    that some other consumer needed in full may have it; the others need not)."""
    return replace(fields[0].layout, full=all(f.layout.full for f in fields))


def _acc(total, v, w: float):
    """total + w·v, out of place (v may be a stored kernel); `total` 0.0 means empty."""
    if isinstance(v, float) and v == 0.0:
        return total
    if isinstance(total, float):
        return v if w == 1.0 else v * w
    return total + (v if w == 1.0 else v * w)


def _needs(gm: fx.GraphModule, requires: dict) -> dict:
    """Backwards: a node needs its full spatial kernel if some consumer needs it full."""
    full: dict = {}
    consumers: dict = {}
    for node, reqs in requires.items():
        for src, how in reqs:
            consumers.setdefault(src, []).append((node, how))
    for node in reversed(list(gm.graph.nodes)):
        need = False
        for cons, how in consumers.get(node, []):
            if how == "full" or (how == "pass" and full.get(cons, False)):
                need = True
        full[node] = need
    return full


def prepare_inputs(x, name: str) -> torch.Tensor:
    import numpy as np

    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(x).__name__}")
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"{name} must have a batch axis first, got shape {tuple(x.shape)}")
    return x.detach().to(torch.float64)


def program_kernels(
    model: nn.Module,
    x1,
    x2=None,
    weight_var: float = 2.0,
    bias_var: float = 0.0,
    *,
    ntk: bool = True,
    gm: fx.GraphModule | None = None,
    self_only: bool = False,
):
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
    gm = gm if gm is not None else trace(model, a[:2].to(dtype) if len(a) >= 2 else torch.cat([a, a]).to(dtype))
    originals = dict(model.named_parameters())
    originals.update(dict(model.named_buffers()))

    def make_run(xa, xb, same_inputs, compute, needs, want_ntk, self_only=False) -> _Run:
        return _Run(
            gm,
            xa,
            xb,
            same_inputs,
            weight_var,
            bias_var,
            compute,
            needs,
            want_ntk,
            originals=originals,
            self_only=self_only,
        )

    probe = make_run(a[:1], b[:1], same, False, {}, ntk)
    out = probe.run()
    if not isinstance(out, Field):
        raise NotExact(
            f"the model's output is not a single tensor computed through a Linear or Conv (got {type(out).__name__})"
        )
    full = _needs(gm, probe.requires)
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
    k = t = None
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
            dest[s:e, cols] = part
            if same:
                dest[s:, s:e] = part.transpose(0, 1)
    if same and k.ndim == 2:
        k = (k + k.T) / 2
        t = None if t is None else (t + t.T) / 2
    return k, t
