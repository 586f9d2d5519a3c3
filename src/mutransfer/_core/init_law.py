"""Init laws: the distribution of each parameter's initial values, read off the base model's values.

`parametrize` records one `InitLaw` per parameter when the base holds real values: the family the
base's values were drawn from (zeros, a constant, normal, uniform, truncated normal, or — when
none of those fits — the base's own quantiles), its parameters, and µP's factor relative to the
base (`scale`). `mt.init_weights` draws from it; `mt.check` compares a model's values with it.

Which family: a Kolmogorov–Smirnov distance at the 1 % level against each fitted family, a
normal preferred unless the sample's largest |z| is too small for a normal of that size (then
the values are bounded: uniform or truncated normal, whichever fits closer). Values that are not
a random draw are told apart first: constant along every dim that grows with width (tiled to the
target: a log-decay repeated per channel), or monotone along a dim (copied when no dim grows,
else refused at draw time: µP cannot know how such values extend to a wider model).

The draw (`draw`) is addressed by position: the full tensor is cut into blocks of whole rows, each
drawn by a generator seeded from (seed, parameter name, block), so a shard draws the blocks its rows
lie in and keeps its part: the full tensor is the same for the same seed whatever the sharding.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

__all__ = ["KINDS", "InitLaw", "block_seed", "draw", "read_law"]

KINDS = ("zeros", "constant", "normal", "uniform", "trunc_normal", "empirical", "tiled", "unknown")
_KS_LEVEL = 1.63  # Kolmogorov–Smirnov critical value × √n at the 1 % level
_QUANTILES = 4097  # points kept of an empirical law
_SAMPLE = 1 << 16  # values a family is fitted on, at most
_MONOTONE_MIN = 8  # a fiber this long that is monotone in every slice is not a random draw


@dataclass(frozen=True)
class InitLaw:
    """The law of one parameter's initial values: the base's law times µP's factor `scale`.

    Attributes:
        kind: one of `KINDS`. "tiled": the base's values, constant along the dims that grow, repeated
            to the target's size; "unknown": no law µP can draw (see `reason`).
        mean: the base law's location (normal, truncated normal) or value (constant).
        std: the base law's scale (normal; the parent normal's σ for a truncated one).
        low: lower bound (uniform, truncated normal), in the base's units.
        high: upper bound (uniform, truncated normal), in the base's units.
        values: the base's sorted quantiles (empirical) or its values reduced over the growing dims
            (tiled), float64 on the CPU.
        scale: µP's factor on the base's values (width × depth × the tunable init multiplier).
        base_rms: the root mean square of the base's values.
        kurtosis: E[x⁴]/E[x²]² of the base's values (the sampling error of an RMS depends on it).
        reason: why the law is what it is (for "unknown": why none can be drawn).
    """

    kind: str
    mean: float = 0.0
    std: float = 0.0
    low: float = 0.0
    high: float = 0.0
    values: torch.Tensor | None = field(default=None, compare=False, repr=False)
    scale: float = 1.0
    base_rms: float = 0.0
    kurtosis: float = 3.0
    reason: str = ""

    @property
    def rms(self) -> float:
        """The root mean square of a tensor drawn from this law (base RMS × |scale|)."""
        return self.base_rms * abs(self.scale)

    def scaled(self, c: float) -> InitLaw:
        """The same law times `c`."""
        return replace(self, scale=self.scale * c)

    def describe(self) -> str:
        """A short formula of the law in the target's units, e.g. ``N(0, 0.005)``."""
        s = self.scale
        if self.kind == "zeros" or s == 0.0:
            return "0"
        if self.kind == "constant":
            return f"{self.mean * s:.4g}"
        if self.kind == "normal":
            return f"N({self.mean * s:.4g}, {abs(self.std * s):.4g})"
        if self.kind == "uniform":
            lo, hi = sorted((self.low * s, self.high * s))
            return f"U({lo:.4g}, {hi:.4g})"
        if self.kind == "trunc_normal":
            lo, hi = sorted((self.low * s, self.high * s))
            return f"TN({self.mean * s:.4g}, {abs(self.std * s):.4g}; {lo:.4g}, {hi:.4g})"
        if self.kind == "empirical":
            return f"base quantiles ×{s:.4g} (rms {self.rms:.4g})"
        if self.kind == "tiled":
            return f"base values tiled ×{s:.4g}"
        return "none: " + self.reason


