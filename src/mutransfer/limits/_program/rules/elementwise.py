"""Elementwise ops on width tensors: nonlinearities (closed forms for relu, erf, the step and
their relatives; any other function through Mehler's series or quadrature), clamp, pow, sign;
sums and differences, products with scalars, and products of two functions of one Gaussian."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch
import torch.nn.functional as F

from ..._fields import ERF, IDENTITY, ONE, RELU, STEP, Elem, Field, Term, generic
from ..context import Pass  # the pass's protocol: the rules do not import `run`
from ..trace import NotExact
from ..values import common_layout, ratio, scalar

__all__ = ["activate", "add", "clamp", "elementwise", "mul", "one_gaussian", "power", "scale"]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# functions of one Gaussian without a closed form here: φ(u) by the series or by quadrature
_GENERIC: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "mish": F.mish,
    "sin": torch.sin,
    "cos": torch.cos,
    "exp": torch.exp,
    "selu": F.selu,
    "softsign": F.softsign,
}


def elementwise(name: str, node: Any, **kw: Any) -> list[tuple[float, Elem, float]]:
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
    if name in _GENERIC:
        return [(1.0, generic(_GENERIC[name], name), 1.0)]
    if name == "gelu":
        return [(1.0, generic(_gelu_tanh if kw.get("approximate", "none") == "tanh" else F.gelu, name), 1.0)]
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
        return [(1.0, generic(lambda x: torch.pow(x, cast(float, e)), f"pow {e}"), 1.0)]
    if name == "relu6":
        return [(1.0, generic(F.relu6, "relu6"), 1.0)]
    if name == "hardtanh":
        lo_, hi_ = float(kw.get("min_val", -1.0)), float(kw.get("max_val", 1.0))
        return [(1.0, generic(lambda x: F.hardtanh(x, lo_, hi_), "hardtanh"), 1.0)]
    raise NotExact(f"no rule for the elementwise function {name}", node)


def activate(run: Pass, x: Any, name: str, **kw: Any) -> Field:
    """φ(x) for the named nonlinearity, x a function of one Gaussian in each part."""
    x = run.as_field(x)
    pieces = elementwise(name, run.node, **kw)
    parts = []
    for frac, terms in x.parts:
        g, fn = one_gaussian(run, terms)
        if fn is None:  # a Gaussian combination: closed forms stay available
            new = [Term(c, f, tuple((j, a * sign) for j, a in g)) for c, f, sign in pieces]
        else:

            def comp(u, fn=fn):
                v = fn(u)
                return sum(c * f.fn(sign * v) for c, f, sign in pieces)

            new = [Term(1.0, generic(comp, f"{name}∘…"), g)]
        parts.append((frac, new))
    return replace(x, parts=parts)


def clamp(run: Pass, x: Any, lo: Any, hi: Any) -> Field:
    """clamp(x, lo, hi) with scalar bounds."""
    for v, what in ((lo, "min"), (hi, "max")):
        if v is not None and scalar(v) is None:
            run.fail(f"clamp with a tensor {what}")
    return activate(run, x, "clamp", min=None if lo is None else scalar(lo), max=None if hi is None else scalar(hi))


def power(run: Pass, x: Any, exponent: Any) -> Field:
    """x ** exponent with a scalar exponent."""
    e = scalar(exponent)
    if e is None or isinstance(exponent, Field):
        run.fail("a power with a tensor exponent")
    return activate(run, x, "pow", exponent=e)


def one_gaussian(run: Pass, terms: list[Term]) -> tuple[tuple, Callable[[torch.Tensor], Any] | None]:
    """(g, None) if the terms sum to the Gaussian g; (g, F) if they are F(g) for one Gaussian g
    (every combination a multiple of g); otherwise not exact."""
    if any(run.opaque(t) is not None for t in terms):
        run.fail(
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
        lam = ratio(t.combo, ref)
        if lam is None:
            run.fail(
                "a nonlinearity applied to a sum of non-Gaussian tensors of different Gaussian "
                "combinations (the master theorem needs one Gaussian input)"
            )
        pieces.append((t.coef, t.f, lam))

    def fn(u):
        return sum(c * (f.fn(lam * u) if f.kind != "one" else torch.ones_like(u)) for c, f, lam in pieces)

    return ref, fn


def add(run: Pass, a: Any, b: Any, ca: float, cb: float) -> Field:
    """ca·a + cb·b for two width tensors, or a width tensor and a scalar."""
    sa, sb = scalar(a), scalar(b)
    if isinstance(a, Field) and isinstance(b, Field):
        if a.axes != b.axes:
            run.fail(f"adding width tensors whose axes differ ({a.shape(1)} and {b.shape(1)})")
        if len(a.parts) != len(b.parts) or any(abs(p[0] - q[0]) > 1e-12 for p, q in zip(a.parts, b.parts)):
            run.fail("adding concatenations with different splits of the width")
        parts = [
            (p[0], [replace(t, coef=t.coef * ca) for t in p[1]] + [replace(t, coef=t.coef * cb) for t in q[1]])
            for p, q in zip(a.parts, b.parts)
        ]
        run.check_independent(parts)
        return replace(a, parts=parts, layout=common_layout(a, b))
    if isinstance(a, Field) and sb is not None:
        return replace(
            a,
            parts=[(fr, [replace(t, coef=t.coef * ca) for t in ts] + [Term(sb * cb, ONE, ())]) for fr, ts in a.parts],
        )
    if isinstance(b, Field) and sa is not None:
        return add(run, b, a, cb, ca)
    run.fail(
        "adding a tensor computed from the input or a parameter to a width tensor has no rule "
        "(a learned or fixed per-position offset is not in the master theorem's ops here)"
    )


def scale(run: Pass, x: Any, s: float) -> Field:
    """s·x for a scalar s."""
    x = run.as_field(x)
    return replace(x, parts=[(fr, [replace(t, coef=t.coef * s) for t in ts]) for fr, ts in x.parts])


def mul(run: Pass, a: Any, b: Any) -> Field:
    """a·b: a width tensor times a scalar, or two functions of one Gaussian."""
    sa, sb = scalar(a), scalar(b)
    if isinstance(a, Field) and sb is not None:
        return scale(run, a, sb)
    if isinstance(b, Field) and sa is not None:
        return scale(run, b, sa)
    if isinstance(a, Field) and isinstance(b, Field) and a.axes == b.axes and len(a.parts) == len(b.parts) == 1:
        ga, fa = one_gaussian(run, a.parts[0][1])
        gb, fb = one_gaussian(run, b.parts[0][1])
        fa = fa or (lambda u: u)
        fb = fb or (lambda u: u)
        lam = ratio(gb, ga) if ga and gb else None
        if lam is not None:
            return replace(
                a,
                parts=[(1.0, [Term(1.0, generic(lambda u: fa(u) * fb(lam * u), "product"), ga)])],
                layout=common_layout(a, b),
            )
    run.fail(
        "a product of two width tensors that are not functions of one Gaussian (a gated unit) has no exact rule here"
    )
