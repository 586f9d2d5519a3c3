"""The forward-constant algebra of the recorder, and the attention calls it finds.

A mixin of `recorder._Recorder` (which owns the op dispatch and parameter usage), above `trails`.

**Attention logits.** Each tensor carries a *forward constant*: the product of the constants that multiplied
it since it last came out of a parametrized layer or a normalisation (`linear`, `conv`,
`layer_norm`, ``x * rsqrt(mean(x²))`` — the algebra is tracked, so a hand-written RMSNorm resets it
too). A product of two such activations (``q @ kᵀ``, ``einsum``, ``baddbmm``) is a logit candidate
with the contracted size as head dim; when it reaches a ``softmax`` the call is recorded with its
effective scale (``(q·s)·k·c`` → ``s·c``; additive masks, position biases and ALiBi leave it alone).
``scaled_dot_product_attention`` calls record ``scale`` (or ``1/√d``) times the forward constants of q and k.
A constant baked into a weight's init (T5 puts its 1/√d there) is not a forward constant: the
scale of such a model is 1.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .observation import AttentionCall
from .op_tables import CONSTANT_SAME, CONV, MATMUL, MATMUL_ADD, NORMS, SOFTMAX, add_operands, tensors_in
from .trails import Trails

__all__ = ["Scales"]


class Scales(Trails):
    """Forward constants carried by tensors, and the attention calls whose logit scale they give."""

    constants: dict[int, tuple[weakref.ref, float, int | None]]
    _p: Callable[[Any], tuple[str, Any] | None]  # the recorder's parameter provenance

    def _constant(self, t) -> tuple[float, int | None]:
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            return float(t), None
        if not isinstance(t, torch.Tensor):
            return 1.0, None
        entry = self.constants.get(id(t))
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
            and id(t) not in self.params
            and id(t) not in self.constants
            and self._p(t) is None
            and not t.requires_grad
        ):
            if t.is_meta:  # a constant held in a buffer of a meta model: its value cannot be read
                self.obs.unreadable_constants = True
                return None
            try:
                return float(t)
            except (RuntimeError, ValueError):
                return None
        return None

    def _set_constant(self, t, scale: float, logit_dim: int | None = None) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if scale == 1.0 and logit_dim is None:
            self.constants.pop(id(t), None)
            return
        try:
            self.constants[id(t)] = (weakref.ref(t), scale, logit_dim)
        except TypeError:
            pass

    # ------------------------------------------------------------ forward constants and attention logit scales
    def _track_constants(self, name: str, args, kwargs, out) -> None:
        if name == "scaled_dot_product_attention":
            q = args[0] if args else kwargs.get("query")
            k = args[1] if len(args) > 1 else kwargs.get("key")
            scale = args[6] if len(args) > 6 else kwargs.get("scale")
            d = q.shape[-1]
            base = float(scale) if scale is not None else 1.0 / math.sqrt(d)
            causal = bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False))
            # q and k already carry their own constants: q·kᵀ still needs only SDPA's own scale
            effective = base * self._constant(q)[0] * self._constant(k)[0]
            sources = (self._origin(q), self._origin(k))
            self._attention("sdpa", d, effective, q, k, causal=causal, remaining=base, sources=sources)
            return
        if name in SOFTMAX:
            x = args[0] if args else kwargs.get("input")
            s, logit_dim = self._constant(x)
            if logit_dim is not None:
                sources = self._sources(x)
                self._attention("eager", logit_dim, s, None, None, logits=self._logit_term(x), sources=sources)
                if isinstance(out, torch.Tensor):
                    self.probs[id(out)] = weakref.ref(out)
            return
        if name in ("linear", "embedding") or name in CONV or name in NORMS:
            return  # a parametrized layer or a normalisation: its output starts at scale 1
        if name in MATMUL or name == "rmatmul" or name in MATMUL_ADD or name == "einsum":
            self._constant_product(name, args, kwargs, out)
            return
        if name in ("mul", "rmul", "div", "rdiv"):
            a, b = (args[0], args[1]) if len(args) >= 2 else (args[0], kwargs.get("other"))
            (sa, la), (sb, lb) = self._constant(a), self._constant(b)
            ca, cb = self._const(a), self._const(b)
            if name in ("mul", "rmul"):
                sa = ca if ca is not None and not isinstance(a, torch.Tensor) else sa
                sb = cb if cb is not None else sb
                self._set_constant(out, sa * sb, la if la is not None else lb)
            elif name == "div":
                sb = cb if cb is not None else sb
                if sb:
                    self._set_constant(out, sa / sb, la)
            else:  # rdiv: b / a
                if sa:
                    self._set_constant(out, (cb if cb is not None else sb) / sa, None)
            return
        if name in ("add", "sub", "radd", "rsub"):
            a, b = (args[0], args[1]) if len(args) >= 2 else (args[0], kwargs.get("other"))
            candidates = [
                self._constant(x)
                for x in (a, b)
                if isinstance(x, torch.Tensor) and id(x) in self.constants and self.constants[id(x)][0]() is x
            ]
            if candidates:
                logit = next((c for c in candidates if c[1] is not None), candidates[0])
                self._set_constant(out, logit[0], logit[1])
            return
        if name in ("pow", "square", "sqrt", "rsqrt", "reciprocal", "var", "std"):
            s, _ = self._constant(args[0] if args else None)
            if s == 1.0:
                return
            power = {"square": 2.0, "sqrt": 0.5, "rsqrt": -0.5, "reciprocal": -1.0, "var": 2.0, "std": 1.0}.get(name)
            if name == "pow":
                e = args[1] if len(args) > 1 else kwargs.get("exponent")
                power = float(e) if isinstance(e, (int, float)) else None
            if power is not None:
                self._set_constant(out, s**power)
            return
        if name in CONSTANT_SAME:
            src = args[0] if args else None
            if isinstance(src, (list, tuple)):  # cat/stack
                scales = [self._constant(x) for x in src]
                s, ld = scales[0] if scales else (1.0, None)
            else:
                s, ld = self._constant(src)
            if s != 1.0 or ld is not None:
                for o in tensors_in(out):
                    self._set_constant(o, s, ld)

    def _constant_product(self, name: str, args, kwargs, out) -> None:
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
        elif name in MATMUL_ADD:
            _, a, b = add_operands(name, args, kwargs)
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
        (sa, la), (sb, lb) = self._constant(a), self._constant(b)
        if la is not None or lb is not None:
            return  # attention weights × values: not a logit
        self._set_constant(out, alpha * sa * sb, d)
        self._set_sources(out, (self._origin(a), self._origin(b)))

    def _attention(
        self,
        kind: str,
        d: int,
        scale: float,
        q,
        k,
        logits=None,
        causal: bool = False,
        remaining: float | None = None,
        sources: tuple[str | None, str | None] = (None, None),
    ) -> None:
        call = AttentionCall(self._module(), kind, int(d), float(scale), sources[0], sources[1])
        self.obs.attention.append(call)
        self.obs.logit_origins |= {o for o in sources if o is not None}
        if self.on_attention is None:
            return
        if remaining is None:
            self.on_attention(call, q, k, logits, causal)
        else:
            self.on_attention(call, q, k, logits, causal, scale=remaining)
