"""The limit's forward and backward passes on particles, op by op (see `ops` for how values are held,
`family` for the hidden matrices and `scaling` for the constants).

Per-particle state: an input layer's rows u_α ∈ R^d and every width-sized bias or norm gain are
(G, P, …) tensors, updated exactly; the readout's a = n·W is (G, P, k) and f = (1/P) Σ_α h_α a_α;
the readout bias is (G, k). Every sum over a width dim is the finite network's sum ×n/P (n·E[·]).

The backward pass is written as the program's own ops so that every gradient vector stays a
differentiable function of the Ẑ leaves: width gradients are in n-scaled units (ĝ = n·∂L/∂h,
Θ(1)), finite ones in their own; hidden matrices by W_tᵀ (`family.HiddenMatrix.backward`), norms
and attention by their VJPs with the width means detached (a mean is deterministic in the limit:
its dependence on one particle must not reach the Ż partials), every other op by autograd on a
recomputation with create_graph.

**Attention** (`sdpa`, or `contract` → finite ops → a product with the values): the logits
L = c·E_h[Z^q Z^k] per head, c = s·n/H (s the logit scale in effect, ∝ 1/n in µP), are finite and
deterministic; A = softmax(L + mask) over positions; o = A·v per particle. Backward, with ĝ^o:
ĝ^v = Aᵀĝ^o, dA = (1/n) Σ_α ĝ^o_α v_α (finite), dL = A ⊙ (dA − Σ A dA), ĝ^q = s·n·dL·k,
ĝ^k = s·n·dLᵀ·q."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .._mup_limit import Updater
from .family import HiddenMatrix
from .memory import release
from .ops import Op, rep_size
from .scaling import ParamLaw
from .trace import node_error

__all__ = ["Program"]

_G = ("width", "finite")  # kinds held with a leading Monte Carlo group dim


def _e(a: torch.Tensor) -> torch.Tensor:
    """E[a] over the particles of the last dim, detached, keeping the dim."""
    return a.detach().mean(-1, keepdim=True)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Sum over every dim but the group (first) and the last: (G, …, P) → (G, P)."""
    return t.sum(dim=tuple(range(1, t.dim() - 1))) if t.dim() > 2 else t