# ------------------------------------------------------------------------------------------- reading


def _phi(z: torch.Tensor | float) -> torch.Tensor:
    z = torch.as_tensor(z, dtype=torch.float64)
    return 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))


def _ks(sorted_x: torch.Tensor, cdf: torch.Tensor) -> float:
    """Kolmogorov–Smirnov distance between a sorted sample and its model CDF at those points."""
    n = sorted_x.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(i / n - cdf, cdf - (i - 1) / n).max())


def _trunc_var(alpha: float, beta: float) -> float:
    """Variance of a standard normal truncated to [alpha, beta]."""
    pa, pb = math.exp(-alpha * alpha / 2) / math.sqrt(2 * math.pi), math.exp(-beta * beta / 2) / math.sqrt(2 * math.pi)
    z = float(_phi(beta) - _phi(alpha))
    if z <= 0:
        return 0.0
    return 1.0 + (alpha * pa - beta * pb) / z - ((pa - pb) / z) ** 2


def _fit_trunc(x: torch.Tensor, lo: float, hi: float) -> tuple[float, float]:
    """(μ, σ) of the parent normal of a truncated normal on [lo, hi] with the sample's mean and variance
    (μ the sample mean)."""
    mu = float(x.mean())
    var = float(x.var(unbiased=False))
    a, b = 1e-6, 1e3  # σ / half-width: bisection on the variance, which grows with σ
    half = max(hi - mu, mu - lo)
    for _ in range(80):
        m = math.sqrt(a * b)
        s = m * half
        if s * s * _trunc_var((lo - mu) / s, (hi - mu) / s) < var:
            a = m
        else:
            b = m
    return mu, math.sqrt(a * b) * half


def _monotone_dim(b: torch.Tensor) -> int | None:
    """A dim along which every fiber of `b` (of ≥ 8 values) is monotone: values computed, not drawn."""
    for d in range(b.ndim):
        if b.shape[d] < _MONOTONE_MIN:
            continue
        diff = b.diff(dim=d)
        if bool((diff >= 0).all()) or bool((diff <= 0).all()):
            return d
    return None


def _correlated_dim(b: torch.Tensor) -> str | None:
    """Neighbours along a dim (of ≥ 8) correlated far beyond an i.i.d. draw's noise (|r|·√pairs > 8: a sin-cos
    table, a smooth ramp): values computed, not drawn; None otherwise."""
    for d in range(b.ndim):
        if b.shape[d] < _MONOTONE_MIN:
            continue
        a, c = b.narrow(d, 0, b.shape[d] - 1).flatten(), b.narrow(d, 1, b.shape[d] - 1).flatten()
        a, c = a - a.mean(), c - c.mean()
        den = float(a.norm() * c.norm())
        if den > 0 and abs(float(a @ c) / den) * math.sqrt(a.numel()) > 8.0:
            return f"neighbours along dim {d} correlated"
    return None


