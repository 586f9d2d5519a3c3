"""Depth transfer (issue evidence, reduced size): with depth scaling the optimal Adam lr found at
depth 2 is still optimal, within one factor-2 grid step, at depth 8 — for a residual MLP and a
pre-LN transformer. Without depth scaling the coordinate check fails across depth."""

import math

import pytest

import mutransfer as mt
from mutransfer.recipes.data import text_batches
from mutransfer.recipes.models import GPT
from mutransfer.sweep.recipes import train_gpt, train_resmlp
from mutransfer.sweep.scale import Scale

pytestmark = pytest.mark.slow


def _best_log2_lr(train, fixed: dict, depth: int, alpha: float, log2_lrs) -> int:
    losses = {}
    for k in log2_lrs:
        hp = {**fixed, "lr": 2.0**k, "depth_alpha": alpha}
        losses[k] = train(hp, Scale(64, 64, "mup", 0, depth=depth, base_depth=2))
    finite = {k: v for k, v in losses.items() if math.isfinite(v)}
    best = min(finite, key=finite.get)
    assert best not in (log2_lrs[0], log2_lrs[-1]), f"optimum at the edge of the grid: {losses}"
    return best


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_residual_mlp_optimal_lr_stays_across_depth(alpha):
    fixed = {"steps": 150, "batch_size": 64}
    lrs = list(range(-12, -3))
    shallow = _best_log2_lr(train_resmlp, fixed, 2, alpha, lrs)
    deep = _best_log2_lr(train_resmlp, fixed, 8, alpha, lrs)
    assert abs(deep - shallow) <= 1, (shallow, deep)


def test_transformer_optimal_lr_stays_across_depth():
    fixed = {"steps": 150, "batch_size": 16, "seq_len": 32, "n_head": 2}
    lrs = list(range(-11, -3))
    shallow = _best_log2_lr(train_gpt, fixed, 2, 1.0, lrs)
    deep = _best_log2_lr(train_gpt, fixed, 8, 1.0, lrs)
    assert abs(deep - shallow) <= 1, (shallow, deep)


def test_transformer_coordinate_check_across_depth():
    data = text_batches(3, 8, 32)

    def check(alpha):
        def make(width, depth):
            return mt.parametrize(
                GPT(width, n_layer=depth, ctx=32),
                base=GPT(32, n_layer=2, ctx=32),
                delta=GPT(64, n_layer=2, ctx=32),
                depth_alpha=alpha,
            )

        return mt.coord_check(
            make,
            widths=[64],
            depths=[2, 4, 8, 16, 32],
            data=data,
            optimizer="adam",
            lr=1e-2,
            steps=3,
            seeds=2,
            progress=False,
        )

    assert check(1.0).passed
    without = check(0.0)
    assert not without.passed
    assert any(m.startswith("blocks.last") or m == "ln_f" for m in without.failing_modules()), str(without)