def _along(p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-particle (G, P) tensor shaped to broadcast along `like`'s last dim."""
    return p.reshape(p.shape[0], *([1] * (like.dim() - 2)), p.shape[-1])


class Program:
    """The state of the limit (G groups × P particles per width n) and one pass of it."""

    def __init__(self, ops: list[Op], laws: dict[str, ParamLaw], groups: int, per: int, n: int, seed: int):
        self.ops, self.laws, self.G, self.per, self.n = ops, laws, groups, per, n
        self.by_node = {op.node: op for op in ops}
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype = torch.float64
        self.params: dict[str, torch.Tensor] = {}
        self.initial: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.matrices: dict[str, HiddenMatrix] = {}
        for op in ops:
            for key, name in op.params.items():
                law = laws[name]
                assert op.module is not None
                param = op.module.get_parameter(key)
                rows = (
                    rep_size(int(param.shape[0]), n, per, op.node) if law.role in ("input", "hidden", "vector") else 0
                )
                if law.role == "hidden":
                    cols = rep_size(int(param.shape[1]), n, per, op.node)
                    self.matrices[name] = HiddenMatrix(law.var, law.kappa, self.gen, per, (rows, cols))
                    continue
                if law.role == "output_bias":
                    assert law.value is not None
                    value = law.value.to(self.dtype).expand(groups, -1).clone()
                else:
                    if law.role == "output":  # W is (k, r·n): a per particle is (k,)
                        shape: tuple[int, ...] = (
                            groups,
                            rep_size(int(param.shape[1]), n, per, op.node),
                            param.shape[0],
                        )
                    else:
                        shape = (groups, rows) + ((param.shape[1],) if param.dim() == 2 else ())
                    value = law.sample(shape, self.gen, self.dtype)
                self.params[name] = value
                self.initial[name] = value
        self.step = 0
        self.adam: tuple[tuple[float, float], float] | None = None  # (betas, ε) when trained by Adam
        self.updaters: dict[str, Updater] = {}
        self.cache: dict[fx.Node, Any] = {}  # nn.MultiheadAttention's intermediates, for its backward
        self.graph = True  # the autograd graph of every value is kept (per-particle Ż partials)

    def use_stein(self) -> None:
        """Ż's expectations E[∂z/∂ζ] by Stein's lemma (`family.stein`): no autograd graph is kept."""
        self.graph = False
        for m in self.matrices.values():
            m.fwd.stein = m.bwd.stein = True

    def use_adam(self, betas: tuple[float, float], eps: float) -> None:
        """Train by torch.optim.Adam (β₁, β₂, ε at base width) instead of SGD: per coordinate for
        the particles' own parameters, the nonlinear outer product for hidden matrices (`adam`)."""
        self.adam = (betas, eps)
        for name, m in self.matrices.items():
            law = self.laws[name]
            m.adam = (betas, eps * law.adam_eps, law.adam_kappa)
        for name, law in self.laws.items():
            if law.role != "hidden":
                self.updaters[name] = Updater("adam", 0.0, False, betas, eps * law.adam_eps)

    # ------------------------------------------------------------------ forward

    def _last_uses(self) -> dict[int, list[fx.Node]]:
        """Op index → the nodes whose last reader (in forward order) it is."""
        index = {op.node: i for i, op in enumerate(self.ops)}
        last: dict[fx.Node, int] = {}
        for op in self.ops:
            for user in op.node.users:
                if user in index and op.node in index:
                    last[op.node] = max(last.get(op.node, -1), index[user])
        out: dict[int, list[fx.Node]] = {}
        for node, i in last.items():
            out.setdefault(i, []).append(node)
        return out

    def _first_uses(self) -> dict[int, list[fx.Node]]:
        """Op index → the nodes whose first reader (in forward order) it is: the backward, in reverse,
        reads a node's value last there."""
        index = {op.node: i for i, op in enumerate(self.ops)}
        first: dict[fx.Node, int] = {}
        for op in self.ops:
            users = [index[u] for u in op.node.users if u in index]
            if users:
                first[op.node] = min(users)
        out: dict[int, list[fx.Node]] = {}
        for node, i in first.items():
            out.setdefault(i, []).append(node)
        return out

    def forward(
        self,
        x: torch.Tensor,
        mode: str,
        lr: float = 0.0,
        momentum: float = 0.0,
        control: dict | None = None,
        keep: set[fx.Node] | None = None,
    ) -> tuple[dict[fx.Node, Any], dict[fx.Node, torch.Tensor]]:
        """Values of every node on inputs x (N, …, d): mode "init" (the network at init: Ẑ only, initial
        parameters), "train" or "eval" (current parameters). `control`: readout node → E[Z^{x₀} a₀]
        on the same inputs, subtracted from the readout (zero in expectation; see `limit`). Returns
        the values and, per readout node, its raw value before bias and control. With `keep`, only
        those nodes' values are returned: the others are freed after their last reader (memory)."""
        vals: dict[fx.Node, Any] = {}
        raw: dict[fx.Node, torch.Tensor] = {}
        p = self.initial if mode == "init" else self.params
        drop = self._last_uses() if keep is not None else {}
        for i, op in enumerate(self.ops):
            for done in drop.get(i - 1, ()):
                if keep is not None and done not in keep:
                    vals.pop(done, None)
            node = op.node
            if op.rule == "placeholder":
                vals[node] = x
            elif op.rule == "output":
                vals[node] = vals[node.args[0]]  # type: ignore[index]
            elif op.rule in ("input", "hidden", "readout"):
                v = vals[node.args[0]]  # type: ignore[index]
                w = op.params["weight"]
                b = p[op.params["bias"]] if "bias" in op.params else None
                if op.rule == "input":
                    out = torch.einsum("...d,gpd->g...p", v, p[w])
                elif op.rule == "hidden":
                    flat = v.reshape(v.shape[0], -1, v.shape[-1]).transpose(1, 2)  # (G, P_in, M)
                    z = self.matrices[w].forward(flat, self.step, lr, momentum, initial=mode == "init")
                    out = z.transpose(1, 2).reshape(*v.shape[:-1], z.shape[1])
                    release()  # the family's temporaries: pages back between the matrices, not at the pass's end
                else:
                    with torch.no_grad():
                        r = torch.einsum("g...p,gpk->g...k", v, p[w]) / self.per
                    raw[node] = r
                    out = r - control[node] if control is not None else r
                    if b is not None:
                        out = out + b.reshape(b.shape[0], *([1] * (out.dim() - 2)), b.shape[-1])
                    vals[node] = out.detach()
                    continue
                vals[node] = out if b is None else out + _along(b, out)
            elif op.rule == "norm":
                vals[node] = self._norm(op, vals[node.args[0]], p)  # type: ignore[index]
            elif op.rule == "sdpa":
                vals[node] = self._attend(op, vals)[1]
            elif op.rule == "mha":
                vals[node] = self._mha(op, vals, p, mode, lr, momentum)
            else:
                vals[node] = self._apply(op, vals, detach=op.kind == "finite")
        if keep is not None:
            vals = {k: v for k, v in vals.items() if k in keep}
        release()  # the pass's freed temporaries (see `memory`)
        return vals, raw

    def _apply(self, op: Op, vals: dict[fx.Node, Any], detach: bool = False) -> Any:
        """A generic op on held values: data ops as written, ops on width/finite values per Monte Carlo
        group (vmap), with sizes of width dims translated between the model (n) and the particles."""
        node = op.node
        args = [vals[a] for a in op.inputs]
        if op.kind in ("data", "const") or op.rule in ("data", "const"):
            assert op.fn is not None
            return op.fn(*args)
        if op.rule == "size":
            return self._size(op, args)
        if op.rule == "getitem" and isinstance(args[0], (tuple, list)):
            return args[0][node.args[1]]  # type: ignore[index]
        if op.rule == "cast":
            return args[0]
        kinds = [self.by_node[a].kind for a in op.inputs]
        if detach:
            args = [a.detach() if k in _G else a for a, k in zip(args, kinds, strict=True)]
        fn = self._translated(op, args, kinds)
        dims = tuple(0 if k in _G else None for k in kinds)
        try:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not detach):
                out = torch.func.vmap(fn, in_dims=dims, randomness="error")(*args)
        except ValueError:
            raise
        except Exception as e:
            raise node_error(node, f"an op the limit could not run per particle ({type(e).__name__}: {e})") from e
        if op.rule == "contract":
            out = out * (op.scale * self.n / self.per)
        return out

    def _translated(self, op: Op, args: list[Any], kinds: list[str]) -> Any:
        """op.fn, with a width dim's size arguments (reshape, split, a slice of it) in particles."""
        assert op.fn is not None
        node = op.node
        if op.rule == "reshape":
            given: Any = (
                node.args[1:] if len(node.args) > 2 or not isinstance(node.args[1], (tuple, list)) else node.args[1]
            )
            shape = [self._value(a, args, op) for a in given]
            if op.wdim is not None and op.wdim < len(shape) and shape[op.wdim] != -1:
                shape[op.wdim] = rep_size(int(shape[op.wdim]), self.n, self.per, node)
            return lambda t, *_: t.reshape(shape)
        if op.rule == "split":
            src = self.by_node[op.inputs[0]]
            dim: Any = self._value(node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0), args, op)
            sizes: Any = node.kwargs.get("split_size_or_sections", node.kwargs.get("split_size", node.args[1]))
            sizes = (
                [self._value(a, args, op) for a in sizes]
                if isinstance(sizes, (list, tuple))
                else self._value(sizes, args, op)
            )
            nd = args[0].dim() - 1
            if src.wdim is not None and int(dim) % nd == src.wdim:
                if isinstance(sizes, list):
                    sizes = [rep_size(int(k), self.n, self.per, node) for k in sizes]
                else:
                    sizes = rep_size(int(sizes), self.n, self.per, node)
            return lambda t, *_: torch.split(t, sizes, int(dim))
        if op.rule == "getitem":
            src = self.by_node[op.inputs[0]]
            index = self._index(node.args[1], args[0].dim() - 1, src, node)
            return lambda t, *_: t[index]
        return op.fn

    def _value(self, a: Any, args: list[Any], op: Op) -> Any:
        return args[op.inputs.index(a)] if isinstance(a, fx.Node) else a

    def _index(self, index: Any, nd: int, src: Op, node: fx.Node) -> Any:
        """An index into a width tensor, its slices of the width dim in particles (no integer there)."""
        items = list(index) if isinstance(index, tuple) else [index]
        if any(isinstance(i, (fx.Node, torch.Tensor)) for i in items):
            raise node_error(node, "an index computed in the forward pass into a width tensor")
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        dim, out = 0, list[Any]()
        for i in items:
            if i is Ellipsis:
                dim += nd - used
                out.append(i)
                continue
            if i is None:
                out.append(i)
                continue
            if dim == src.wdim:
                if not isinstance(i, slice) or i.step not in (None, 1):
                    raise node_error(node, "an integer or strided index into the width dim")
                ends = [
                    None if b is None else rep_size(b % src.size, self.n, self.per, node) for b in (i.start, i.stop)
                ]
                i = slice(ends[0], ends[1])
            out.append(i)
            dim += 1
        return tuple(out)

    def _size(self, op: Op, args: list[Any]) -> Any:
        """`size()`/`shape` of a held value, at the model's width (what the user's code expects)."""
        src = self.by_node[op.inputs[0]]
        t = args[0]
        shape = list(t.shape[1:]) if src.kind in _G else list(t.shape)
        if src.wdim is not None:
            shape[src.wdim] = shape[src.wdim] * self.n // self.per
        assert op.fn is not None
        probe = torch.empty(shape, device="meta")
        return op.fn(probe, *args[1:])

    def _norm(self, op: Op, v: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        m = op.module
        eps = getattr(m, "eps", None)
        eps = torch.finfo(self.dtype).eps if eps is None else float(eps)
        if type(m).__name__ == "LayerNorm":
            c = v - _e(v)
            s = (_e(c * c) + eps).sqrt()
        else:
            c = v
            s = (_e(v * v) + eps).sqrt()
        xhat = c / s
        if "weight" in op.params:
            xhat = xhat * _along(p[op.params["weight"]], xhat)
        if "bias" in op.params:
            xhat = xhat + _along(p[op.params["bias"]], xhat)
        return xhat

    def _sdpa_args(self, op: Op, vals: dict[fx.Node, Any]) -> dict[str, Any]:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = dict(zip(names, op.node.args, strict=False))
        bound.update(op.node.kwargs)
        return {k: vals[a] if isinstance(a, fx.Node) else a for k, a in bound.items()}

    def _attend(self, op: Op, vals: dict[fx.Node, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention's weights A (finite, detached) and output o = A·v (per particle)."""
        a = self._sdpa_args(op, vals)
        mask = a.get("attn_mask")
        return self._attention(a["query"], a["key"], a["value"], op.scale, bool(a.get("is_causal")), mask)

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, mask: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """softmax(s·q·kᵀ + mask)·v on particles: the logits' sum over a head's particles ×n/P (n·E_h);
        `mask` as SDPA takes it (bool: True attends; float: added)."""
        with torch.no_grad():
            logits = (q.detach() @ k.detach().transpose(-1, -2)) * (scale * self.n / self.per)
            if causal:
                tq, tk = logits.shape[-2:]
                keep = torch.ones(tq, tk, dtype=torch.bool, device=logits.device).tril()
                logits = logits.masked_fill(~keep, float("-inf"))
            if mask is not None:
                mask = torch.as_tensor(mask, device=logits.device)
                logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
            att = torch.softmax(logits, dim=-1)
        return att, att @ v

    def _attention_vjp(
        self, att: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ĝ^q, ĝ^k, ĝ^v) from ĝ^o (see the module doc); every finite quantity detached."""
        gv = att.transpose(-1, -2) @ g
        with torch.no_grad():
            da = (g.detach() / self.per) @ v.detach().transpose(-1, -2)
            dl = att * (da - (att * da).sum(-1, keepdim=True))
        c = scale * self.n
        return c * (dl @ k), c * (dl.transpose(-1, -2) @ q), gv

    # ------------------------------------------------------------------ nn.MultiheadAttention

    def _mha(
        self, op: Op, vals: dict[fx.Node, Any], p: dict[str, torch.Tensor], mode: str, lr: float, momentum: float
    ) -> Any:
        """nn.MultiheadAttention (self-attention, fused in-projection): the fused n → 3n hidden matrix,
        heads, attention at the scale parametrize measured, the out-projection; returns (o, weights)
        and keeps what its backward needs."""
        m = op.module
        assert isinstance(m, torch.nn.MultiheadAttention)
        a = self._mha_args(op, vals)
        x = a["query"] if m.batch_first else a["query"].transpose(1, 2)  # (G, B, T, P)
        g_, b_, t_, _ = x.shape
        w_in, w_out = op.params["in_proj_weight"], op.params["out_proj.weight"]
        flat = x.reshape(g_, -1, x.shape[-1]).transpose(1, 2)
        z = self.matrices[w_in].forward(flat, self.step, lr, momentum, initial=mode == "init")
        qkv = z.transpose(1, 2).reshape(g_, b_, t_, z.shape[1])
        if "in_proj_bias" in op.params:
            qkv = qkv + _along(p[op.params["in_proj_bias"]], qkv)
        h = m.num_heads
        q, k, v = (part.reshape(g_, b_, t_, h, -1).transpose(2, 3) for part in qkv.chunk(3, dim=-1))
        mask = a.get("attn_mask")
        if mask is not None and torch.as_tensor(mask).dtype == torch.bool:
            mask = ~torch.as_tensor(mask)  # nn.MultiheadAttention's True = may not attend
        pad = a.get("key_padding_mask")
        if pad is not None:
            keep = ~torch.as_tensor(pad).bool()[:, None, None, :]  # (B, 1, 1, T)
            mask = (
                keep
                if mask is None
                else (mask & keep if mask.dtype == torch.bool else mask.masked_fill(~keep, float("-inf")))
            )
        att, o = self._attention(q, k, v, op.scale, bool(a.get("is_causal")), mask)
        y = o.transpose(2, 3).reshape(g_, b_, t_, -1)
        yf = y.reshape(g_, -1, y.shape[-1]).transpose(1, 2)
        out = self.matrices[w_out].forward(yf, self.step, lr, momentum, initial=mode == "init")
        out = out.transpose(1, 2).reshape(g_, b_, t_, out.shape[1])
        if "out_proj.bias" in op.params:
            out = out + _along(p[op.params["out_proj.bias"]], out)
        self.cache[op.node] = (x, q, k, v, att, y)
        weights = att.mean(2) if a.get("average_attn_weights", True) else att
        return (out if m.batch_first else out.transpose(1, 2), weights if a.get("need_weights", True) else None)

    def _mha_args(self, op: Op, vals: dict[fx.Node, Any]) -> dict[str, Any]:
        names = (
            "query",
            "key",
            "value",
            "key_padding_mask",
            "need_weights",
            "attn_mask",
            "average_attn_weights",
            "is_causal",
        )
        bound = dict(zip(names, op.node.args, strict=False))
        bound.update(op.node.kwargs)
        return {k: vals[a] if isinstance(a, fx.Node) else a for k, a in bound.items()}

    def _mha_vjp(
        self, op: Op, g: Any, grads: dict[str, torch.Tensor], history: list, lr: float, momentum: float
    ) -> torch.Tensor:
        """The cotangent of the (one) input of an nn.MultiheadAttention, from its output's."""
        m = op.module
        assert isinstance(m, torch.nn.MultiheadAttention)
        if 1 in g:
            raise node_error(op.node, "a loss on nn.MultiheadAttention's attention weights (its second output)")
        go = g[0] if m.batch_first else g[0].transpose(1, 2)
        x, q, k, v, att, y = self.cache[op.node]
        g_, b_, t_, _ = go.shape

        def projection(weight: str, bias: str, g: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
            """One of the block's two hidden matrices: its bias's gradient, its step recorded, the gradient
            of its input, (groups, batch, tokens, features)."""
            if bias in op.params:
                grads[op.params[bias]] = _rows(g)
            gf = g.reshape(g_, -1, g.shape[-1]).transpose(1, 2)
            history.append((op.params[weight], gf, inp.reshape(g_, -1, inp.shape[-1]).transpose(1, 2)))
            back = self.matrices[op.params[weight]].backward(gf, self.step, lr, momentum)
            return back.transpose(1, 2).reshape(g_, b_, t_, -1)

        gy = projection("out_proj.weight", "out_proj.bias", go, y)
        gy = gy.reshape(g_, b_, t_, m.num_heads, -1).transpose(2, 3)
        gq, gk, gv = self._attention_vjp(att, q, k, v, gy, op.scale)
        gqkv = torch.cat([t.transpose(2, 3).reshape(g_, b_, t_, -1) for t in (gq, gk, gv)], dim=-1)
        gx = projection("in_proj_weight", "in_proj_bias", gqkv, x)
        return gx if m.batch_first else gx.transpose(1, 2)

    # ------------------------------------------------------------------ backward and update

    def train_step(self, x: torch.Tensor, y: torch.Tensor, lr: float, momentum: float, control: dict) -> None:
        """One SGD step on the batch (x, y): loss (1/B) Σ ½‖f − y‖² per group."""
        vals, _ = self.forward(x, "train", lr, momentum, control)
        out_node = self.ops[-1].node
        out = vals[out_node]
        with torch.no_grad():
            chi = (out - y.to(out.dtype).reshape(out.shape[1:])) / x.shape[0]  # ∂L/∂f, per group
        cot: dict[fx.Node, Any] = {out_node.args[0]: chi}  # type: ignore[dict-item]
        grads: dict[str, torch.Tensor] = {}
        history: list[tuple[str, torch.Tensor, torch.Tensor]] = []

        def add(node: Any, g: torch.Tensor | None) -> None:
            if g is None or not isinstance(node, fx.Node) or self.by_node[node].kind not in _G:
                return
            cot[node] = cot[node] + g if node in cot else g

        # a value is read last by its first reader's backward: freed there when no graph holds it
        drop = self._first_uses() if not self.graph else {}
        for at in reversed(range(len(self.ops))):
            for done in drop.get(at + 1, ()):
                vals.pop(done, None)
            op = self.ops[at]
            node = op.node
            if node not in cot or op.rule == "output":
                continue
            g = cot.pop(node)
            src = node.args[0] if node.args else None
            if op.rule == "getitem" and isinstance(vals[src], (tuple, list)):  # type: ignore[index]
                parts = cot.setdefault(src, {})  # type: ignore[arg-type]
                i = node.args[1]
                parts[i] = parts[i] + g if i in parts else g
                continue
            if op.rule == "readout":
                h, a = vals[src], self.params[op.params["weight"]]  # type: ignore[index]
                add(src, torch.einsum("gpk,g...k->g...p", a, g))
                grads[op.params["weight"]] = torch.einsum("g...p,g...k->gpk", h, g)
                if "bias" in op.params:
                    grads[op.params["bias"]] = _rows(g)
                continue
            if op.rule in ("input", "hidden") and "bias" in op.params:
                grads[op.params["bias"]] = _rows(g)
            if op.rule == "input":  # ĝ times what the layer reads (x after any op on the inputs)
                grads[op.params["weight"]] = torch.einsum("g...p,...d->gpd", g, vals[src])  # type: ignore[index]
            elif op.rule == "hidden":
                v = vals[src]  # type: ignore[index]
                gf = g.reshape(g.shape[0], -1, g.shape[-1]).transpose(1, 2)
                vf = v.reshape(v.shape[0], -1, v.shape[-1]).transpose(1, 2)
                history.append((op.params["weight"], gf, vf))
                back = self.matrices[op.params["weight"]].backward(gf, self.step, lr, momentum)
                add(src, back.transpose(1, 2).reshape(*v.shape))
                del v, vf, gf, back
                release()
            elif op.rule == "norm":
                add(src, self._norm_vjp(op, vals[src], g, grads))  # type: ignore[index]
            elif op.rule == "sdpa":
                for s, ga in self._sdpa_vjp(op, vals, g).items():
                    add(s, ga)
            elif op.rule == "mha":
                add(src, self._mha_vjp(op, g, grads, history, lr, momentum))
            elif op.rule not in ("data", "const", "size", "placeholder"):
                for s, gb in self._vjp(op, vals, g).items():
                    add(s, gb)
        self._update(grads, history, lr, momentum)

    def _vjp(self, op: Op, vals: dict[fx.Node, Any], g: Any) -> dict[fx.Node, torch.Tensor | None]:
        """The cotangent of each width/finite input of a generic op (a node used twice: once, summed):
        width cotangents in ĝ units (with their graph), finite ones detached."""
        nodes = list(dict.fromkeys(a for a in op.inputs if self.by_node[a].kind in _G))
        if not nodes:
            return {}
        local = {}
        for a in nodes:
            t = vals[a]
            if self.by_node[a].kind == "finite" or not t.requires_grad:
                t = t.detach().requires_grad_(True)
            local[a] = t
        with torch.enable_grad():
            out = self._apply(op, {**vals, **local})
            if isinstance(g, dict):  # a tuple of results (split): the cotangents of the parts used
                outs = [out[i] for i in g]
                cots = [self._rep_cot(op, c) for c in g.values()]
            else:
                outs, cots = [out], [self._rep_cot(op, g)]
            gs = torch.autograd.grad(
                outs, [local[a] for a in nodes], cots, create_graph=self.graph, retain_graph=True, allow_unused=True
            )
        res: dict[fx.Node, torch.Tensor | None] = {}
        for a, ga in zip(nodes, gs, strict=True):
            if ga is None:
                continue
            res[a] = ga * self.per if self.by_node[a].kind == "width" else ga.detach()
        return res

    def _rep_cot(self, op: Op, g: torch.Tensor) -> torch.Tensor:
        """A cotangent in the particles' own units: ĝ/P for a width value, as is for a finite one."""
        return g / self.per if op.kind == "width" else g.detach()

    def _sdpa_vjp(self, op: Op, vals: dict[fx.Node, Any], g: torch.Tensor) -> dict[fx.Node, torch.Tensor]:
        a = self._sdpa_args(op, vals)
        att, _ = self._attend(op, vals)
        grads = self._attention_vjp(att, a["query"], a["key"], a["value"], g, op.scale)
        bound = dict(zip(("query", "key", "value"), op.node.args, strict=False))
        bound.update({key: val for key, val in op.node.kwargs.items() if key in ("query", "key", "value")})
        out: dict[fx.Node, torch.Tensor] = {}
        for key, grad in zip(("query", "key", "value"), grads, strict=True):
            node = bound[key]
            out[node] = out[node] + grad if node in out else grad  # type: ignore[index]
        return out

    def _norm_vjp(self, op: Op, v: torch.Tensor, g: torch.Tensor, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        m = op.module
        eps = getattr(m, "eps", None)
        eps = torch.finfo(self.dtype).eps if eps is None else float(eps)
        ln = type(m).__name__ == "LayerNorm"
        c = v - _e(v) if ln else v
        s = (_e(c * c) + eps).sqrt()
        xhat = c / s
        if "bias" in op.params:
            grads[op.params["bias"]] = _rows(g)
        if "weight" in op.params:
            grads[op.params["weight"]] = _rows(g * xhat)
            g = g * _along(self.params[op.params["weight"]], g)
        dx = g - _e(g) if ln else g
        return (dx - xhat * _e(g * xhat)) / s

    def _update(self, grads: dict[str, torch.Tensor], history: list, lr: float, momentum: float) -> None:
        """torch.optim.SGD on the scaled gradients: b ← μb + g (b = g at the first step), p ← p − lr·κ·b;
        or torch.optim.Adam's step on them (`Updater`: p ← p − lr·κ̃·m̂/(√v̂ + ε̃))."""
        for name, g in grads.items():
            law = self.laws[name]
            if self.adam is not None:
                change = self.updaters[name].step({name: g}, lr * law.adam_kappa)[name]
                self.params[name] = self.params[name] + change
                continue
            buf = g if name not in self.buffers or not momentum else momentum * self.buffers[name] + g
            self.buffers[name] = buf
            self.params[name] = self.params[name] - lr * law.kappa * buf
        for name, g, v in history:
            self.matrices[name].history.append((self.step, g, v))
        self.step += 1
        release()  # the step's freed temporaries: their pages back to the OS (see `memory`)
