"""The gradient noise scale, an estimate of the critical batch size (`mt.gradient_noise_scale`).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): the critical batch size is
about the noise scale B_noise = tr(HΣ)/(GᵀHG); with a well-conditioned Hessian that is the *simple*
noise scale B_simple = tr(Σ)/|G|², which needs no Hessian. Without per-example gradients (their
App. A): a mean-reduced loss on B examples has E|G_B|² = |G|² + tr(Σ)/B, so two batch sizes give
unbiased estimates of |G|² and tr(Σ). They are averaged over several batches *before* the ratio is
taken (the ratio of means, not the mean of ratios), and a bootstrap over the batches gives the
interval. When |G|² is not resolved (its mean ≤ its error bar) there is no number, and the result
says why.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from .observe import call_model

__all__ = ["NoiseScale", "gradient_noise_scale"]

_MIN_BATCHES = 3  # fewer gives no error bar worth the name
_MEAN_TOLERANCE = 1e-3  # |G_big − mean of the chunks' G| / |G_big| under a mean-reduced loss (float32 sums)


@dataclass(frozen=True)
class NoiseScale:
    """The simple gradient noise scale B_simple = tr(Σ)/|G|² and what it was made of.

    Attributes:
        b_simple: tr(Σ)/|G|², a batch size (about the critical batch size when the Hessian is
            well-conditioned); None when |G|² or tr(Σ) is not resolved (`reason` says why).
        interval: the bootstrap interval of `b_simple` over the batches (`confidence`), its upper
            end ``math.inf`` when some resamples leave |G|² ≤ 0; None when `b_simple` is None.
        g2: the estimate of |G|², the squared norm of the full-data gradient.
        g2_stderr: the standard error of `g2` over the batches.
        trace_sigma: the estimate of tr(Σ), the per-example gradient covariance's trace.
        trace_sigma_stderr: the standard error of `trace_sigma` over the batches.
        small: the small batch size B_small.
        big: the big batch size B_big.
        batches: how many batches were measured.
        confidence: the interval's coverage.
        reason: why `b_simple` is None ("" when it is a number).
    """

    b_simple: float | None
    interval: tuple[float, float] | None
    g2: float
    g2_stderr: float
    trace_sigma: float
    trace_sigma_stderr: float
    small: int
    big: int
    batches: int
    confidence: float
    reason: str = ""

    @property
    def resolved(self) -> bool:
        """Whether `b_simple` is a number."""
        return self.b_simple is not None

    def __str__(self) -> str:
        where = f"B_small {self.small}, B_big {self.big}, {self.batches} batches"
        parts = (
            f"|G|² {self.g2:.4g} ± {self.g2_stderr:.2g}, tr Σ {self.trace_sigma:.4g} ± {self.trace_sigma_stderr:.2g}"
        )
        if self.b_simple is None or self.interval is None:
            return f"B_simple not resolved: {self.reason} ({parts}; {where})"
        lo, hi = self.interval
        return f"B_simple {self.b_simple:.4g} [{lo:.4g}, {hi:.4g}] at {self.confidence:.0%} ({parts}; {where})"


def gradient_noise_scale(
    model: nn.Module,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    batches: Sequence[tuple[Any, Any]],
    small: int,
    big: int,
    *,
    confidence: float = 0.95,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> NoiseScale:
    """Estimate the simple gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, App. A).

    Each batch's first `big` examples are cut into ``big // small`` chunks of `small`; the squared
    gradient norm of each chunk (averaged over the chunks) and of their mean (the big batch's
    gradient) give, through E|G_B|² = |G|² + tr(Σ)/B,
    |G|² ≈ (B_big·|G_big|² − B_small·|G_small|²)/(B_big − B_small) and
    tr(Σ) ≈ (|G_small|² − |G_big|²)/(1/B_small − 1/B_big). Both are averaged over the batches
    before the ratio; the interval is a bootstrap over the batches. On the first batch the big
    gradient is also computed directly, to check that `loss_fn` averages over the examples (the
    formula needs it). The model runs in eval mode (noise from the data only, not from dropout;
    BatchNorm on its running statistics) and gets its mode back; gradients are taken with
    `torch.autograd.grad`, so ``.grad`` is untouched; no optimizer step is taken.

    Args:
        model: the model, at the point of training you want the noise scale of (it changes
            during training: McCandlish et al. measure it along the run).
        loss_fn: ``loss_fn(output, targets)`` → a scalar, averaged over the examples.
        batches: at least 3 ``(inputs, targets)`` batches, each with at least `big` examples on
            dim 0 (inputs: a tensor, a tuple of positional arguments or a dict of keyword ones),
            on the model's device.
        small: B_small, ≥ 1; `big` must be a multiple of it.
        big: B_big, a multiple of `small` and larger.
        confidence: the interval's coverage, in (0, 1); also the bar |G|² must clear (its mean
            above the normal quantile times its standard error).
        n_bootstrap: bootstrap resamples of the batches.
        seed: the bootstrap's seed (the measurement itself draws nothing).

    Returns:
        A `NoiseScale`: `b_simple` and its `interval`, or None and the `reason` when |G|² is
        within its error of 0 (more batches, or a bigger `big`, resolve it) or tr(Σ) ≤ 0.

    Raises:
        UsageError: `small` ≥ `big`, `big` not a multiple of `small`, fewer than 3 batches, a
            batch with fewer than `big` examples, a bad `confidence` or `n_bootstrap`, a loss that
            is not a scalar or does not average over the examples, no parameter with a gradient.
        TypeError: `model` is not an `nn.Module`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    batches = _check_args(batches, small, big, confidence, n_bootstrap)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UsageError("gradient_noise_scale: model has no parameter with requires_grad=True; nothing to measure")
    was_training = model.training
    model.eval()
    try:
        small_sq, big_sq = [], []
        for i, (inputs, targets) in enumerate(batches):
            s, b = _one_batch(model, loss_fn, params, inputs, targets, small, big, check_mean=i == 0)
            small_sq.append(s)
            big_sq.append(b)
    finally:
        model.train(was_training)
    return _estimate(small_sq, big_sq, small, big, confidence, n_bootstrap, seed)


