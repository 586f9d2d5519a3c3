"""Observe a model's forward: how every parameter is used, and the logit scale of every attention call.

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

**Attention logits.** Each tensor carries a *scale*: the product of the constants that multiplied
it since it last came out of a parametrized layer or a normalisation (`linear`, `conv`,
`layer_norm`, ``x * rsqrt(mean(x²))`` — the algebra is tracked, so a hand-written RMSNorm resets it
too). A product of two such activations (``q @ kᵀ``, ``einsum``, ``baddbmm``) is a logit candidate
with the contracted size as head dim; when it reaches a ``softmax`` the call is recorded with its
effective scale (``(q·s)·k·c`` → ``s·c``; additive masks, position biases and ALiBi leave it alone).
``scaled_dot_product_attention`` calls record ``scale`` (or ``1/√d``) times the scales of q and k.
A constant baked into a weight's init (T5 puts its 1/√d there) is not a forward constant: the
scale of such a model is 1.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .devices import module_device, move
from .naming import canonical_name

__all__ = [
    "AttentionCall",
    "Dims",
    "Observation",
    "Use",
    "call_model",
    "example_inputs",
    "observe",
    "observe_model",
    "recording",
    "to_device",
]

Dims = tuple[tuple[int, ...], ...]  # per tensor dim: the parameter dims it came from


@dataclass(frozen=True)
class Use:
    """One observed use of a parameter."""

    module: str  # the module whose forward made the call ("" for the model itself)
    op: str  # "contraction", "lookup" (embedding), "gather" (rows by index), "elementwise"
    fan_in: tuple[int, ...]
    fan_out: tuple[int, ...]
    what: str = ""  # the torch function, for messages


@dataclass(frozen=True)
class AttentionCall:
    """One attention computation seen on the probe forward."""

    module: str  # the innermost module running it
    kind: str  # "sdpa", "eager" (matmul → softmax) or "mha" (nn.MultiheadAttention)
    head_dim: int
    scale: float  # the constant multiplying q·kᵀ (after any normalisation of q and k)


@dataclass
class Observation:
    uses: dict[str, list[Use]] = field(default_factory=dict)  # canonical parameter name → uses
    attention: list[AttentionCall] = field(default_factory=list)
    # module → the constant its (first) input carries from the forward code, where it is not 1
    # (T5 multiplies the decoder output by d_model^-½ before its tied readout)
    input_scales: dict[str, float] = field(default_factory=dict)
    # modules whose (first) input is an attention's probabilities (dropout on them, for example)
    prob_modules: set[str] = field(default_factory=set)
    called: set[str] = field(default_factory=set)  # modules whose forward ran
    error: str | None = None  # why the forward could not run (then nothing was observed)
    inputs: Any = None  # the inputs it ran on

    @property
    def ran(self) -> bool:
        return self.error is None

    def attention_by_module(self) -> dict[str, list[AttentionCall]]:
        out: dict[str, list[AttentionCall]] = {}
        for call in self.attention:
            out.setdefault(call.module, []).append(call)
        return out


# --------------------------------------------------------------------------- op tables

_PERMUTE = {"t", "T", "mT", "transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis"}
_SAME_SHAPE = {
    "contiguous",
    "clone",
    "detach",
    "to",
    "float",
    "half",
    "bfloat16",
    "double",
    "type_as",
    "type",
    "data",
    "cpu",
    "cuda",
    "requires_grad",
    "neg",
    "negative",
    "abs",
    "exp",
    "sigmoid",
    "softplus",
    "tanh",
    "sin",
    "cos",
    "log",
    "pow",
    "sqrt",
    "rsqrt",
    "square",
    "reciprocal",
    "silu",
    "gelu",
    "relu",
    "exp2",
    "expm1",
    "log1p",
    "clamp",
    "clip",
    "dropout",
    "alias",
    "float_power",
    "sign",
    "erf",
    "contiguous_format",
    "coalesce",
    "resolve_conj",
    "resolve_neg",
    "fill_diagonal",
}
_RESHAPE = {
    "view",
    "reshape",
    "flatten",
    "unflatten",
    "unsqueeze",
    "squeeze",
    "expand",
    "expand_as",
    "view_as",
    "reshape_as",
    "broadcast_to",
    "repeat",
    "tile",
}
_SPLIT = {"chunk", "split", "tensor_split", "split_with_sizes", "unsafe_chunk", "unsafe_split", "narrow"}
_ELEMENTWISE = {
    "add",
    "sub",
    "mul",
    "div",
    "true_divide",
    "addcmul",
    "addcdiv",
    "where",
    "lerp",
    "maximum",
    "minimum",
    "masked_fill",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "hstack",
    "vstack",
    "rsub",
}
_MATMUL = {"matmul", "mm", "bmm", "mv", "dot", "inner", "_grouped_mm", "grouped_mm"}  # grouped: (tokens, k) × (E, k, n)
_MATMUL_ADD = {"baddbmm", "addmm", "addbmm", "addmv"}  # (input, A, B)
_NORMS = {"layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "normalize", "local_response_norm"}
_SOFTMAX = {"softmax", "log_softmax", "_softmax", "softmin"}
_CONV = {
    "conv1d": False,
    "conv2d": False,
    "conv3d": False,
    "conv_transpose1d": True,
    "conv_transpose2d": True,
    "conv_transpose3d": True,
}
# Scale algebra for attention logits: how the scale of the output follows the input's.
_SCALE_SAME = {
    "contiguous",
    "clone",
    "detach",
    "to",
    "float",
    "half",
    "bfloat16",
    "double",
    "type_as",
    "type",
    "neg",
    "negative",
    "abs",
    "view",
    "reshape",
    "flatten",
    "unflatten",
    "unsqueeze",
    "squeeze",
    "expand",
    "expand_as",
    "view_as",
    "reshape_as",
    "broadcast_to",
    "repeat",
    "tile",
    "repeat_interleave",
    "t",
    "T",
    "mT",
    "transpose",
    "swapaxes",
    "swapdims",
    "permute",
    "movedim",
    "moveaxis",
    "getitem",
    "mean",
    "sum",
    "amax",
    "amin",
    "max",
    "min",
    "narrow",
    "chunk",
    "split",
    "unbind",
    "tensor_split",
    "split_with_sizes",
    "cat",
    "concat",
    "stack",
    "masked_fill",
    "where",
    "clamp",
    "clip",
    "tanh",
    "dropout",
    "roll",
    "flip",
    "index_select",
    "gather",
    "pad",
}


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property such as Tensor.T
        return getattr(getattr(func, "__self__", None), "__name__", "")
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        if core in ("getitem", "setitem"):
            return core
        if core.startswith("i") and core[1:] in ("add", "sub", "mul", "truediv", "div", "matmul"):
            core = core[1:]
        if core.startswith("r") and core[1:] in ("add", "sub", "mul", "truediv", "div", "matmul"):
            return "r" + core[1:].replace("truediv", "div")
        return core.replace("truediv", "div")
    if name.endswith("_") and not name.endswith("__") and name not in ("_softmax",):
        name = name[:-1]  # in-place variant
    return name


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


# --------------------------------------------------------------------------- the mode


class _Recorder(TorchFunctionMode):
    def __init__(self, params: dict[int, str], module_stack: list[str], on_attention=None):
        super().__init__()
        self.params = params
        self.stack = module_stack
        self.prov: dict[int, tuple[weakref.ref, str, Dims]] = {}
        self.scales: dict[int, tuple[weakref.ref, float, int | None]] = {}
        self.obs = Observation()
        self.on_attention = on_attention
        self.probs: dict[int, weakref.ref] = {}
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

    def _s(self, t) -> tuple[float, int | None]:
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            return float(t), None
        if not isinstance(t, torch.Tensor):
            return 1.0, None
        entry = self.scales.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1], entry[2]
        return 1.0, None

    def _const(self, t) -> float | None:
        """A Python number or a one-element constant tensor's value, else None."""
        if isinstance(t, bool):
            return None
        if isinstance(t, (int, float)):
            return float(t)
        if (
            isinstance(t, torch.Tensor)
            and t.numel() == 1
            and not t.is_meta
            and id(t) not in self.params
            and id(t) not in self.scales
            and self._p(t) is None
            and not t.requires_grad
        ):
            try:
                return float(t)
            except (RuntimeError, ValueError):
                return None
        return None

    def _set_s(self, t, scale: float, logit_dim: int | None = None) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if scale == 1.0 and logit_dim is None:
            self.scales.pop(id(t), None)
            return
        try:
            self.scales[id(t)] = (weakref.ref(t), scale, logit_dim)
        except TypeError:
            pass

    def use(self, name: str, op: str, fan_in, fan_out, what: str) -> None:
        fi = tuple(sorted({d for group in fan_in for d in group}))
        fo = tuple(sorted({d for group in fan_out for d in group} - set(fi)))
        self.obs.uses.setdefault(name, []).append(Use(self._module(), op, fi, fo, what))

    # ------------------------------------------------------------ dispatch
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            name = _name(func)
            self._usage(name, args, kwargs, out)
            self._scale(name, args, kwargs, out)
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
        if name in _MATMUL or name in _MATMUL_ADD or name == "rmatmul":
            ops = list(args[:3])
            if name in _MATMUL_ADD:
                ops = _add_operands(name, args, kwargs)
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
        if name in _CONV or name == "convolution":
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            pw = self._p(w)
            transposed = _CONV.get(name, bool(args[6]) if len(args) > 6 else bool(kwargs.get("transposed", False)))
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
        if name in _NORMS:
            for t in list(args[1:]) + list(kwargs.values()):
                pt = self._p(t)
                if pt is not None:
                    self.use(pt[0], "elementwise", (), pt[1], name)
            return
        if p is not None and (
            name in _PERMUTE
            or name in _SAME_SHAPE
            or name in _RESHAPE
            or name in _SPLIT
            or name in ("getitem", "index_select", "unbind", "repeat_interleave")
        ):
            self._propagate(name, first, p, args, kwargs, out)
            return
        if name in _ELEMENTWISE or (name.startswith("r") and name[1:] in ("add", "sub", "mul", "div")):
            tensors = _tensors(list(args) + list(kwargs.values()))
            derived = [(t, self._p(t)) for t in tensors]
            derived = [(t, pt) for t, pt in derived if pt is not None]
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

    def _propagate(self, name: str, t: torch.Tensor, p: tuple[str, Dims], args, kwargs, out) -> None:
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
        elif name in _SPLIT:
            new = dims
        elif name in _SAME_SHAPE:
            new = dims
        else:  # reshape-like
            if not isinstance(out, torch.Tensor):
                return
            new = _reshape_dims(tuple(t.shape), tuple(out.shape), dims)
            if new is None:
                return
        for o in _tensors(out):
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
        labels = [_einsum_labels(s, getattr(o, "ndim", 0)) for s, o in zip(subs, operands)]
        if not rhs and "->" not in eq:
            counts: dict[str, int] = {}
            for ls in labels:
                for lab in ls:
                    counts[lab] = counts.get(lab, 0) + 1
            out_labels = set(lab for lab, c in counts.items() if c == 1)
        else:
            width = max((len(ls) for ls in labels), default=0)
            out_labels = set(_einsum_labels(rhs, width + rhs.count("...") * 0))
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

    # ------------------------------------------------------------ attention scales
    def _scale(self, name: str, args, kwargs, out) -> None:
        if name == "scaled_dot_product_attention":
            q = args[0] if args else kwargs.get("query")
            k = args[1] if len(args) > 1 else kwargs.get("key")
            scale = args[6] if len(args) > 6 else kwargs.get("scale")
            d = q.shape[-1]
            base = float(scale) if scale is not None else 1.0 / math.sqrt(d)
            causal = bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False))
            self._attention("sdpa", d, base * self._s(q)[0] * self._s(k)[0], q, k, causal=causal)
            return
        if name in _SOFTMAX:
            x = args[0] if args else kwargs.get("input")
            s, logit_dim = self._s(x)
            if logit_dim is not None:
                self._attention("eager", logit_dim, s, None, None, logits=x)
                if isinstance(out, torch.Tensor):
                    self.probs[id(out)] = weakref.ref(out)
            return
        if name in ("linear", "embedding") or name in _CONV or name in _NORMS:
            return  # a parametrized layer or a normalisation: its output starts at scale 1
        if name in _MATMUL or name == "rmatmul" or name in _MATMUL_ADD or name == "einsum":
            self._scale_product(name, args, kwargs, out)
            return
        if name in ("mul", "rmul", "div", "rdiv"):
            a, b = (args[0], args[1]) if len(args) >= 2 else (args[0], kwargs.get("other"))
            (sa, la), (sb, lb) = self._s(a), self._s(b)
            ca, cb = self._const(a), self._const(b)
            if name in ("mul", "rmul"):
                sa = ca if ca is not None and not isinstance(a, torch.Tensor) else sa
                sb = cb if cb is not None else sb
                self._set_s(out, sa * sb, la if la is not None else lb)
            elif name == "div":
                sb = cb if cb is not None else sb
                if sb:
                    self._set_s(out, sa / sb, la)
            else:  # rdiv: b / a
                if sa:
                    self._set_s(out, (cb if cb is not None else sb) / sa, None)
            return
        if name in ("add", "sub", "radd", "rsub"):
            a, b = (args[0], args[1]) if len(args) >= 2 else (args[0], kwargs.get("other"))
            candidates = [
                self._s(x)
                for x in (a, b)
                if isinstance(x, torch.Tensor) and id(x) in self.scales and self.scales[id(x)][0]() is x
            ]
            if candidates:
                logit = next((c for c in candidates if c[1] is not None), candidates[0])
                self._set_s(out, logit[0], logit[1])
            return
        if name in ("pow", "square", "sqrt", "rsqrt", "reciprocal", "var", "std"):
            s, _ = self._s(args[0] if args else None)
            if s == 1.0:
                return
            power = {"square": 2.0, "sqrt": 0.5, "rsqrt": -0.5, "reciprocal": -1.0, "var": 2.0, "std": 1.0}.get(name)
            if name == "pow":
                e = args[1] if len(args) > 1 else kwargs.get("exponent")
                power = float(e) if isinstance(e, (int, float)) else None
            if power is not None:
                self._set_s(out, s**power)
            return
        if name in _SCALE_SAME:
            src = args[0] if args else None
            if isinstance(src, (list, tuple)):  # cat/stack
                scales = [self._s(x) for x in src]
                s, ld = scales[0] if scales else (1.0, None)
            else:
                s, ld = self._s(src)
            if s != 1.0 or ld is not None:
                for o in _tensors(out):
                    self._set_s(o, s, ld)

    def _scale_product(self, name: str, args, kwargs, out) -> None:
        if name == "einsum":
            operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
            if len(operands) != 2:
                return
            a, b = operands
            eq = args[0].replace(" ", "")
            lhs, _, rhs = eq.partition("->")
            subs = lhs.split(",")
            shared = [lab for lab in subs[0] if lab in subs[1] and lab not in rhs and lab.isalpha()]
            d = int(a.shape[subs[0].index(shared[0])]) if len(shared) == 1 and "..." not in subs[0] else None
            alpha = 1.0
        elif name in _MATMUL_ADD:
            _, a, b = _add_operands(name, args, kwargs)
            d = int(a.shape[-1]) if isinstance(a, torch.Tensor) else None
            alpha = kwargs.get("alpha", 1.0)
            alpha = float(alpha) if isinstance(alpha, (int, float)) else 1.0
        else:
            a, b = (args[0], args[1]) if name != "rmatmul" else (args[1], args[0])
            d = int(a.shape[-1]) if isinstance(a, torch.Tensor) and a.ndim >= 1 else None
            alpha = 1.0
        if self._p(a) is not None or self._p(b) is not None or id(a) in self.params or id(b) in self.params:
            return  # a product with a weight is a layer: its output starts at scale 1
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return
        (sa, la), (sb, lb) = self._s(a), self._s(b)
        if la is not None or lb is not None:
            return  # attention weights × values: not a logit
        self._set_s(out, alpha * sa * sb, d)

    def _attention(self, kind: str, d: int, scale: float, q, k, logits=None, causal: bool = False) -> None:
        call = AttentionCall(self._module(), kind, int(d), float(scale))
        self.obs.attention.append(call)
        if self.on_attention is not None:
            self.on_attention(call, q, k, logits, causal)


