"""One pass over a traced graph (`Run`): the environment of values, the kernels of width tensors
(`field_kernels`: what every rule reads of its input), the structure checks, and the walk that
hands every node to its op's rule (`dispatch`). `compute=False` is the structure pass: the same
walk, no kernel tensors."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NoReturn, cast

import torch
from torch import fx, nn

from .. import _layers as L
from .._fields import IDENTITY, Basis, Field, Layout, Term, expect_both, mean
from . import dispatch
from .trace import ATEN, ATEN_IDENTITY, LAYER_ATEN, LAYER_FNS, Alias, NotExact
from .values import Pair, acc, has, side

__all__ = ["Run"]


class Run:
    """One pass over the graph. `compute=False` is the structure pass (no kernel tensors).

    `xa`, `xb` are the two sides' inputs (an x1 chunk and x2); `same`: they are the same inputs;
    `full`: which nodes need their full spatial kernel (from the structure pass); `self_only`:
    only each input with itself (the 'a' block), K(x, x) per row."""

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
        self.requires: dict[fx.Node | None, list[tuple[fx.Node, str]]] = {}
        self.node: Any = None  # the graph node being evaluated (an fx.Node, or an ATen node's Alias)
        self._float64: dict[str, nn.Module] = {}
        self.self_only = self_only
        self.used_weights: dict[int, str] = {}
        self.originals = originals  # torch.export copies parameters; the model's own say requires_grad

    # -- helpers the rules share
    def fail(self, what: str) -> NoReturn:
        """Raise `NotExact` naming `what` and the node being evaluated."""
        raise NotExact(what, self.node)

    def need(self, arg: Any, how: str = "pass") -> None:
        """Record that the current node reads `arg` ("full": its full spatial kernel; "diag": the
        diagonal; "pass": whatever the current node itself needs)."""
        if isinstance(arg, fx.Node):
            self.requires.setdefault(self.node, []).append((arg, how))

    def layout_here(self, spatial: tuple) -> Layout:
        """The layout of the current node's output: full where the needs pass asked for it."""
        return Layout(tuple(spatial), bool(self.full.get(self.node, False)) and len(spatial) > 0)

    def new_basis(
        self,
        layout: Layout,
        k: dict | None,
        ntk: Any,
        support: frozenset = frozenset(),
        means: dict | None = None,
        gaussian: bool = True,
    ) -> int:
        """Store a new basis family (a layer's output) and return its id."""
        bid = len(self.bases)
        self.bases[bid] = Basis(bid, layout, k or {}, ntk, frozenset(support) | {bid}, gaussian, means, self.node)
        return bid

    @staticmethod
    def field_of(bid: int, axes: list, sizes: dict, layout: Layout) -> Field:
        """A width tensor that is one basis family itself."""
        return Field([(1.0, [Term(1.0, IDENTITY, ((bid, 1.0),))])], axes, sizes, layout)

    def as_field(self, v: Any) -> Field:
        """`v`, which must be a width tensor."""
        if not isinstance(v, Field):
            self.fail("this op mixes a width tensor with a tensor computed from the input or a parameter")
        return v

    def blocks(self) -> tuple[str, ...]:
        """The kernel blocks this run computes."""
        if self.self_only:
            return ("a",)
        return ("x", "a") if self.same else ("x", "a", "b")

    def fill(self, k: dict) -> dict:
        """The blocks this run does not compute, where they equal one it does."""
        if self.same or self.self_only:
            k["b"] = k["a"]
        return k

    @staticmethod
    def input_sides(xa: torch.Tensor, xb: torch.Tensor, blk: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The two inputs a block pairs."""
        if blk == "x":
            return xa, xb
        return (xa, xa) if blk == "a" else (xb, xb)

    # -- field kernels
    def combo_k(self, g1: tuple, g2: tuple, block: str, layout: Layout) -> torch.Tensor | None:
        return self.combo_sum(g1, g2, lambda b: L.to_layout(b.k[block], b.layout, layout, block))

    def combo_ntk(self, g1: tuple, g2: tuple, layout: Layout) -> torch.Tensor | None:
        # every basis carries its tangent kernel in a run that wants the NTK
        return self.combo_sum(g1, g2, lambda b: L.to_layout(cast(torch.Tensor, b.ntk), b.layout, layout, "x"))

    def combo_sum(self, g1: tuple, g2: tuple, get: Callable[[Basis], torch.Tensor]) -> torch.Tensor | None:
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

    def combo_var(self, g: tuple, side: str, layout: Layout) -> torch.Tensor:
        """Same-position variance of combination g on side 'a' or 'b': (n, *S)."""
        out = None
        for j, a in g:
            b = self.bases[j]
            d = b.layout.diagonal(b.k[side], side) * (a * a)
            out = d if out is None else out + d
        n = (self.xa if side == "a" else self.xb).shape[0]
        return out if out is not None else torch.zeros(n, *layout.spatial, dtype=torch.float64, device=self.xa.device)

    def opaque(self, t: Term) -> Basis | None:
        """The non-Gaussian basis (a pooled or normalised output) a term is, if it is one."""
        if len(t.combo) == 1 and not self.bases[t.combo[0][0]].gaussian:
            return self.bases[t.combo[0][0]]
        return None

    def term_mean(self, t: Term, side: str, layout: Layout) -> torch.Tensor:
        """E[f(g)] of a term on one side, per point and position (its coefficient not applied)."""
        o = self.opaque(t)
        if o is not None:
            assert o.means is not None
            return o.means[side]
        return mean(t.f, self.combo_var(t.combo, side, layout))

    def field_kernel(self, f: Field, block: str) -> torch.Tensor:
        """E[h(x) h(x')] of one width coordinate, in f.layout."""
        return self.field_kernels(f, block, False)[0]

    def field_kernels(self, f: Field, block: str, ntk: bool) -> tuple[Any, torch.Tensor | None]:
        """(kernel, tangent kernel or None) of one width coordinate in f.layout: Σ over pairs of
        terms of E[f_t f_s] and E[f_t' f_s'] · Θ of their combinations."""
        lay = f.layout
        sa, sb = ("a", "b") if block == "x" else (block, block)
        k_total: Any = 0.0
        t_total: Any = 0.0
        for frac, terms in f.parts:
            k_part: Any = 0.0
            t_part: Any = 0.0
            for t in terms:
                ot = self.opaque(t)
                for s in terms:
                    os_ = self.opaque(s)
                    w = t.coef * s.coef
                    if ot is not None or os_ is not None:
                        if ot is not None and os_ is not None and ot.id == os_.id:
                            k_part = acc(k_part, L.to_layout(ot.k[block], ot.layout, lay, block), w)
                            if ntk:
                                t_part = acc(t_part, L.to_layout(cast(torch.Tensor, ot.ntk), ot.layout, lay, "x"), w)
                        else:  # independent (checked in the structure pass): product of means; no Θ
                            k_part = acc(
                                k_part,
                                self.outer(self.term_mean(t, sa, lay), self.term_mean(s, sb, lay), lay, block),
                                w,
                            )
                        continue
                    c = self.combo_k(t.combo, s.combo, block, lay)
                    va, vb = lay.sides(self.combo_var(t.combo, sa, lay), self.combo_var(s.combo, sb, lay), block)
                    if c is None:
                        c = torch.zeros(
                            torch.broadcast_shapes(va.shape, vb.shape), dtype=torch.float64, device=va.device
                        )
                    th = self.combo_ntk(t.combo, s.combo, lay) if ntk else None
                    v, dv = expect_both(t.f, s.f, va, vb, c, th is not None)
                    k_part = acc(k_part, v, w)
                    if th is not None and dv is not None:
                        t_part = acc(t_part, dv * th, w)
            k_total = acc(k_total, k_part, frac)
            t_total = acc(t_total, t_part, frac)
        return k_total, (None if isinstance(t_total, float) else t_total)

    def input_kernels(self, x: Field) -> tuple[dict, torch.Tensor | None]:
        """What a layer reads of its input: the kernel of x in each block this run computes, in
        x.layout, and (when the NTK is wanted) its tangent kernel, computed with the cross block."""
        k, th = {}, None
        for blk in self.blocks():
            k[blk], t = self.field_kernels(x, blk, self.want_ntk and blk == "x")
            th = t if blk == "x" else th
        return k, th

    @staticmethod
    def outer(ma: torch.Tensor, mb: torch.Tensor, lay: Layout, block: str) -> torch.Tensor:
        """E[A]·E[B'] for independent A (side a) and B (side b), broadcast to the block."""
        va, vb = lay.sides(ma, mb, block)
        return va * vb

    def field_means(self, f: Field, side: str) -> Any:
        """E[h(x)] of one width coordinate on one side (0.0 for a field of no terms)."""
        total: Any = 0.0
        for frac, terms in f.parts:
            total = total + frac * sum(t.coef * self.term_mean(t, side, f.layout) for t in terms)
        return total

    # -- structure checks
    def check_independent(self, parts: list) -> None:
        """Terms mixing layer outputs that depend on each other in ways the rules cannot see
        (a LayerNorm or pooled output added to its own input) are refused."""
        for _, terms in parts:
            ids: set[int] = set()
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
    def run(self) -> Any:
        """Evaluate the graph; the value of its output (a `Field` for a model the rules cover)."""
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

    def eval(self, node: Any, args: Any, kwargs: Any) -> Any:
        """The value of one node: evaluated per side where it reads data only, else its rule's."""
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            return None  # torch.export's shape guards
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            packet = node.target.overloadpacket
            if packet is torch.ops.aten.sym_size and isinstance(args[0], Field):
                return dispatch.size(self, args[0], args[1])
            if packet is torch.ops.aten.layer_norm:
                args = args[:5]
            if packet in ATEN_IDENTITY and (has(args, Field)):
                return args[0]
            if packet in ATEN and (has(args, Field) or has(kwargs, Field) or packet in LAYER_ATEN):
                node = Alias(node, ATEN[packet])
        if node.op == "get_attr":
            obj = self.gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            return self.originals.get(node.target, obj)
        fields = has(args, Field) or has(kwargs, Field)
        layer = (node.op == "call_module" and isinstance(self.gm.get_submodule(node.target), L.LAYER_TYPES)) or (
            node.op == "call_function" and node.target in LAYER_FNS
        )
        if layer and (has(args, Pair) or has(kwargs, Pair)):  # the network's input layer
            fields = True
        if not fields:  # data (or constants) only: evaluate per side
            fn = self._callable(node)
            if has(args, Pair) or has(kwargs, Pair):
                return Pair(fn(*side(args, 0), **side(kwargs, 0)), fn(*side(args, 1), **side(kwargs, 1)))
            return fn(*args, **kwargs)
        for a in node.all_input_nodes:
            self.need(a)
        if node.op == "call_module":
            return dispatch.module(self, self.gm.get_submodule(node.target), args, kwargs)
        if node.op == "call_method":
            return dispatch.method(self, node.target, args, kwargs)
        return dispatch.function(self, node.target, args, kwargs)

    def _callable(self, node: Any) -> Callable[..., Any]:
        if node.op == "call_module":
            m = self.gm.get_submodule(node.target)
            if any(True for _ in m.parameters()) or any(True for _ in m.buffers()):
                if node.target not in self._float64:  # a module on input data runs in float64
                    self._float64[node.target] = copy.deepcopy(m).to(device=self.xa.device, dtype=torch.float64)
                return self._float64[node.target]
            return m
        if node.op == "call_method":
            return lambda obj, *a, **k: getattr(obj, node.target)(*a, **k)
        return node.target
