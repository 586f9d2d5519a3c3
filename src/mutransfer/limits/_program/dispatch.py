"""Which rule each op gets: the dispatch tables. A graph node calls a module (`MODULES`, by
class), a tensor method (`METHODS`, by name) or a function (`FUNCTIONS`, by the function
object; ATen ops of a torch.export graph arrive as the torch function with the same arguments,
see `trace.ATEN`). Each entry adapts the op's own arguments to its rule in `rules`; an op in no
table raises `NotExact` naming it. To add an op: a rule in the family's module under `rules/`,
its entry here, and a test against neural-tangents or a hand derivation."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._fields import Field
from .context import Pass  # the pass's protocol: the rules do not import `run`
from .rules import elementwise, linear, normalization, pooling, shape
from .values import scalar, side

__all__ = ["FUNCTIONS", "METHODS", "MODULES", "function", "method", "module", "size"]

size = shape.size

FunctionRule = Callable[["Pass", Any, Any], Any]  # (run, args, kwargs) → value
ModuleRule = Callable[["Pass", Any, Any], Any]  # (run, module, x) → value

# ---- activations: the name each nonlinearity has in `rules.elementwise.elementwise` -----------------

MODULE_ACTIVATIONS: dict[type, str] = {  # matched on the exact class
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
MODULE_ACTIVATION_ATTRS: dict[type, tuple[str, ...]] = {  # the module attributes its function reads
    nn.LeakyReLU: ("negative_slope",),
    nn.ELU: ("alpha",),
    nn.CELU: ("alpha",),
    nn.GELU: ("approximate",),
    nn.Softplus: ("beta", "threshold"),
    nn.Hardtanh: ("min_val", "max_val"),
}
FUNCTION_ACTIVATIONS: dict[Callable[..., Any], str] = {
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
POSITIONAL: dict[str, tuple[str, ...]] = {  # the names of an activation function's positional arguments
    "leaky_relu": ("negative_slope",),
    "softplus": ("beta", "threshold"),
    "hardtanh": ("min_val", "max_val"),
    "elu": ("alpha",),
    "celu": ("alpha",),
    "gelu": ("approximate",),
}
METHOD_ACTIVATIONS: dict[str, str] = {
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "erf": "erf",
    "abs": "abs",
    "sin": "sin",
    "cos": "cos",
    "exp": "exp",
}


def _named(args: tuple, kwargs: dict, names: tuple[str, ...]) -> dict:
    """Positional `args` under `names`, then the keyword arguments."""
    vals = dict(zip(names, args))
    vals.update(kwargs)
    return vals


# ---- functions ---------------------------------------------------------------------------------


def _activation(name: str) -> FunctionRule:
    def rule(run: Pass, args: Any, kwargs: Any) -> Any:
        return elementwise.activate(run, args[0], name, **_named(args[1:], kwargs, POSITIONAL.get(name, ())))

    return rule


def _clamp(names: tuple[str, ...]) -> FunctionRule:
    def rule(run: Pass, args: Any, kwargs: Any) -> Any:
        kw = _named(args[1:], kwargs, names)
        return elementwise.clamp(run, args[0], kw.get("min"), kw.get("max"))

    return rule


def _pow(run: Pass, args: Any, kwargs: Any) -> Any:
    return elementwise.power(run, args[0], args[1] if len(args) > 1 else kwargs.get("exponent"))


def _add(sign: float) -> FunctionRule:
    def rule(run: Pass, args: Any, kwargs: Any) -> Any:
        return elementwise.add(run, args[0], args[1], 1.0, sign * float(kwargs.get("alpha", 1)))

    return rule


def _div(run: Pass, args: Any, kwargs: Any) -> Any:
    s = scalar(args[1])
    if s is None or isinstance(args[1], Field):
        run.fail("division by a tensor has no rule")
    return elementwise.scale(run, args[0], 1.0 / s)


def _linear(run: Pass, args: Any, kwargs: Any) -> Any:
    return linear.linear(run, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"))


def _conv(run: Pass, args: Any, kwargs: Any) -> Any:
    x, w = args[0], args[1]
    names = ("bias", "stride", "padding", "dilation", "groups")
    vals = dict(zip(names, list(args[2:]) + [None] * 5))
    vals.update({k: v for k, v in kwargs.items() if k in names})
    nd = w.ndim - 2

    def tup(v: Any, default: int) -> tuple:
        return tuple(v) if isinstance(v, (tuple, list)) else (v if v is not None else default,) * nd

    pad = vals["padding"] if isinstance(vals["padding"], str) else tup(vals["padding"], 0)
    return linear.conv(
        run,
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


def _reshape(fn: Callable[..., Any]) -> FunctionRule:
    def rule(run: Pass, args: Any, kwargs: Any) -> Any:
        rest = [side(a, 0) for a in args[1:]]
        kw = {k: side(v, 0) for k, v in kwargs.items()}
        return shape.reshape_like(run, args[0], lambda t: fn(t, *rest, **kw))

    return rule


def _reduce(how: str) -> FunctionRule:
    def rule(run: Pass, args: Any, kwargs: Any) -> Any:
        return pooling.reduce(run, args[0], how, *args[1:], **kwargs)

    return rule


def _avg_pool(run: Pass, args: Any, kwargs: Any) -> Any:
    names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
    vals = _named(args[1:], kwargs, names)
    if vals.get("ceil_mode") or vals.get("divisor_override"):
        run.fail("avg_pool with ceil_mode or divisor_override has no rule")
    return pooling.avg_pool(
        run,
        args[0],
        vals["kernel_size"],
        vals.get("stride") or vals["kernel_size"],
        vals.get("padding", 0),
        vals.get("count_include_pad", True),
    )


def _adaptive_pool(run: Pass, args: Any, kwargs: Any) -> Any:
    return pooling.adaptive_pool(run, args[0], args[1] if len(args) > 1 else kwargs["output_size"])


def _pad(run: Pass, args: Any, kwargs: Any) -> Any:
    vals = _named(args[1:], kwargs, ("pad", "mode", "value"))
    return pooling.pad(run, args[0], vals["pad"], vals.get("mode", "constant") or "constant", vals.get("value"))


def _layer_norm(run: Pass, args: Any, kwargs: Any) -> Any:
    vals = _named(args[1:], kwargs, ("normalized_shape", "weight", "bias", "eps"))
    return normalization.layer_norm(
        run, args[0], vals["normalized_shape"], vals.get("weight"), vals.get("bias"), vals.get("eps", 1e-5)
    )


def _getattr(run: Pass, args: Any, kwargs: Any) -> Any:
    if isinstance(args[0], Field):
        if args[1] == "shape":
            return shape.size(run, args[0])
        run.fail(f"attribute .{args[1]} of a width tensor has no rule")
    _no_rule(run, getattr)


def _getitem(run: Pass, args: Any, kwargs: Any) -> Any:
    if isinstance(args[0], Field):
        run.fail("indexing or slicing a width tensor has no rule")
    _no_rule(run, operator.getitem)


def _no_rule(run: Pass, fn: Any) -> Any:
    name = getattr(fn, "__name__", repr(fn))
    run.fail(f"no exact rule for {name} on a width tensor")


def _table() -> dict[Any, FunctionRule]:
    table: dict[Any, FunctionRule] = {}

    def put(fns: tuple, rule: FunctionRule) -> None:
        for fn in fns:
            table.setdefault(fn, rule)  # the first family that names a function keeps it

    for fn, name in FUNCTION_ACTIVATIONS.items():
        put((fn,), _activation(name))
    # elementwise
    put((torch.clamp, torch.clip), _clamp(("min", "max")))
    put((torch.clamp_min,), _clamp(("min",)))
    put((torch.clamp_max,), _clamp(("max",)))
    put((operator.pow, torch.pow), _pow)
    put((torch.square,), lambda run, args, kwargs: elementwise.power(run, args[0], 2))
    put((torch.sign,), lambda run, args, kwargs: elementwise.activate(run, args[0], "sign"))
    put((operator.add, torch.add, operator.iadd), _add(1.0))
    put((operator.sub, torch.sub, operator.isub), _add(-1.0))
    put((operator.mul, torch.mul, operator.imul), lambda run, args, kwargs: elementwise.mul(run, args[0], args[1]))
    put((operator.truediv, torch.div, operator.itruediv), _div)
    put((operator.neg, torch.neg), lambda run, args, kwargs: elementwise.scale(run, args[0], -1.0))
    put((F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout), lambda run, args, kwargs: args[0])
    # linear
    put((F.linear,), _linear)
    put((F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d), _conv)
    # shape
    put((torch.flatten,), lambda run, args, kwargs: shape.flatten(run, args[0], *(args[1:]), **kwargs))
    for fn in (torch.reshape, torch.permute, torch.transpose, torch.squeeze, torch.unsqueeze, torch.swapaxes):
        put((fn,), _reshape(fn))
    put((torch.movedim,), _reshape(torch.movedim))
    put(
        (torch.cat, torch.concat, torch.concatenate),
        lambda run, args, kwargs: shape.cat(run, args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0)),
    )
    # reductions and pooling
    put((torch.mean,), _reduce("mean"))
    put((torch.sum,), _reduce("sum"))
    put((F.avg_pool1d, F.avg_pool2d, F.avg_pool3d), _avg_pool)
    put((F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d), _adaptive_pool)
    put((F.pad,), _pad)
    # normalisation
    put((F.layer_norm,), _layer_norm)
    # attributes and indexing
    put((getattr,), _getattr)
    put((operator.getitem,), _getitem)
    return table


FUNCTIONS: dict[Any, FunctionRule] = _table()


def function(run: Pass, fn: Any, args: Any, kwargs: Any) -> Any:
    """The value of `fn(*args, **kwargs)` where a width tensor is among the arguments."""
    rule = FUNCTIONS.get(fn)
    if rule is None:
        return _no_rule(run, fn)
    return rule(run, args, kwargs)


# ---- tensor methods ------------------------------------------------------------------------------

METHOD_IDENTITY = frozenset({"contiguous", "float", "double", "clone", "detach", "to"})
METHOD_RESHAPE = frozenset(
    {"view", "reshape", "flatten", "permute", "transpose", "unsqueeze", "squeeze", "unflatten", "swapaxes", "movedim"}
)
METHODS: dict[str, Callable[..., Any]] = {  # x.f(*rest) is f(x, *rest)
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
_IN_PLACE = METHOD_ACTIVATIONS.keys() | {"add", "sub", "mul", "div", "neg"}


def method(run: Pass, name: str, args: Any, kwargs: Any) -> Any:
    """The value of `args[0].name(*args[1:], **kwargs)` on a width tensor."""
    x = args[0]
    if name.endswith("_") and not name.startswith("_") and name[:-1] in _IN_PLACE:
        name = name[:-1]  # x.relu_(), x.add_(y): the same value as the out-of-place op
    if name in METHOD_ACTIVATIONS:
        return elementwise.activate(run, x, METHOD_ACTIVATIONS[name])
    if name in METHOD_IDENTITY:
        return x
    if name in METHOD_RESHAPE and isinstance(x, Field):
        rest = [side(a, 0) for a in args[1:]]
        kw = {k: side(v, 0) for k, v in kwargs.items()}
        return shape.reshape_like(run, x, lambda t: getattr(t, name)(*rest, **kw))
    if name == "size" and isinstance(x, Field):
        return shape.size(run, x, *args[1:], **kwargs)
    if name in METHODS:
        return function(run, METHODS[name], args, kwargs)
    run.fail(f"no exact rule for the method .{name}() on a width tensor")


# ---- modules -------------------------------------------------------------------------------------


def _avg_pool_module(run: Pass, m: Any, x: Any) -> Any:
    if m.ceil_mode:
        run.fail("AvgPool with ceil_mode=True has no rule")
    if getattr(m, "divisor_override", None):
        run.fail("AvgPool with divisor_override has no rule")
    return pooling.avg_pool(run, x, m.kernel_size, m.stride, m.padding, m.count_include_pad)


MODULES: list[tuple[tuple[type, ...], ModuleRule]] = [  # matched in order with isinstance
    (
        (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout),
        lambda run, m, x: x,
    ),
    ((nn.Linear,), lambda run, m, x: linear.linear(run, x, m.weight, m.bias)),
    (
        (nn.Conv1d, nn.Conv2d, nn.Conv3d),
        lambda run, m, x: linear.conv(
            run, x, m, m.stride, m.padding, m.dilation, m.groups, m.padding_mode, m.kernel_size, m.bias
        ),
    ),
    ((nn.LayerNorm,), lambda run, m, x: normalization.layer_norm(run, x, m.normalized_shape, m.weight, m.bias, m.eps)),
    ((nn.Flatten,), lambda run, m, x: shape.flatten(run, x, m.start_dim, m.end_dim)),
    ((nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d), _avg_pool_module),
    (
        (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d),
        lambda run, m, x: pooling.adaptive_pool(run, x, m.output_size),
    ),
    ((nn.Unflatten,), lambda run, m, x: shape.reshape_like(run, x, lambda t: m(t))),
]


def module(run: Pass, m: nn.Module, args: Any, kwargs: Any) -> Any:
    """The value of the submodule call `m(*args, **kwargs)` on a width tensor (or on the data,
    for the input layer)."""
    x = args[0] if args else kwargs.get("input")
    name = MODULE_ACTIVATIONS.get(type(m))
    if name is not None:  # activations on their exact class: a subclass may change the function
        kw = {k: getattr(m, k) for k in MODULE_ACTIVATION_ATTRS.get(type(m), ())}
        return elementwise.activate(run, x, name, **kw)
    for classes, rule in MODULES:
        if isinstance(m, classes):
            return rule(run, m, x)
    run.fail(f"no exact rule for {type(m).__name__}")