def read_law(base: torch.Tensor, grows: Sequence[bool]) -> InitLaw:
    """The law the base's values were drawn from.

    Args:
        base: the base model's parameter (real values, any device).
        grows: per dim, whether the target's size differs from the base's (a width dim that grows).

    Returns:
        The `InitLaw` (scale 1).
    """
    b = base.detach().to("cpu", torch.float64)
    x = b.flatten()
    n = x.numel()
    if n == 0 or bool((x == 0).all()):
        return InitLaw("zeros", reason="the base's values are all zero")
    m2 = float(x.pow(2).mean())
    rms = math.sqrt(m2)
    kurt = float(x.pow(4).mean()) / (m2 * m2) if m2 > 0 else 3.0
    if bool((x == x[0]).all()):
        return InitLaw(
            "constant", mean=float(x[0]), base_rms=rms, kurtosis=1.0, reason="the base's values are constant"
        )
    growing = [d for d, g in enumerate(grows) if g and b.shape[d] > 1]
    if growing and all(bool((b == b.narrow(d, 0, 1)).all()) for d in growing):
        pattern = b
        for d in growing:
            pattern = pattern.narrow(d, 0, 1)
        return InitLaw(
            "tiled",
            values=pattern.contiguous(),
            base_rms=rms,
            kurtosis=kurt,
            reason="the base's values are the same along every dim that grows: repeated",
        )
    mono = _monotone_dim(b)
    what = f"monotone along dim {mono}" if mono is not None else _correlated_dim(b)
    if what is not None:
        if not growing:
            return InitLaw(
                "tiled", values=b.contiguous(), base_rms=rms, kurtosis=kurt, reason="computed values, copied"
            )
        return InitLaw(
            "unknown",
            base_rms=rms,
            kurtosis=kurt,
            reason=f"computed values ({what}), not a random draw; how they extend to a wider model is the model's "
            "own code",
        )
    if n < 32:  # too few values to tell a family apart
        if not growing:
            return InitLaw(
                "tiled", values=b.contiguous(), base_rms=rms, kurtosis=kurt, reason="the base's values, copied"
            )
        xs, _ = x.sort()  # no family can be told apart: the base's own values, interpolated (bounded like them)
        return InitLaw(
            "empirical", values=xs.contiguous(), base_rms=rms, kurtosis=kurt, reason=f"{n} values: their quantiles"
        )
    mean, std = float(x.mean()), float(x.std(unbiased=False))
    centred = abs(mean) <= 3.0 * std / math.sqrt(n)  # a mean within noise of 0: the init is symmetric
    if n > _SAMPLE:  # the family is told from a fixed random sample (the KS test at 1 % resolves 0.6 % there)
        x = x[torch.randint(0, n, (_SAMPLE,), generator=torch.Generator().manual_seed(0))]
        n = _SAMPLE
    xs, _ = x.sort()
    if centred:
        mean, std = 0.0, rms
    crit = _KS_LEVEL / math.sqrt(n)
    d_normal = _ks(xs, _phi((xs - mean) / std))
    # bounded? P(max |z| ≤ observed) under a normal of n draws
    zmax = float(((xs - mean).abs() / std).max())
    p_inside = float(1.0 - 2.0 * (1.0 - _phi(zmax)))
    bounded = n * math.log(max(p_inside, 1e-300)) < math.log(1e-3)
    fits: list[tuple[float, InitLaw]] = []
    if d_normal <= crit and not bounded:
        fits.append(
            (d_normal, InitLaw("normal", mean=mean, std=std, base_rms=rms, kurtosis=kurt, reason="a normal draw"))
        )
    lo_s, hi_s = float(xs[0]), float(xs[-1])
    pad = (hi_s - lo_s) / max(n - 1, 1)
    lo, hi = lo_s - pad, hi_s + pad
    if centred:
        lo, hi = -(hi - lo) / 2, (hi - lo) / 2
    d_uniform = _ks(xs, ((xs - lo) / (hi - lo)).clamp(0, 1))
    if d_uniform <= crit:
        u_rms = math.sqrt((hi**3 - lo**3) / (3 * (hi - lo)))
        fits.append(
            (d_uniform, InitLaw("uniform", low=lo, high=hi, base_rms=u_rms, kurtosis=kurt, reason="a uniform draw"))
        )
    elif bounded:  # a truncated normal far wider than its bounds is a uniform: tried only when that one fails
        mu, sigma = _fit_trunc(x, lo_s, hi_s)
        mu = 0.0 if centred else mu
        pa, pb = _phi((lo_s - mu) / sigma), _phi((hi_s - mu) / sigma)
        d_trunc = _ks(xs, ((_phi((xs - mu) / sigma) - pa) / (pb - pa)).clamp(0, 1))
        if d_trunc <= crit:
            law = InitLaw(
                "trunc_normal",
                mean=mu,
                std=sigma,
                low=lo_s,
                high=hi_s,
                base_rms=rms,
                kurtosis=kurt,
                reason="a truncated normal draw",
            )
            fits.append((d_trunc, law))
    kinds = {law.kind for _, law in fits}
    if {"normal", "uniform"} <= kinds:  # both pass (a small base): the likelier of the two fitted laws
        var = float(x.var(unbiased=False))
        log_normal = -0.5 * n * (math.log(2 * math.pi * var) + 1.0)
        log_uniform = -n * math.log(hi - lo)
        keep = "uniform" if log_uniform > log_normal else "normal"
        fits = [f for f in fits if f[1].kind == keep]
    if fits:
        return min(fits, key=lambda f: f[0])[1]
    if not growing:
        return InitLaw("tiled", values=b.contiguous(), base_rms=rms, kurtosis=kurt, reason="the base's values, copied")
    q = torch.quantile(xs, torch.linspace(0, 1, min(_QUANTILES, n), dtype=torch.float64)) if n > _QUANTILES else xs
    return InitLaw(
        "empirical",
        values=q.contiguous(),
        base_rms=rms,
        kurtosis=kurt,
        reason="no normal, uniform or truncated normal fits the base's values: drawn from their quantiles",
    )


