"""u-µP's unit rules for the ops between two layers: which nonlinearity feeds which layer, observed.

Unit scaling asks every op's output to have unit scale when its input does. A matmul gets its scale
from the rules table (`rules.UMUP`'s forward column); a norm is unit already; the ops in between —
a nonlinearity ``f`` (GELU, SiLU, ReLU, …) or a gated unit ``f(g)·u`` (SwiGLU) — need a constant
that depends on ``f``. This module finds them on one probe forward (a `TorchFunctionMode` that
follows each layer's output to the next layer's input, through views, casts and dropout) and
computes each constant by quadrature:

- u-µP's α_ffn_act scales the nonlinearity's input: ``f_α(x) = f(α·x)/α`` (so α → 0 is the linear
  part of GELU/SiLU, and ReLU does not depend on α);
- its output is divided by ``σ_α = √E[f_α(z)²]`` for z ~ N(0, 1) (with a unit gate partner u of a
  gated unit the same: E[(f_α(z)·u)²] = E[f_α(z)²]), computed by Gauss–Hermite quadrature with the
  model's own torch function (its keyword arguments included: GELU's ``approximate``).

Both fold into layers (so `mt.export` can take them out): α onto the output of the layer that feeds
``f`` (its only use), ``1/(α·σ_α)`` onto the input of the layer that reads ``f``'s output. An op on
the way that is not a view, a cast, dropout, a known nonlinearity or a gate product has no unit rule
here: it is named (`UnitOps.unknown`) and parametrize warns, leaving that layer's input unscaled.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .naming import canonical_name
from .observe import call_model, probe_mode
from .op_tables import RESHAPE, SPLIT, op_name, tensors_in

__all__ = [
    "ACTIVATIONS",
    "WRITTEN_OUT",
    "ActivationUse",
    "AttentionUse",
    "UnitOps",
    "activation_scale",
    "attention_output_scale",
    "find_unit_ops",
]

# Elementwise nonlinearities with a unit rule (the torch function is evaluated by quadrature).
ACTIVATIONS = {
    "relu",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "mish",
    "softplus",
    "hardswish",
    "hardsigmoid",
    "relu6",
    "hardtanh",
}
_CASTS = {"contiguous", "clone", "detach", "to", "float", "half", "bfloat16", "double", "type_as", "type", "alias"}
_TRANSPARENT = _CASTS | RESHAPE | SPLIT | {"getitem", "dropout", "permute", "transpose", "t", "movedim"}
_PRODUCT = {"mul", "rmul"}
_ARG_KEYS = ("approximate", "negative_slope", "alpha", "beta", "threshold", "min_val", "max_val")


@dataclass(frozen=True)
class ActivationUse:
    """A layer whose input is a nonlinearity of another layer's output (times a third's: a gated unit)."""

    consumer: str  # the layer that reads f(gate) (· up)
    function: str  # the torch function's name: "gelu", "silu", …
    gate: str  # the layer whose output f is applied to
    up: str | None = None  # the gated unit's other factor (SwiGLU's up projection), if any
    kwargs: tuple[tuple[str, Any], ...] = ()  # the call's keyword arguments that change f (GELU's approximate)


@dataclass(frozen=True)
class AttentionUse:
    """A layer whose input is the output of ``F.scaled_dot_product_attention`` (the attention's
    output projection), with what the attention's output scale depends on at the probe."""

    consumer: str  # the layer that reads the attention's output (its o-projection)
    source: str  # the layer the values come from
    scale: float  # √(mean over queries of 1/visible keys): the output RMS of uniform attention at the probe
    keys: int  # the key length at the probe
    causal: bool  # is_causal (or a boolean mask) at the probe


@dataclass
class UnitOps:
    """What the u-µP probe found: the nonlinearities between layers, the attention outputs, and ops
    without a unit rule."""

    activations: list[ActivationUse] = field(default_factory=list)
    attention: list[AttentionUse] = field(default_factory=list)
    unknown: dict[str, list[str]] = field(default_factory=dict)  # consumer layer → ops on its input path
    error: str | None = None  # why the probe did not run


@dataclass(frozen=True)
class _Tag:
    source: str  # the layer whose output this is a function of
    acts: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    up: str | None = None
    unknown: tuple[str, ...] = ()
    attention: tuple[float, int, bool] | None = None  # an SDPA output: (uniform-attention RMS, keys, causal)
    origin: int = -1  # the index of the source layer's output in `_Follow.origins` (-1: none kept)