def _add_operands(name: str, args, kwargs) -> list:
    """(input, A, B) of baddbmm/addmm/addbmm/addmv, positional or by keyword (Bloom: batch1=, batch2=)."""
    first, second = {"addmv": ("mat", "vec")}.get(name, ("mat1", "mat2") if name == "addmm" else ("batch1", "batch2"))
    ops = list(args[:3]) + [None] * (3 - len(args[:3]))
    if ops[0] is None:
        ops[0] = kwargs.get("input")
    if ops[1] is None:
        ops[1] = kwargs.get(first)
    if ops[2] is None:
        ops[2] = kwargs.get(second)
    return ops


def _einsum_labels(sub: str, ndim: int) -> list[str]:
    if "..." not in sub:
        return list(sub)
    head, _, tail = sub.partition("...")
    n = max(ndim - len(head) - len(tail), 0)
    return list(head) + [f".{i}" for i in range(n)] + list(tail)


def _reshape_dims(src: tuple[int, ...], dst: tuple[int, ...], dims: Dims) -> Dims | None:
    """Parameter dims of a reshaped tensor: groups of dims whose sizes multiply to the same."""
    out: list[tuple[int, ...]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            out.append(())
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        while pi != pj:
            if pi < pj:
                i += 1
                if i >= len(src):
                    return None
                gi.append(i)
                pi *= src[i]
            else:
                j += 1
                if j >= len(dst):
                    return None
                gj.append(j)
                pj *= dst[j]
        merged = tuple(sorted({d for k in gi for d in dims[k]}))
        out += [merged if dst[k] != 1 else () for k in gj]
        i += 1
        j += 1
    return tuple(out) if len(out) == len(dst) else None


# --------------------------------------------------------------------------- running it


@contextlib.contextmanager
def recording(model: nn.Module, on_attention: Callable | None = None):
    """Record usage and attention calls of every forward run inside the block (yields the recorder,
    whose ``obs`` holds them). `on_attention(call, q, k, logits, causal)` is called at each attention
    computation with its tensors: q and k for SDPA, the logits tensor for a matmul → softmax."""
    params: dict[int, str] = {}
    for n, p in model.named_parameters():
        params.setdefault(id(p), canonical_name(n))
    names = {id(m): canonical_name(n) for n, m in model.named_modules()}
    stack: list[str] = []

    def enter(module, args):
        name = names.get(id(module))
        if name is not None:
            stack.append(name)
            recorder.obs.called.add(name)
            if args and isinstance(args[0], torch.Tensor):
                ref = recorder.probs.get(id(args[0]))
                if ref is not None and ref() is args[0]:
                    recorder.obs.prob_modules.add(name)
            if args and isinstance(args[0], torch.Tensor) and name not in recorder.obs.input_scales:
                scale = recorder._s(args[0])[0]
                if scale != 1.0:
                    recorder.obs.input_scales[name] = scale

    def leave(module, args, output):
        name = names.get(id(module))
        if name is not None and stack and stack[-1] == name:
            stack.pop()

    recorder = _Recorder(params, stack, on_attention)
    h1 = nn.modules.module.register_module_forward_pre_hook(enter)
    h2 = nn.modules.module.register_module_forward_hook(leave, always_call=True)
    try:
        with recorder:
            yield recorder
    finally:
        h1.remove()
        h2.remove()


def observe(model: nn.Module, inputs: Any, on_attention: Callable | None = None) -> Observation:
    """Run `model` once on `inputs` (a tensor, a tuple of positional args or a dict of kwargs) and
    record parameter usage and attention calls. No grad, eval mode (restored after), buffers restored."""
    was_training = {m: m.training for m in model.modules()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    obs = None
    try:
        model.eval()
        with torch.no_grad(), recording(model, on_attention) as recorder:
            obs = recorder.obs
            call_model(model, inputs)
    except Exception as e:  # the probe is best effort; the caller decides what a failure means
        first = str(e).splitlines()[0] if str(e) else ""
        obs = obs or Observation()
        obs.error = f"{type(e).__name__}: {first[:300]}"
    finally:
        for m, t in was_training.items():
            m.training = t
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
    obs.inputs = inputs
    return obs


def call_model(model: nn.Module, inputs: Any):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


# --------------------------------------------------------------------------- example inputs


def example_inputs(model: nn.Module) -> list[Any]:
    """Candidate inputs for a probe forward, best first (each tried until one runs).

    Hugging Face models: built from ``main_input_name`` and the config (token ids, or images
    of the configured size; encoder-decoders get decoder ids too). timm models: their
    ``pretrained_cfg['input_size']``. Anything else: from the first layer that takes the input
    (an embedding → token ids; a Linear → features; a Conv → images of 32 pixels a side).
    """
    params = list(model.parameters())
    device = module_device(model)
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    out: list[Any] = []
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    if config is not None and main is not None:

        def get(k, d=None):
            return getattr(config, k, d)

        text = getattr(config, "get_text_config", lambda **kw: config)()
        if main == "input_ids":
            vocab = getattr(text, "vocab_size", None) or 32
            ids = torch.randint(0, min(int(vocab), 64), (1, 8), device=device)
            cand = {"input_ids": ids}
            if get("is_encoder_decoder", False):
                cand["decoder_input_ids"] = ids.clone()
            out.append(cand)
        elif main == "pixel_values":
            size = get("image_size", 32)
            size = size if isinstance(size, int) else (size[0] if isinstance(size, (list, tuple)) else 32)
            out.append(
                {"pixel_values": torch.randn(1, int(get("num_channels", 3)), size, size, device=device, dtype=dtype)}
            )
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("input_size"), (tuple, list)):
        size = tuple(int(s) for s in cfg["input_size"])
        img = getattr(model, "patch_embed", None)
        img_size = getattr(img, "img_size", None)
        if isinstance(img_size, (tuple, list)) and len(size) == 3:
            size = (size[0], int(img_size[0]), int(img_size[1]))
        out.append(torch.randn(1, *size, device=device, dtype=dtype))
    first = next(
        (
            m
            for m in model.modules()
            if isinstance(m, (nn.Embedding, nn.Linear, nn.modules.conv._ConvNd)) or type(m).__name__ == "Conv1D"
        ),
        None,
    )
    if isinstance(first, nn.Embedding):
        out.append(torch.randint(0, min(first.num_embeddings, 64), (1, 8), device=device))
    elif isinstance(first, nn.Linear):
        out += [
            torch.randn(2, first.in_features, device=device, dtype=dtype),
            torch.randn(1, 8, first.in_features, device=device, dtype=dtype),
        ]
    elif isinstance(first, nn.modules.conv._ConvNd):
        spatial = len(first.kernel_size)
        out.append(torch.randn(1, first.in_channels, *([32] * spatial), device=device, dtype=dtype))
    return out


def observe_model(model: nn.Module, inputs: Any = None) -> Observation:
    """`observe` with the given inputs, or with the first candidate of `example_inputs` that runs."""
    if inputs is not None:
        return observe(model, to_device(inputs, model))
    candidates = example_inputs(model)
    if not candidates:
        return Observation(error="no example inputs could be made for it")
    errors = []
    for cand in candidates:
        obs = observe(model, cand)
        if obs.ran:
            return obs
        errors.append(obs.error)
    return Observation(error="; ".join(dict.fromkeys(e for e in errors if e)))


def to_device(inputs, model: nn.Module):
    """`inputs` (a tensor, or tuples, lists, dicts of them) moved to `model`'s device (as they are
    for a model without parameters)."""
    if next(model.parameters(), None) is None:
        return inputs
    return move(inputs, module_device(model))