# ------------------------------------------------------------------------------------------- drawing

_BLOCK = 1 << 16  # values per block of rows, at least: one generator seeded per block
_M64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    """SplitMix64's finalizer: a 64-bit integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of one block of rows of one parameter: a hash of (seed, name, block)."""
    return _splitmix(_splitmix(_splitmix(seed & _M64) ^ zlib.crc32(name.encode())) ^ block) >> 1


def _uniform(n: int, gens: tuple[torch.Generator, torch.Generator], device: torch.device) -> torch.Tensor:
    """n uniforms in [0, 1) from two generators: (u₁ + u₂) mod 1 is uniform, and a block repeats another only
    if both of its seeds do (torch's CPU generator keeps 32 bits of a seed: one alone would collide)."""
    u = torch.rand(n, dtype=torch.float64, generator=gens[0], device=device)
    u += torch.rand(n, dtype=torch.float64, generator=gens[1], device=device)
    return u.sub_(u.floor())


def _values(law: InitLaw, n: int, gens: tuple[torch.Generator, torch.Generator], device: torch.device) -> torch.Tensor:
    """n values of the base's law (before `scale`), float64."""
    u = _uniform(n, gens, device)
    if law.kind == "normal":
        u.clamp_(1e-300, 1 - 1e-16)
        return law.mean + law.std * math.sqrt(2.0) * torch.erfinv(u.mul_(2.0).sub_(1.0))
    if law.kind == "uniform":
        return law.low + (law.high - law.low) * u
    if law.kind == "trunc_normal":
        pa = float(_phi((law.low - law.mean) / law.std))
        pb = float(_phi((law.high - law.mean) / law.std))
        p = (pa + (pb - pa) * u).clamp(1e-300, 1 - 1e-16)
        return (law.mean + law.std * math.sqrt(2.0) * torch.erfinv(2.0 * p - 1.0)).clamp(law.low, law.high)
    if law.kind == "empirical":
        q = law.values.to(device)  # type: ignore[union-attr]
        pos = u * (q.numel() - 1)
        i = pos.floor().long().clamp(max=q.numel() - 2)
        return q[i] + (pos - i) * (q[i + 1] - q[i])
    raise ValueError(f"no random draw for an init law of kind {law.kind!r}")


def _seeded(gens: tuple[torch.Generator, torch.Generator], seed: int, name: str, block: int) -> None:
    full = block_seed(seed, name, block)
    gens[0].manual_seed(full & 0xFFFFFFFF)
    gens[1].manual_seed(_splitmix(full) >> 33)