def attention_output_scale(queries: int, keys: int, causal: bool, mask: torch.Tensor | None = None) -> float:
    """The RMS of the output of softmax attention that is uniform over the visible keys, for values
    of unit RMS independent across positions: ``√(mean over queries of 1/n_visible)``.

    At u-µP's init the logits are ``α·q·k/d_head`` with unit q, k: their std is α/√d_head, small, so
    the softmax is close to uniform and averages ``n_visible`` independent values: RMS 1/√n_visible.
    A causal mask (``is_causal``, top-left aligned as torch's) lets query i see min(i + 1, keys) keys —
    for self-attention of length T the mean is H_T/T (H_T the harmonic number); no mask: 1/keys.

    Args:
        queries: the query length.
        keys: the key length.
        causal: ``is_causal`` of the call.
        mask: a boolean ``attn_mask`` (True = attend), or None; its visible counts replace the rule.

    Returns:
        The RMS (in (0, 1]); u-µP divides the attention's output by it.
    """
    if mask is not None and mask.dtype == torch.bool:
        counts = mask.reshape(-1, mask.shape[-1]).sum(-1).double().clamp(min=1)
        return float((1.0 / counts).mean().sqrt())
    if causal:
        counts = torch.arange(1, queries + 1, dtype=torch.float64).clamp(max=keys)  # torch: top-left causal
        return float((1.0 / counts).mean().sqrt())
    return 1.0 / math.sqrt(max(keys, 1))


def _is_layer(module: nn.Module) -> bool:
    return not list(module.children()) and isinstance(module._parameters.get("weight"), torch.Tensor)


