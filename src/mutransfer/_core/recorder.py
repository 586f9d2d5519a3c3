"""Record a model's forward: how every parameter is used, and the logit scale of every attention call.

µP's rules depend on facts about the running model that names and shapes only hint at: which dim
of a weight is contracted (its fan_in), whether a raw ``nn.Parameter`` is a projection, a lookup
table or a gain, and which constant multiplies each attention's ``q·kᵀ``. `observe` runs one
forward pass under a `TorchFunctionMode` and records them; nothing in the model changes.

**Parameter usage.** Every tensor derived from a parameter by views, transposes, reshapes,
splits, indexing, dtype casts and unary elementwise functions keeps a map from its dims to the
parameter's dims. When such a tensor meets an operation that fixes its role, a `Use` is recorded:

=============================================  =====================================================
operation                                      fan_in dims of the parameter / fan_out dims
=============================================  =====================================================
``linear(x, W)``                               W's last dim / W's second-to-last
``A @ B``, ``mm``, ``bmm``, ``baddbmm``, …     the contracted dim of the parameter's side / the other
``einsum``                                     labels summed against another operand / labels kept
                                               in the output only (shared kept labels are batch)
``conv*d(x, W)`` (``conv_transpose*d``)        W's dim 1 (0) / dim 0 (1)
``embedding(ids, W)``                          the looked-up dim / the others (``lookup``)
``W[ids]``, ``index_select``                   the same (``gather``), unless the rows are then
                                               contracted (experts gathered per token)
``x + P``, ``x * P``, ``cat``, norms' weights  none / all (``elementwise``: vector-like)
=============================================  =====================================================

Batch dims (e.g. the expert dim of fused expert weights ``W[e]`` or ``einsum('ebd,edf->ebf')``)
are neither.

**Attention logits** and the forward constants they are measured from: `scales` (a mixin).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .naming import canonical_name
from .observation import Dims, Observation, Use
from .op_tables import (
    CONV,
    ELEMENTWISE,
    MATMUL,
    MATMUL_ADD,
    NORMS,
    PERMUTE,
    RESHAPE,
    SAME_SHAPE,
    SPLIT,
    add_operands,
    einsum_labels,
    op_name,
    reshape_dims,
    tensors_in,
)
from .row_trails import RowTrails
from .scales import Scales

__all__ = ["recording"]


class _Recorder(RowTrails, Scales, TorchFunctionMode):
    def __init__(
        self, params: dict[int, str], module_stack: list[str], on_attention=None, attention_only: bool = False
    ):
        super().__init__()
        self.attention_only = attention_only
        self.paused = False  # ops run while set are the observer's own (a hook's copies): not the model's
        self.params = params
        self.stack = module_stack
        self.prov: dict[int, tuple[weakref.ref, str, Dims]] = {}
        self.constants: dict[int, tuple[weakref.ref, float, int | None]] = {}
        self.obs = Observation()
        self.on_attention = on_attention
        self.probs: dict[int, weakref.ref] = {}
        self.init_trails()
        self.init_row_trails()
        self.failures = 0

    # ------------------------------------------------------------ bookkeeping
    def _module(self) -> str:
        return self.stack[-1] if self.stack else ""

    def _p(self, t) -> tuple[str, Dims] | None:
        if not isinstance(t, torch.Tensor):
            return None
        name = self.params.get(id(t))
        if name is not None:
            return name, tuple((i,) for i in range(t.ndim))
        entry = self.prov.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1], entry[2]
        return None

    def _set_p(self, t, name: str, dims: Dims) -> None:
        if isinstance(t, torch.Tensor) and id(t) not in self.params and len(dims) == t.ndim:
            try:
                self.prov[id(t)] = (weakref.ref(t), name, dims)
            except TypeError:
                pass

    def use(self, name: str, op: str, fan_in, fan_out, what: str) -> None:
        if self.attention_only:
            return
        fi = tuple(sorted({d for group in fan_in for d in group}))
        fo = tuple(sorted({d for group in fan_out for d in group} - set(fi)))
        self.obs.uses.setdefault(name, []).append(Use(self._module(), op, fi, fo, what))

    # ------------------------------------------------------------ dispatch
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused:
            return out
        try:
            makes_tensors = bool(tensors_in(out))  # an op making tensors (not .shape, .dtype, .size(), …)
            if self.attention_only and not makes_tensors:
                return out  # nothing for attention to follow: every tracker below marks only tensors it made
            if not self.attention_only and makes_tensors:
                self._count_output_uses(args, kwargs)
            name = op_name(func)
            self._usage(name, args, kwargs, out)
            self._track_constants(name, args, kwargs, out)
            self._track_origins(name, args, kwargs, out)
            self._track_sources(args, kwargs, out)
            if not self.attention_only:
                self._track_rows(name, args, kwargs, out)
            if self.on_attention is not None:
                self._track_terms(func, name, args, kwargs, out)
        except Exception:  # observing must never break the user's forward
            self.failures += 1
        return out

    # ------------------------------------------------------------ parameter usage
    def _usage(self, name: str, args, kwargs, out) -> None:
        first = args[0] if args else None
        p = self._p(first)
        if name == "linear":
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            pw = self._p(w)
            if pw is not None:
                dims = pw[1]
                self.use(pw[0], "contraction", dims[-1:], dims[:-1], name)
            pb = self._p(b)
            if pb is not None:
                self.use(pb[0], "elementwise", (), pb[1], name)
            return
        if name in MATMUL or name in MATMUL_ADD or name == "rmatmul":
            ops = list(args[:3])
            if name in MATMUL_ADD:
                ops = add_operands(name, args, kwargs)
                pb = self._p(ops[0])
                if pb is not None:
                    self.use(pb[0], "elementwise", (), pb[1], name)
                ops = ops[1:3]
            elif name == "rmatmul":
                ops = [ops[1], ops[0]]
            if len(ops) < 2:
                return
            a, b = ops[0], ops[1]
            pa, pb = self._p(a), self._p(b)
            if pa is not None:
                dims = pa[1]
                self.use(pa[0], "contraction", dims[-1:], dims[-2:-1] if len(dims) >= 2 else (), name)
            if pb is not None:
                dims = pb[1]
                if len(dims) >= 2:
                    self.use(pb[0], "contraction", dims[-2:-1], dims[-1:], name)
                else:
                    self.use(pb[0], "contraction", dims, (), name)
            return
        if name == "einsum":
            self._einsum(args)
            return
        if name in CONV or name == "convolution":
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            pw = self._p(w)
            transposed = CONV.get(name, bool(args[6]) if len(args) > 6 else bool(kwargs.get("transposed", False)))
            if pw is not None:
                dims = pw[1]
                fi, fo = (dims[0:1], dims[1:2]) if transposed else (dims[1:2], dims[0:1])
                self.use(pw[0], "contraction", fi, fo, name)
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            pb = self._p(b)
            if pb is not None:
                self.use(pb[0], "elementwise", (), pb[1], name)
            return
        if name in ("embedding", "embedding_bag"):
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            pw = self._p(w)
            if pw is not None:
                self.use(pw[0], "lookup", pw[1][:1], pw[1][1:], name)
            return
        if name == "multi_head_attention_forward":
            self._mha_params(args, kwargs)
            return
        if name in NORMS:
            for t in list(args[1:]) + list(kwargs.values()):
                pt = self._p(t)
                if pt is not None:
                    self.use(pt[0], "elementwise", (), pt[1], name)
            return
        if p is not None and (
            name in PERMUTE
            or name in SAME_SHAPE
            or name in RESHAPE
            or name in SPLIT
            or name in ("getitem", "index_select", "unbind", "repeat_interleave")
        ):
            self._propagate(name, first, p, args, kwargs, out)
            return
        if name in ELEMENTWISE or (name.startswith("r") and name[1:] in ("add", "sub", "mul", "div")):
            tensors = tensors_in(list(args) + list(kwargs.values()))
            derived = [(t, pt) for t in tensors if (pt := self._p(t)) is not None]
            for _t, pt in derived:
                self.use(pt[0], "elementwise", (), pt[1], name)
            # a parameter times a constant is still that parameter (weight · c, then used as a weight)
            if (
                len(derived) == 1
                and isinstance(out, torch.Tensor)
                and name in ("mul", "div", "rmul")
                and out.shape == derived[0][0].shape
                and all(self._const(a) is not None for a in args if a is not derived[0][0])
            ):
                self._set_p(out, derived[0][1][0], derived[0][1][1])

    def _propagate(self, name: str, t: Any, p: tuple[str, Dims], args, kwargs, out) -> None:
        pname, dims = p
        if (name in ("t", "T") and len(dims) == 2) or name == "mT":
            new = dims[:-2] + (dims[-1], dims[-2]) if len(dims) >= 2 else dims
        elif name in ("transpose", "swapaxes", "swapdims"):
            i, j = (
                (int(args[1]) % len(dims), int(args[2]) % len(dims))
                if len(args) >= 3
                else (int(kwargs.get("dim0")) % len(dims), int(kwargs.get("dim1")) % len(dims))
            )
            lst = list(dims)
            lst[i], lst[j] = lst[j], lst[i]
            new = tuple(lst)
        elif name == "permute":
            order = args[1:] if len(args) > 2 or not isinstance(args[1], (list, tuple)) else args[1]
            new = tuple(dims[int(o) % len(dims)] for o in order)
        elif name in ("movedim", "moveaxis"):
            src, dst = args[1], args[2]
            src = [src] if isinstance(src, int) else list(src)
            dst = [dst] if isinstance(dst, int) else list(dst)
            lst = [d for i, d in enumerate(dims) if i not in [s % len(dims) for s in src]]
            for s, d in sorted(zip(src, dst), key=lambda x: x[1] % len(dims)):
                lst.insert(d % len(dims), dims[s % len(dims)])
            new = tuple(lst)
        elif name == "getitem":
            self._getitem(t, pname, dims, args[1], out)
            return
        elif name == "index_select":
            dim = int(args[1]) % len(dims)
            self.use(pname, "gather", dims[dim : dim + 1], dims[:dim] + dims[dim + 1 :], name)
            return
        elif name == "unbind":
            dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0)) % len(dims)
            new = dims[:dim] + dims[dim + 1 :]
        elif name in ("expand", "expand_as", "broadcast_to", "repeat", "tile"):
            if not isinstance(out, torch.Tensor) or out.ndim < len(dims):
                return
            new = ((),) * (out.ndim - len(dims)) + dims
        elif name in SPLIT:
            new = dims
        elif name in SAME_SHAPE:
            new = dims
        else:  # reshape-like
            if not isinstance(out, torch.Tensor):
                return
            reshaped = reshape_dims(tuple(t.shape), tuple(out.shape), dims)
            if reshaped is None:
                return
            new = reshaped
        for o in tensors_in(out):
            if o.ndim == len(new):
                self._set_p(o, pname, new)

    def _getitem(self, t: torch.Tensor, pname: str, dims: Dims, index, out) -> None:
        idx = index if isinstance(index, tuple) else (index,)
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        expanded: list = []
        for i in idx:
            if i is Ellipsis:
                expanded += [slice(None)] * (len(dims) - n_real)
            else:
                expanded.append(i)
        new: list = []
        pos = 0
        advanced = 0
        for i in expanded:
            if i is None:
                new.append(())
                continue
            if pos >= len(dims):
                return
            if isinstance(i, slice):
                new.append(dims[pos])
                pos += 1
            elif isinstance(i, int) or (isinstance(i, torch.Tensor) and i.ndim == 0):
                pos += 1  # one entry picked (an expert, a head): a batch dim
            elif isinstance(i, torch.Tensor):
                if i.dtype == torch.bool:
                    width = max(i.ndim, 1)
                    new.append(())
                    pos += width
                else:
                    # rows looked up by index: an embedding table, unless later contracted (fused experts)
                    self.use(pname, "gather", dims[pos : pos + 1], dims[:pos] + dims[pos + 1 :], "getitem")
                    new += [()] * i.ndim
                    pos += 1
                advanced += 1
            else:
                return
        new += list(dims[pos:])
        if advanced > 1 or not isinstance(out, torch.Tensor) or out.ndim != len(new):
            return
        self._set_p(out, pname, tuple(new))

    def _einsum(self, args) -> None:
        eq = args[0]
        operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
        if not isinstance(eq, str):
            return
        eq = eq.replace(" ", "")
        lhs, _, rhs = eq.partition("->")
        subs = lhs.split(",")
        if len(subs) != len(operands):
            return
        labels = [einsum_labels(s, getattr(o, "ndim", 0)) for s, o in zip(subs, operands)]
        if not rhs and "->" not in eq:
            counts: dict[str, int] = {}
            for ls in labels:
                for lab in ls:
                    counts[lab] = counts.get(lab, 0) + 1
            out_labels = set(lab for lab, c in counts.items() if c == 1)
        else:
            width = max((len(ls) for ls in labels), default=0)
            out_labels = set(einsum_labels(rhs, width + rhs.count("...") * 0))
            if "..." in rhs:
                out_labels |= {lab for ls in labels for lab in ls if lab.startswith(".")}
        for k, (o, ls) in enumerate(zip(operands, labels)):
            po = self._p(o)
            if po is None or len(ls) != len(po[1]):
                continue
            others = {lab for j, lj in enumerate(labels) if j != k for lab in lj}
            fan_in, fan_out = [], []
            for lab, d in zip(ls, po[1]):
                if lab in out_labels:
                    if lab not in others:
                        fan_out.append(d)
                elif lab in others:
                    fan_in.append(d)
                else:
                    fan_in.append(d)
            self.use(po[0], "contraction", fan_in, fan_out, "einsum")

    def _mha_params(self, args, kwargs) -> None:
        names = (
            "query",
            "key",
            "value",
            "embed_dim_to_check",
            "num_heads",
            "in_proj_weight",
            "in_proj_bias",
            "bias_k",
            "bias_v",
            "add_zero_attn",
            "dropout_p",
            "out_proj_weight",
            "out_proj_bias",
        )
        bound = dict(zip(names, args))
        bound.update(kwargs)
        for key in ("in_proj_weight", "out_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
            pt = self._p(bound.get(key))
            if pt is not None:
                self.use(pt[0], "contraction", pt[1][1:2], pt[1][0:1], "multi_head_attention_forward")
        for key in ("in_proj_bias", "out_proj_bias", "bias_k", "bias_v"):
            pt = self._p(bound.get(key))
            if pt is not None:
                self.use(pt[0], "elementwise", (), pt[1], "multi_head_attention_forward")
        query, heads = bound.get("query"), bound.get("num_heads")
        embed = bound.get("embed_dim_to_check")
        if isinstance(query, torch.Tensor) and isinstance(heads, int) and isinstance(embed, int) and heads:
            d = embed // heads
            self._attention("mha", d, 1.0 / math.sqrt(d), None, None)


@contextlib.contextmanager
def recording(
    model: nn.Module, on_attention: Callable[..., None] | None = None, attention_only: bool = False
) -> Iterator[_Recorder]:
    """Record usage and attention calls of every forward run inside the block.

    Args:
        model: the model whose parameters and modules are named in the record.
        on_attention: called as ``on_attention(call, q, k, logits, causal)`` at each attention
            computation with its tensors: q and k for SDPA (then also ``scale=``, SDPA's own scale: the
            factor q·kᵀ still needs, as q and k already hold any constant multiplied onto them), the
            q·k term of the logits for a matmul → softmax (additive biases left out, masked entries NaN).
        attention_only: record only what the attention calls need (`Observation.attention`,
            `Observation.prob_modules` and the `on_attention` calls, the same as a full record's): the
            parameter provenance, forward constants, origins and logit terms they are computed from are
            followed, but parameter uses, output-use counts and row/column cuts are not recorded.
            Set the recorder's ``paused`` to run ops that the record leaves out (an observer's own copies).

    Returns:
        A context manager yielding the recorder, whose ``obs`` (an `Observation`) holds the record.
    """
    params: dict[int, str] = {}
    for n, p in model.named_parameters():
        params.setdefault(id(p), canonical_name(n))
    names = {id(m): canonical_name(n) for n, m in model.named_modules()}
    stack: list[str] = []

    def enter(module, args):
        name = names.get(id(module))
        if name is not None:
            stack.append(name)
            try:
                recorder.enter_module(name, args)
            except Exception:  # observing must never break the user's forward
                recorder.failures += 1

    def leave(module, args, output):
        name = names.get(id(module))
        if name is not None and stack and stack[-1] == name:
            stack.pop()
            try:
                recorder.leave_module(name, output)
            except Exception:
                recorder.failures += 1

    recorder = _Recorder(params, stack, on_attention, attention_only)
    h1 = nn.modules.module.register_module_forward_pre_hook(enter)
    h2 = nn.modules.module.register_module_forward_hook(leave, always_call=True)
    try:
        with recorder:
            yield recorder
    finally:
        h1.remove()
        h2.remove()