def _check_args(batches: Any, small: Any, big: Any, confidence: Any, n_bootstrap: Any) -> list:
    for name, v in (("small", small), ("big", big)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"gradient_noise_scale {name}={v!r}: give a batch size, a whole number ≥ 1")
    if small >= big:
        raise UsageError(
            f"gradient_noise_scale small={small} must be below big={big}: two batch sizes B_small < B_big "
            "(e.g. small=big // 8)"
        )
    if big % small:
        raise UsageError(
            f"gradient_noise_scale big={big} is not a multiple of small={small}: the big batch is cut into "
            f"chunks of small; use big={big - big % small} or another small"
        )
    if not (isinstance(confidence, float) and 0.0 < confidence < 1.0):
        raise UsageError(f"gradient_noise_scale confidence={confidence!r}: give a fraction in (0, 1), e.g. 0.95")
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 100:
        raise UsageError(f"gradient_noise_scale n_bootstrap={n_bootstrap!r}: give a whole number ≥ 100")
    try:
        batches = list(batches)
    except TypeError:
        raise UsageError(
            f"gradient_noise_scale batches must be a list of (inputs, targets), got {type(batches).__name__}"
        ) from None
    if len(batches) < _MIN_BATCHES:
        raise UsageError(
            f"gradient_noise_scale batches has {len(batches)} batch(es): give at least {_MIN_BATCHES} "
            "(the estimate averages over them and its error bar comes from their scatter)"
        )
    for i, batch in enumerate(batches):
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise UsageError(f"gradient_noise_scale batches[{i}] must be an (inputs, targets) pair")
        sizes = {t.shape[0] for t in _tensors(batch) if t.ndim}
        if not sizes:
            raise UsageError(f"gradient_noise_scale batches[{i}] holds no tensor with a batch dim (dim 0)")
        if min(sizes) < big:
            raise UsageError(
                f"gradient_noise_scale batches[{i}] has {min(sizes)} examples on dim 0, fewer than big={big}: "
                "give batches of at least big examples, or a smaller big"
            )
    return batches


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _rows(obj: Any, start: int, stop: int) -> Any:
    """`obj` with every tensor that has a batch dim cut to rows start:stop (tuples, lists, dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj[start:stop] if obj.ndim else obj
    if isinstance(obj, dict):
        return {k: _rows(v, start, stop) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_rows(v, start, stop) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_rows(v, start, stop) for v in obj)
    return obj


def _grad(model: nn.Module, loss_fn: Callable, params: list, inputs: Any, targets: Any) -> list[torch.Tensor]:
    loss = loss_fn(call_model(model, inputs), targets)
    if not (isinstance(loss, torch.Tensor) and loss.ndim == 0):
        raise UsageError(
            "gradient_noise_scale loss_fn must return a scalar tensor (the mean loss over the batch), "
            f"got {type(loss).__name__}{'' if not isinstance(loss, torch.Tensor) else f' of shape {tuple(loss.shape)}'}"
        )
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]


def _sq_norm(grads: list[torch.Tensor]) -> float:
    return sum(float(g.float().pow(2).sum()) for g in grads)  # per tensor, on its own device


def _one_batch(
    model: nn.Module, loss_fn: Callable, params: list, inputs: Any, targets: Any, small: int, big: int, check_mean: bool
) -> tuple[float, float]:
    """(mean over chunks of |G_small|², |G_big|²) on one batch's first `big` examples."""
    chunks = big // small
    total: list[torch.Tensor] | None = None
    small_sq = 0.0
    for k in range(chunks):
        lo, hi = k * small, (k + 1) * small
        g = _grad(model, loss_fn, params, _rows(inputs, lo, hi), _rows(targets, lo, hi))
        small_sq += _sq_norm(g)
        total = g if total is None else [t + x for t, x in zip(total, g)]
    mean = [t / chunks for t in (total or [])]  # chunks ≥ 2: total is set
    if check_mean:
        direct = _grad(model, loss_fn, params, _rows(inputs, 0, big), _rows(targets, 0, big))
        gap = math.sqrt(_sq_norm([d - m for d, m in zip(direct, mean)]))
        size = math.sqrt(_sq_norm(direct))
        if gap > _MEAN_TOLERANCE * max(size, 1e-30):
            raise UsageError(
                "gradient_noise_scale loss_fn must average over the examples: the big batch's gradient is not "
                f"the mean of its {chunks} chunks' gradients (relative gap {gap / max(size, 1e-30):.2g}); use "
                "reduction='mean', and no statistic across the batch (BatchNorm runs on its running statistics here)"
            )
    return small_sq / chunks, _sq_norm(mean)


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = sum(values) / n
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def _normal_quantile(p: float) -> float:
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(p, dtype=torch.float64)))