class _Follow(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[int, tuple[Any, _Tag]] = {}
        self.origins: list[torch.Tensor] = []
        self.candidates: dict[int, dict[int, torch.Tensor]] = {}

    def tag(self, t: Any, tag: _Tag) -> None:
        for x in tensors_in(t):
            try:
                ref: Any = weakref.ref(x)
            except TypeError:
                ref = x
            self.tags[id(x)] = (ref, tag)

    def get(self, t: torch.Tensor) -> _Tag | None:
        hit = self.tags.get(id(t))
        if hit is None:
            return None
        ref, tag = hit
        alive = ref() if isinstance(ref, weakref.ref) else ref
        return tag if alive is t else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = op_name(func)
        ins = [t for t in tensors_in(list(args)) + tensors_in(list(kwargs.values()))]
        tagged = [(t, tag) for t in ins if (tag := self.get(t)) is not None]
        if not tagged or name in ("linear", "conv1d", "conv2d", "conv3d", "embedding"):
            return out
        if name == "scaled_dot_product_attention":
            value = args[2] if len(args) > 2 else kwargs.get("value")
            vtag = self.get(value) if isinstance(value, torch.Tensor) else None
            query = args[0] if args else kwargs.get("query")
            mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
            causal = bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False))
            if vtag is not None and isinstance(query, torch.Tensor) and isinstance(out, torch.Tensor):
                if mask is None or (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool):
                    q_len, k_len = query.shape[-2], value.shape[-2]
                    rms = attention_output_scale(q_len, k_len, causal, mask)
                    self.tag(out, _Tag(vtag.source, attention=(rms, k_len, causal or mask is not None), origin=-1))
                else:  # an additive float mask: no rule (its values decide the averaging)
                    self.tag(out, _Tag(vtag.source, unknown=("scaled_dot_product_attention (float mask)",)))
            return out
        first, tag = tagged[0]
        outs = tensors_in(out)
        if tag.attention is not None and name not in _TRANSPARENT:
            return out  # an attention output feeds a layer only through views
        if name in _TRANSPARENT:
            if args and args[0] is first:
                self.tag(out, tag)
        elif name in ACTIVATIONS and args and args[0] is first:
            extra = tuple((k, kwargs[k]) for k in _ARG_KEYS if k in kwargs and not isinstance(kwargs[k], torch.Tensor))
            extra += tuple((f"arg{i}", a) for i, a in enumerate(args[1:], 1) if isinstance(a, (int, float, str)))
            self.tag(out, _Tag(tag.source, tag.acts + ((name, extra),), tag.up, tag.unknown, origin=tag.origin))
        elif self._written_out(name, tagged, out):
            pass
        elif name in _PRODUCT and len(tagged) == 2:
            (_, a), (_, b) = tagged
            act, lin = (a, b) if a.acts and not b.acts else (b, a) if b.acts and not a.acts else (None, None)
            if (
                act is not None
                and lin is not None
                and act.up is None
                and not lin.unknown
                and (act.source != lin.source or act.origin != lin.origin)  # f(g)·g is no gated unit
            ):
                self.tag(out, _Tag(act.source, act.acts, lin.source, act.unknown))
            else:
                self._composed(name, ins, tagged, out)
        elif self._composed(name, ins, tagged, out):
            pass
        elif (
            len(ins) == 1
            and len(outs) == 1
            and outs[0].shape == first.shape
            and name not in ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "normalize")
        ):
            self.tag(out, _Tag(tag.source, tag.acts, tag.up, tag.unknown + (name,), origin=tag.origin))
        return out

    def _composed(self, name: str, ins: list, tagged: list, out: Any) -> bool:
        """An op combining several tensors that are all functions of one layer's output (a nonlinearity written
        out, as Hugging Face's ``NewGELUActivation``: x·(1 + tanh(c·(x + 0.044715·x³)))/2): its output carries
        the op as one without a unit rule, so the layer reading it is named (not silently left unscaled)."""
        if len(ins) < 2 or len(tagged) != len(ins) or len({tag.source for _, tag in tagged}) != 1:
            return False
        if any(tag.attention is not None or tag.up is not None for _, tag in tagged):
            return False
        acts = max((tag.acts for _, tag in tagged), key=len)
        unknown = tuple(dict.fromkeys(u for _, tag in tagged for u in tag.unknown + tuple(a for a, _ in tag.acts)))
        self.tag(out, _Tag(tagged[0][1].source, acts, None, unknown + (name,), origin=tagged[0][1].origin))
        return True

    def origin(self, out: torch.Tensor) -> int:
        """Keep a layer's output (the probe's value of a nonlinearity's input), for `_written_out`."""
        self.origins.append(out)
        return len(self.origins) - 1

    def _written_out(self, name: str, tagged: list, out: Any) -> bool:
        """An elementwise op whose output equals a known nonlinearity of one layer's output, on the probe's
        values: a nonlinearity written out in elementary ops (Hugging Face GPT-2's ``NewGELUActivation``,
        ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, is ``gelu(approximate="tanh")``; ``x·sigmoid(x)`` is
        ``silu``). Observed, not pattern-matched: the output is compared with each candidate of
        `WRITTEN_OUT` evaluated on the layer's output, and the closest within float tolerance is taken."""
        if not isinstance(out, torch.Tensor) or (name in _PRODUCT and len(tagged) == 1 and not tagged[0][1].unknown):
            return False  # a plain product of a layer's output with a constant is no nonlinearity
        first = tagged[0][1]
        if first.origin < 0 or any(
            t.origin != first.origin or t.attention is not None or t.up is not None for _, t in tagged
        ):
            return False
        fn = _match_nonlinearity(self.origins[first.origin], out, self.candidates.setdefault(first.origin, {}))
        if fn is None:
            return False
        self.tag(out, _Tag(first.source, (fn,), None, (), origin=first.origin))
        return True


# Nonlinearities recognised when written out in elementary ops (`_Follow._written_out`), in order of preference.
WRITTEN_OUT: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    ("gelu", (("approximate", "tanh"),)),
    ("gelu", ()),
    ("silu", ()),
    ("mish", ()),
)


def _match_nonlinearity(
    x: torch.Tensor, out: torch.Tensor, cache: dict[int, torch.Tensor]
) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """The entry of `WRITTEN_OUT` that `out` equals elementwise as a function of `x` (None: none does)."""
    if out.shape != x.shape or not out.is_floating_point() or out.is_meta or x.is_meta or x.numel() < 8:
        return None
    xd = x.detach().double()
    scale = float(xd.abs().max())
    if not scale > 0 or not math.isfinite(scale):
        return None
    o = out.detach().double()
    tol = 64 * torch.finfo(out.dtype).eps  # relative to the input's largest value: scale-free (a 0.02 init's tiny
    # pre-activations still show GELU's curvature, 0.4·x², far above float error)

    def err(want: torch.Tensor) -> float:
        return float((o - want).abs().max()) / scale

    if err(xd / 2) <= tol:  # indistinguishable from the linear part every candidate shares near 0
        return None
    best: tuple[float, int] | None = None
    for i, (fn, kwargs) in enumerate(WRITTEN_OUT):
        if i not in cache:
            cache[i] = _function(fn)(xd, **dict(kwargs))
        e = err(cache[i])
        if e <= tol and (best is None or e < best[0]):
            best = (e, i)
    return None if best is None else WRITTEN_OUT[best[1]]