def _deterministic(law: InitLaw, shape: Sequence[int], indices: Sequence[torch.Tensor], device) -> torch.Tensor:
    if law.kind == "zeros":
        return torch.zeros(tuple(shape), dtype=torch.float64, device=device)
    if law.kind == "constant":
        return torch.full(tuple(shape), law.mean, dtype=torch.float64, device=device)
    pattern = law.values.to(device)  # type: ignore[union-attr]
    for d, idx in enumerate(indices):
        pattern = pattern.index_select(d, idx if pattern.shape[d] > 1 else torch.zeros_like(idx))
    return pattern.expand(tuple(shape))


def draw(
    law: InitLaw,
    out: torch.Tensor,
    global_shape: Sequence[int],
    indices: Sequence[torch.Tensor],
    seed: int,
    name: str,
    multipliers: Sequence[torch.Tensor | None] = (),
) -> None:
    """Fill `out` (a parameter or its local shard) with a draw from `law`, in place.

    The full tensor is cut into blocks of whole rows (dim 0) of at least 2¹⁶ values; each block's
    values come from two generators seeded by (seed, name, block) (64 bits of seed in all), so a shard
    draws the blocks its rows lie in and keeps its part: the full tensor is the same whatever the
    sharding (on one kind of device: CPU and CUDA generators differ). Memory: one block in float64
    at a time, beside `out`.

    Args:
        law: the law (its `scale` applied).
        out: the tensor to fill; its dim d holds the global positions `indices[d]`.
        global_shape: the full tensor's shape.
        indices: per dim, the global index of each of `out`'s positions (int64, `out`'s device).
        seed: the draw's seed.
        name: the parameter's name (its stream).
        multipliers: per dim, a factor per position (rows of another role, zeroed rows) or None.

    Raises:
        ValueError: the law has no draw ("unknown").
    """
    if law.kind == "unknown":
        raise ValueError(f"no draw for '{name}': {law.reason}")
    if out.numel() == 0:
        return
    device = out.device
    ndim = out.ndim

    def finish(vals: torch.Tensor, dim0: torch.Tensor | None) -> torch.Tensor:
        """× scale and the per-dim multipliers (dim 0's restricted to the local rows `dim0` when given)."""
        vals = vals * law.scale
        for d, m in enumerate(multipliers):
            if m is not None:
                m = m if d or dim0 is None else m.index_select(0, dim0)
                vals = vals * m.reshape([-1 if e == d else 1 for e in range(ndim)])
        return vals

    if law.kind in ("zeros", "constant", "tiled"):
        out.copy_(finish(_deterministic(law, out.shape, indices, device), None).to(out.dtype))
        return
    gens = (torch.Generator(device=device), torch.Generator(device=device))
    if ndim == 0:
        _seeded(gens, seed, name, 0)
        out.copy_(finish(_values(law, 1, gens, device).reshape(()), None).to(out.dtype))
        return
    rows_total = int(global_shape[0])
    per_row = 1
    for s in global_shape[1:]:
        per_row *= int(s)
    k = max(1, -(-_BLOCK // max(per_row, 1)))  # rows per block
    rows = indices[0]
    blocks = torch.div(rows, k, rounding_mode="floor")
    order = torch.argsort(blocks, stable=True)  # local rows grouped by block, without a pass per block
    ids, counts = torch.unique_consecutive(blocks.index_select(0, order), return_counts=True)
    start = 0
    for b, c in zip(ids.tolist(), counts.tolist()):
        where = order[start : start + c]
        start += c
        first, last = b * k, min((b + 1) * k, rows_total)
        _seeded(gens, seed, name, b)
        block = _values(law, (last - first) * per_row, gens, device).reshape(last - first, *global_shape[1:])
        part = block.index_select(0, rows.index_select(0, where) - first)
        del block
        for d in range(1, ndim):
            if len(indices[d]) != global_shape[d]:
                part = part.index_select(d, indices[d])
        out.index_copy_(0, where, finish(part, where).to(out.dtype))  # block by block: no shard-sized float64