def _estimate(
    small_sq: list[float], big_sq: list[float], small: int, big: int, confidence: float, n_bootstrap: int, seed: int
) -> NoiseScale:
    g2s = [(big * b - small * s) / (big - small) for s, b in zip(small_sq, big_sq)]
    trs = [(s - b) / (1.0 / small - 1.0 / big) for s, b in zip(small_sq, big_sq)]
    g2, g2_se = _mean_se(g2s)
    tr, tr_se = _mean_se(trs)

    def result(b_simple: float | None, interval: tuple[float, float] | None, reason: str = "") -> NoiseScale:
        return NoiseScale(b_simple, interval, g2, g2_se, tr, tr_se, small, big, len(g2s), confidence, reason)

    z = _normal_quantile(0.5 + confidence / 2)
    if g2 <= z * g2_se:
        why = "≤ 0" if g2 <= 0 else f"within {z:.2f} standard errors of 0"
        reason = (
            f"|G|² = {g2:.3g} ± {g2_se:.2g} is {why}: the gradient is lost in its noise at B_big={big}; "
            "measure more batches or a bigger big (B_simple is then likely above big)"
        )
        return result(None, None, reason)
    if tr <= 0:
        reason = f"tr Σ = {tr:.3g} ± {tr_se:.2g} is ≤ 0: no gradient noise measured between small={small} and big={big}"
        return result(None, None, reason)
    rng = random.Random(seed)
    n = len(g2s)
    ratios = []
    for _ in range(n_bootstrap):
        idx = [rng.randrange(n) for _ in range(n)]
        g, t = sum(g2s[i] for i in idx), sum(trs[i] for i in idx)
        ratios.append(t / g if g > 0 else math.inf)
    ratios.sort()
    tail = (1.0 - confidence) / 2
    lo = ratios[math.floor(tail * (n_bootstrap - 1))]
    hi = ratios[math.ceil((1.0 - tail) * (n_bootstrap - 1))]
    return result(tr / g2, (lo, hi))