def find_unit_ops(model: nn.Module, inputs: Any) -> UnitOps:
    """Run `model` once on `inputs` (no grad, eval mode) and find the nonlinearities between its layers.

    Args:
        model: the model, before parametrize changes anything (meta tensors are fine: no value is read).
        inputs: the probe inputs parametrize ran (``Observation.inputs``).

    Returns:
        The `UnitOps`; ``error`` set (and nothing found) when the forward could not run.
    """
    follow = _Follow()
    found: dict[str, ActivationUse] = {}
    attention: dict[str, AttentionUse] = {}
    unknown: dict[str, list[str]] = {}
    names = {id(m): canonical_name(n) for n, m in model.named_modules()}
    layers = [m for m in model.modules() if _is_layer(m)]

    def pre(module, args):
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        tag = follow.get(x) if x is not None else None
        if tag is None:
            return
        me = names[id(module)]
        if tag.attention is not None:
            if me not in attention:
                rms, keys, causal = tag.attention
                attention[me] = AttentionUse(me, tag.source, rms, keys, causal)
        elif tag.unknown:
            unknown.setdefault(me, [])
            unknown[me] += [u for u in tag.unknown if u not in unknown[me]]
        elif len(tag.acts) == 1 and me not in found:
            fn, extra = tag.acts[0]
            found[me] = ActivationUse(me, fn, tag.source, tag.up, extra)
        elif len(tag.acts) > 1:
            unknown.setdefault(me, []).append(" then ".join(a for a, _ in tag.acts))

    def post(module, args, out):
        if isinstance(out, torch.Tensor):
            follow.tag(out, _Tag(names[id(module)], origin=follow.origin(out)))

    hooks = [m.register_forward_pre_hook(pre) for m in layers] + [m.register_forward_hook(post) for m in layers]
    result = UnitOps()
    try:
        with probe_mode(model), follow:
            call_model(model, inputs)
    except Exception as e:  # the probe is best effort: parametrize decides what a failure means
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        return result
    finally:
        for h in hooks:
            h.remove()
    result.activations = list(found.values())
    result.attention = list(attention.values())
    result.unknown = unknown
    return result


_NODES = 96


@functools.lru_cache(maxsize=256)
def activation_scale(function: str, alpha: float = 1.0, kwargs: tuple[tuple[str, Any], ...] = ()) -> float:
    """σ_α = √E[f_α(z)²], z ~ N(0, 1), f_α(x) = f(α·x)/α: what u-µP divides the nonlinearity's output by.

    Args:
        function: the name of a function of `torch.nn.functional` (or torch): "gelu", "silu", "relu", ….
        alpha: α_ffn_act (> 0).
        kwargs: keyword arguments of the call (GELU's ``approximate``); ``argN`` keys are positional.

    Returns:
        σ_α, by Gauss–Hermite quadrature (96 nodes, float64): exact to ~1e-6 for these functions.

    Raises:
        ValueError: alpha is not positive, or `function` is not a known nonlinearity.
    """
    if not alpha > 0:
        raise ValueError(f"alpha_ffn_act must be a positive number, got {alpha!r}")
    f = _function(function)
    z, w = np.polynomial.hermite_e.hermegauss(_NODES)  # weight exp(-z²/2)
    x = torch.tensor(z * alpha, dtype=torch.float64)
    positional = [v for k, v in sorted(kwargs) if k.startswith("arg")]
    named = {k: v for k, v in kwargs if not k.startswith("arg")}
    y = f(x, *positional, **named).numpy() / alpha
    mean_sq = float(np.sum(w * y * y) / math.sqrt(2 * math.pi))
    return math.sqrt(mean_sq)


def _function(name: str) -> Callable[..., torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"no unit rule for '{name}'; known nonlinearities: {', '.join(sorted(ACTIVATIONS))}")
    f = getattr(torch.nn.functional, name, None) or getattr(torch, name)
    return f
