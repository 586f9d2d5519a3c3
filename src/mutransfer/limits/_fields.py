"""What a tensor of an infinitely wide network is, per coordinate of its width axis: the
objects the master theorem (TP1/TP2) propagates through a traced module.

Every Linear/Conv output is a **basis** Gaussian family Z_j: its coordinates are iid across the
width, centred, jointly Gaussian across inputs and positions, with covariance K_j and (for the
NTK) tangent kernel Θ_j. Two different layers give independent families with zero cross tangent
kernel (their weight matrices are independent), so one basis is all a layer has to store.

Any other width tensor is a **field**: a sum of terms c_t · f_t(g_t), each an elementwise
function f_t of one Gaussian combination g_t = Σ_j a_tj Z_j. A nonlinearity can be applied
exactly only where the field is a function of a single combination (the master theorem needs
Gaussian inputs to its nonlinearities); sums of anything are exact. Between two terms,

    E[f_t(g_t(x)) f_s(g_s(x'))]   with   Cov = Σ_j a_tj a_sj K_j(x, x')

is a 2-D Gaussian expectation: closed forms for the identity, relu (and so leaky relu, abs),
its step derivative, erf, a constant; Mehler's series otherwise (see `gaussian`). The tangent
kernel of a field is Σ_ts c_t c_s E[f_t'(g_t) f_s'(g_s')] · Σ_j a_tj a_sj Θ_j.

Kernels are kept in three blocks: `x` (cross, x1 × x2: (n1, n2, …)), `a` and `b` (each input
with itself, batch-diagonal: (n, …)); spatial positions either `full` (…, *S, *S) or diagonal
(…, *S). A concatenation along the width gives a field of several parts, each a fraction of
the coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._activations import Fn, autograd_derivative
from ._gaussian import MAX_ORDER, expect_1d, expect_2d, hermite_coefficients

__all__ = [
    "BLOCKS",
    "ERF",
    "ERF_D",
    "FALLBACK_ORDER",
    "IDENTITY",
    "ONE",
    "RELU",
    "STEP",
    "Basis",
    "Elem",
    "Field",
    "Layout",
    "Term",
    "elem_of",
    "expect",
    "expect_both",
    "generic",
    "mean",
]

BLOCKS = ("x", "a", "b")
_SERIES_TERMS = 240
_QUAD_ORDER = 64
FALLBACK_ORDER = 160  # 2-D quadrature where Mehler's series does not converge


@dataclass(frozen=True)
class Layout:
    """Spatial sizes S (in kernel order) and whether the kernel keeps every pair of positions."""

    spatial: tuple[int, ...]
    full: bool

    def batch_dims(self, block: str) -> int:
        return 2 if block == "x" else 1

    def diagonal(self, k: torch.Tensor, block: str) -> torch.Tensor:
        """The same-position entries (…, *S) of a kernel in this layout."""
        if not self.full or not self.spatial:
            return k
        nb = self.batch_dims(block)
        p = math.prod(self.spatial)
        flat = k.reshape(*k.shape[:nb], p, p)
        return flat.diagonal(dim1=-2, dim2=-1).reshape(*k.shape[:nb], *self.spatial)

    def sides(self, da: torch.Tensor, db: torch.Tensor, block: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Same-position variances of side A (da, (n_a, *S)) and side B broadcast against a block."""
        ns = len(self.spatial)
        if block == "x":
            va, vb = da[:, None], db[None, :]
            if self.full:
                va = va.reshape(*va.shape, *([1] * ns))
                vb = vb.reshape(*vb.shape[:2], *([1] * ns), *vb.shape[2:])
            return va, vb
        if self.full:
            return da.reshape(*da.shape, *([1] * ns)), db.reshape(db.shape[0], *([1] * ns), *db.shape[1:])
        return da, db


@dataclass
class Basis:
    """One layer's output family: kernels per block and the cross tangent kernel, all in `layout`.
    `support`: the layer outputs it is a function of (itself, unless it is derived by LayerNorm)."""

    id: int
    layout: Layout
    k: dict[str, torch.Tensor]
    ntk: torch.Tensor | None
    support: frozenset[int]
    gaussian: bool = True  # False: a pooled non-Gaussian value, known by its kernels and `means`
    means: dict[str, torch.Tensor] | None = None  # per side 'a'/'b', (n, *S)
    node: object = None  # the graph node that made it (its layout follows that node's needs)


@dataclass(frozen=True)
class Elem:
    """An elementwise function with what the expectations need: its kind (closed forms are chosen
    by kind), the callable, and its derivative as another Elem (None: zero)."""

    kind: str
    fn: Fn
    name: str
    derivative: Callable[[], Elem | None] | None = None

    def d(self) -> Elem | None:
        return None if self.derivative is None else self.derivative()


def _one(x):
    return torch.ones_like(x)


