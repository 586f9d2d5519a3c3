"""`mt.gradient_noise_scale` against a problem whose |G|² and tr(Σ) are known in closed form.

Linear regression y = x·w* + ε, x ~ N(0, I_d), ε ~ N(0, σ²), loss ½(x·w − y)², at w = w* + δ:
the per-example gradient is g = x(xᵀδ) − xε, so G = E g = δ and (Isserlis: E[x xᵀδ δᵀx xᵀ] =
|δ|² I + 2δδᵀ) Σ = (|δ|² + σ²) I + δδᵀ, hence |G|² = |δ|², tr Σ = d(|δ|² + σ²) + |δ|².
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mutransfer as mt
from mutransfer.errors import UsageError

D, SIGMA2 = 8, 1.0


def _problem(n_batches: int, batch: int, delta_norm: float = 1.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w_star = torch.randn(D, generator=gen)
    delta = torch.randn(D, generator=gen)
    delta = delta / delta.norm() * delta_norm
    model = nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + delta)[None])
    batches = []
    for _ in range(n_batches):
        x = torch.randn(batch, D, generator=gen)
        y = x @ w_star + SIGMA2**0.5 * torch.randn(batch, generator=gen)
        batches.append((x, y))
    d2 = delta_norm**2
    return model, batches, d2, D * (d2 + SIGMA2) + d2


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((out.squeeze(-1) - y) ** 2).mean()


def test_the_estimate_lands_on_the_closed_form_within_its_interval():
    model, batches, g2, tr = _problem(n_batches=40, batch=64)
    res = mt.gradient_noise_scale(model, _loss, batches, small=4, big=64)
    truth = tr / g2  # 17
    assert res.resolved and res.interval is not None and res.b_simple is not None
    lo, hi = res.interval
    assert lo <= truth <= hi, res
    assert abs(res.b_simple - truth) / truth < 0.3, res
    assert abs(res.g2 - g2) <= 3 * res.g2_stderr
    assert abs(res.trace_sigma - tr) <= 3 * res.trace_sigma_stderr
    assert str(res).startswith("B_simple ") and "\n" not in str(res)


def test_model_mode_and_grads_are_left_as_they_were():
    model, batches, _, _ = _problem(n_batches=3, batch=8)
    model.train()
    model.weight.grad = torch.full_like(model.weight, 7.0)
    before = model.weight.detach().clone()
    mt.gradient_noise_scale(model, _loss, batches, small=2, big=8)
    assert model.training
    assert torch.equal(model.weight.grad, torch.full_like(model.weight, 7.0))
    assert torch.equal(model.weight.detach(), before)
    model.eval()
    mt.gradient_noise_scale(model, _loss, batches, small=2, big=8)
    assert not model.training


def test_unresolved_gradient_gives_no_number_and_says_why():
    # at the optimum G = 0: |G|² is pure noise, B_simple is infinite, no number may be given
    model, batches, _, _ = _problem(n_batches=5, batch=16, delta_norm=0.0)
    res = mt.gradient_noise_scale(model, _loss, batches, small=2, big=16)
    assert res.b_simple is None and res.interval is None and not res.resolved
    assert "|G|²" in res.reason and "big" in res.reason
    assert str(res).startswith("B_simple not resolved")


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"small": 8, "big": 8}, "small=8"),
        ({"small": 16, "big": 8}, "small=16"),
        ({"small": 3, "big": 8}, "big=8"),
        ({"small": 0, "big": 8}, "small=0"),
        ({"small": 2, "big": 32}, "big=32"),  # batches hold 8 examples
        ({"small": 2, "big": 8, "confidence": 95}, "confidence"),
    ],
)
def test_bad_sizes_name_the_parameter(kwargs, word):
    model, batches, _, _ = _problem(n_batches=3, batch=8)
    with pytest.raises(UsageError, match=word):
        mt.gradient_noise_scale(model, _loss, batches, **kwargs)


def test_too_few_batches_name_the_parameter():
    model, batches, _, _ = _problem(n_batches=2, batch=8)
    with pytest.raises(UsageError, match="batches has 2"):
        mt.gradient_noise_scale(model, _loss, batches, small=2, big=8)


def test_a_sum_reduced_loss_is_refused():
    model, batches, _, _ = _problem(n_batches=3, batch=8)
    with pytest.raises(UsageError, match="average over the examples"):
        mt.gradient_noise_scale(model, lambda o, y: ((o.squeeze(-1) - y) ** 2).sum(), batches, small=2, big=8)


def test_the_critical_batch_feeds_transfer_hparams():
    model, batches, _, _ = _problem(n_batches=20, batch=32, seed=1)
    res = mt.gradient_noise_scale(model, _loss, batches, small=4, big=32)
    assert res.b_simple is not None
    proxy, target = mt.Scale(width=64, batch_size=4), mt.Scale(width=64, batch_size=8)
    out = mt.transfer_hparams({"lr": 1e-3}, proxy=proxy, target=target, critical_batch=res.b_simple)
    assert out.hparams["lr"] == pytest.approx(1e-3 * 2**0.5)
