"""Which torch functions do what, for the recorder: the op tables and the pure dim bookkeeping.

Each table names torch functions (as `op_name` spells them) by what they do to a tensor's dims
(permute, reshape, split, keep the shape, combine elementwise, contract, normalise) and, for
attention logits, which ones leave a tensor's forward constant unchanged (`CONSTANT_SAME`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .observation import Dims

__all__ = [
    "CONSTANT_SAME",
    "CONV",
    "ELEMENTWISE",
    "MATMUL",
    "MATMUL_ADD",
    "NORMS",
    "PERMUTE",
    "RESHAPE",
    "SAME_SHAPE",
    "SOFTMAX",
    "SPLIT",
    "add_operands",
    "einsum_labels",
    "op_name",
    "reshape_dims",
    "tensors_in",
]

PERMUTE = {"t", "T", "mT", "transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis"}
SAME_SHAPE = {
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
RESHAPE = {
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
SPLIT = {"chunk", "split", "tensor_split", "split_with_sizes", "unsafe_chunk", "unsafe_split", "narrow"}
ELEMENTWISE = {
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
MATMUL = {"matmul", "mm", "bmm", "mv", "dot", "inner", "_grouped_mm", "grouped_mm"}  # grouped: (tokens, k) × (E, k, n)
MATMUL_ADD = {"baddbmm", "addmm", "addbmm", "addmv"}  # (input, A, B)
NORMS = {"layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "normalize", "local_response_norm"}
SOFTMAX = {"softmax", "log_softmax", "_softmax", "softmin"}
CONV = {
    "conv1d": False,
    "conv2d": False,
    "conv3d": False,
    "conv_transpose1d": True,
    "conv_transpose2d": True,
    "conv_transpose3d": True,
}
# Forward-constant algebra for attention logits: ops whose output carries its input's constant unchanged.
CONSTANT_SAME = {
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


def op_name(func: Any) -> str:
    """The name a torch function goes by in the tables (dunder and in-place spellings folded: ``__iadd__`` → ``add``)."""
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


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors in `obj` (a tensor, or nested lists/tuples of them), in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    return []


# --------------------------------------------------------------------------- the mode


def add_operands(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
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


def einsum_labels(sub: str, ndim: int) -> list[str]:
    """The labels of one einsum operand, an ellipsis expanded to ``.0``, ``.1``, … for `ndim` dims."""
    if "..." not in sub:
        return list(sub)
    head, _, tail = sub.partition("...")
    n = max(ndim - len(head) - len(tail), 0)
    return list(head) + [f".{i}" for i in range(n)] + list(tail)


def reshape_dims(src: tuple[int, ...], dst: tuple[int, ...], dims: Dims) -> Dims | None:
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