def _step(x):
    return (x > 0).to(x.dtype)


def _erf_d(x):
    return (2 / math.sqrt(math.pi)) * torch.exp(-x * x)


ONE = Elem("one", _one, "1")
IDENTITY = Elem("identity", lambda x: x, "identity", lambda: ONE)
STEP = Elem("step", _step, "step")
RELU = Elem("relu", torch.relu, "relu", lambda: STEP)


def elem_of(act) -> Elem:
    """The Elem of an `activations.Activation`: closed forms for relu, erf and the identity unless a
    derivative was supplied, the generic machinery otherwise."""
    closed = {"relu": RELU, "erf": ERF, "identity": IDENTITY}
    if act.name in closed and act.dphi_moment is not None:
        return closed[act.name]
    return generic(act.fn, act.name, act.derivative)


def generic(fn: Fn, name: str, derivative: Fn | None = None) -> Elem:
    """Any elementwise function; its derivative by autograd unless given."""
    d = derivative or autograd_derivative(fn)
    return Elem("generic", fn, name, lambda: Elem("generic", d, f"{name}'", lambda: generic(d, f"{name}'")))


ERF_D = Elem("erf_d", _erf_d, "erf'", lambda: generic(_erf_d, "erf'"))  # (erf')' by autograd, if ever needed
ERF = Elem("erf", torch.erf, "erf", lambda: ERF_D)


@dataclass(frozen=True)
class Term:
    """coef · f(Σ_j a_j Z_j); `combo` is ((basis id, a_j), ...) sorted; empty for a constant."""

    coef: float
    f: Elem
    combo: tuple[tuple[int, float], ...]


@dataclass
class Field:
    """A width tensor: parts (fraction of the width, terms); axes: the tensor's axes, each a tuple
    of atoms ('B' batch, 'W' width, int spatial index into layout.spatial); sizes: atom → size."""

    parts: list[tuple[float, list[Term]]]
    axes: list[tuple]
    sizes: dict
    layout: Layout

    def shape(self, batch: int) -> tuple[int, ...]:
        out = []
        for ax in self.axes:
            out.append(math.prod(batch if a == "B" else self.sizes[a] for a in ax))
        return tuple(out)


# ---- expectations of pairs of elementwise functions of a bivariate Gaussian -----------------------


def _cos(a, b, c):
    s = torch.sqrt(a * b)
    return s, (c / s.clamp_min(1e-300)).clamp_(-1, 1)  # s = 0 only where c = 0


def _relu_both(a, b, c, dphi: bool):
    """E[relu(u) relu(v)] = √(ab)(sin θ + (π − θ) cos θ)/(2π) and E[1(u>0)1(v>0)] = (π − θ)/(2π),
    cos θ = c/√(ab) (the arc-cosine kernels), sharing θ; written to make few passes over memory.
    (sin θ from the clamped cos keeps x = x' exact, where ab − c² would cancel.)"""
    s = (a * b).sqrt_()
    cos = torch.div(c, s).nan_to_num_(0.0).clamp_(-1, 1)  # s = 0 only where c = 0
    rest = torch.arccos(cos).neg_().add_(math.pi)  # π − θ
    sin = torch.mul(cos, cos).neg_().add_(1).clamp_(min=0).sqrt_()
    phi = torch.addcmul(sin, rest, cos).mul_(s).div_(2 * math.pi)
    return phi, (rest.div_(2 * math.pi) if dphi else None)


def _relu_relu(a, b, c):
    return _relu_both(a, b, c, False)[0]


def _step_step(a, b, c):
    _, cos = _cos(a, b, c)
    return (math.pi - torch.arccos(cos)) / (2 * math.pi)


def _erf_erf(a, b, c):
    return (2 / math.pi) * torch.arcsin((2 * c / torch.sqrt((1 + 2 * a) * (1 + 2 * b))).clamp(-1, 1))


def _erfd_erfd(a, b, c):
    return (4 / math.pi) / torch.sqrt((1 + 2 * a) * (1 + 2 * b) - 4 * c * c)


def _identity_step(a, b, c):  # E[u · 1(v > 0)] = Cov(u, v) · density of v at 0 = c / √(2π b)
    return torch.where(b > 0, c / torch.sqrt(2 * math.pi * b.clamp_min(1e-300)), torch.zeros_like(c))


_CLOSED = {
    ("relu", "relu"): _relu_relu,
    ("step", "step"): _step_step,
    ("erf", "erf"): _erf_erf,
    ("erf_d", "erf_d"): _erfd_erfd,
    ("identity", "identity"): lambda a, b, c: c,
    ("identity", "step"): _identity_step,
}


def mean(f: Elem, v: torch.Tensor) -> torch.Tensor:
    """E[f(u)], u ~ N(0, v), elementwise."""
    if f.kind in ("identity", "erf"):
        return torch.zeros_like(v)
    if f.kind == "one":
        return torch.ones_like(v)
    if f.kind == "relu":
        return torch.sqrt(v.clamp_min(0) / (2 * math.pi))
    if f.kind == "step":
        return torch.where(v > 0, torch.full_like(v, 0.5), torch.zeros_like(v))
    if f.kind == "erf_d":
        return (2 / math.sqrt(math.pi)) / torch.sqrt(1 + 2 * v)
    flat = v.reshape(-1)
    uniq, inv = torch.unique(flat, return_inverse=True)
    return expect_1d(f.fn, uniq, min(4 * _QUAD_ORDER, MAX_ORDER))[inv].reshape(v.shape)


def _coefficients(f: Elem, v: torch.Tensor, terms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hermite coefficients of f at every distinct variance in v: (unique coeffs, inverse index)."""
    uniq, inv = torch.unique(v.reshape(-1), return_inverse=True)
    return hermite_coefficients(f.fn, uniq, terms), inv


def expect_both(
    f: Elem, g: Elem, va: torch.Tensor, vb: torch.Tensor, c: torch.Tensor, derivative: bool, **options
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(E[f(u) g(v)], E[f'(u) g'(v)] or None): what one pair of terms gives the NNGP and the NTK."""
    if f.kind == "relu" and g.kind == "relu":
        va, vb, c = torch.broadcast_tensors(va, vb, c)
        return _relu_both(va, vb, c, derivative)
    value = expect(f, g, va, vb, c, **options)
    if not derivative:
        return value, None
    df, dg = f.d(), g.d()
    return value, (None if df is None or dg is None else expect(df, dg, va, vb, c, **options))


def expect(
    f: Elem,
    g: Elem,
    va: torch.Tensor,
    vb: torch.Tensor,
    c: torch.Tensor,
    *,
    terms: int = _SERIES_TERMS,
    fallback_order: int = FALLBACK_ORDER,
) -> torch.Tensor:
    """E[f(u) g(v)] for (u, v) centred Gaussian with Var u = va, Var v = vb, Cov = c (broadcast).
    Closed forms by kind; else Mehler's series with `terms` Hermite coefficients wherever one side's
    coefficients decay, 2-D Gauss–Hermite quadrature of `fallback_order` per dimension elsewhere."""
    key = (f.kind, g.kind)
    if key in _CLOSED or (key[1], key[0]) in _CLOSED or "one" in key or "identity" in key:
        va, vb, c = torch.broadcast_tensors(va, vb, c)
    if key in _CLOSED:
        return _CLOSED[key](va, vb, c)
    if (key[1], key[0]) in _CLOSED:
        return _CLOSED[(key[1], key[0])](vb, va, c)
    if f.kind == "one":
        return mean(g, vb)
    if g.kind == "one":
        return mean(f, va)
    if f.kind == "identity" or g.kind == "identity":  # Stein: E[u h(v)] = Cov(u, v) E[h'(v)]
        other, v_other = (g, vb) if f.kind == "identity" else (f, va)
        d = other.d()
        return c * (torch.zeros_like(c) if d is None else mean(d, v_other))
    # Mehler's series (Horner in ρ, the coefficients broadcast from each side's own shape: va is
    # (n1, 1, …) and vb (1, n2, …) in a cross block) wherever at least one side's Hermite
    # coefficients decay; 2-D Gauss–Hermite quadrature for the rest (two kinks, huge variances)
    shape = torch.broadcast_shapes(va.shape, vb.shape, c.shape)
    ca, ia = _coefficients(f, va, terms)
    cb, ib = _coefficients(g, vb, terms)
    fa = ca[ia].reshape(*va.shape, terms)
    fb = cb[ib].reshape(*vb.shape, terms)
    ok = (_row_converged(ca)[ia].reshape(va.shape) | _row_converged(cb)[ib].reshape(vb.shape)).expand(shape)
    rho = (c / torch.sqrt(va * vb)).nan_to_num_(0.0).clamp_(-1, 1).expand(shape)
    out = torch.zeros(shape, dtype=c.dtype, device=c.device)
    for k in range(terms - 1, -1, -1):
        out.mul_(rho).add_(fa[..., k] * fb[..., k])
    if not ok.all():
        bad = ~ok
        vab, vbb, cb_ = (t.expand(shape)[bad] for t in (va, vb, c))
        out[bad] = expect_2d(f.fn, g.fn, vab, vbb, cb_, fallback_order)
    return out


def _row_converged(coeffs: torch.Tensor, tol: float = 1e-4) -> torch.Tensor:
    """Per row of Hermite coefficients: does the last tenth fall below `tol` × the norm?"""
    tail = coeffs[:, -max(2, coeffs.shape[1] // 10) :].abs().amax(1)
    return tail <= tol * coeffs.norm(dim=1).clamp_min(1e-300)
