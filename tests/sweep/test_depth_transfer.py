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


def _losses(train, fixed: dict, depth: int, alpha: float, log2_lrs) -> dict[int, float]:
    out = {}
    for k in log2_lrs:
        hp = {**fixed, "lr": 2.0**k, "depth_alpha": alpha}
        out[k] = train(hp, Scale(64, 64, "mup", 0, depth=depth, base_depth=2))
    return out


def _best(losses: dict[int, float]) -> int:
    finite = {k: v for k, v in losses.items() if math.isfinite(v)}
    assert finite, f"every run diverged: {losses}"
    return min(finite, key=finite.get)


def _optimum_stays(train, fixed: dict, alpha: float, log2_lrs) -> None:
    """The optimum on the grid at depth 2 (inside the grid), then at depth 8 among the five grid
    points around it: its optimum must be one of the middle three, i.e. within one factor-2 step
    of the shallow one with a worse point on each side. Depth 8 (a run costs about four depth-2
    runs) starts with the middle three and goes one step outward only while the best point so far
    is at an end: under a unimodal loss curve the same verdict as all five, with 3-4 runs instead
    of 5; still at most the five points, so a deeper optimum two steps away is found and fails."""
    shallow_losses = _losses(train, fixed, 2, alpha, log2_lrs)
    shallow = _best(shallow_losses)
    assert shallow not in (log2_lrs[0], log2_lrs[-1]), f"optimum at the edge of the grid: {shallow_losses}"
    deep_losses = _losses(train, fixed, 8, alpha, range(shallow - 1, shallow + 2))
    while True:
        deep, lo, hi = _best(deep_losses), min(deep_losses), max(deep_losses)
        if deep == lo and lo > shallow - 2:
            deep_losses |= _losses(train, fixed, 8, alpha, [lo - 1])
        elif deep == hi and hi < shallow + 2:
            deep_losses |= _losses(train, fixed, 8, alpha, [hi + 1])
        else:
            break
    assert abs(deep - shallow) <= 1, (shallow, dict(sorted(deep_losses.items())))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_residual_mlp_optimal_lr_stays_across_depth(alpha):
    _optimum_stays(train_resmlp, {"steps": 150, "batch_size": 64}, alpha, list(range(-11, -5)))


def test_transformer_optimal_lr_stays_across_depth():
    # 100 steps (was 150, a third of the cost): the same optima at seed 0 (depth 2: 2^-10, depth 8: 2^-9),
    # the depth-8 point two steps off 0.23 above the best (0.25 at 150); seeds 1 and 2 pass as well
    _optimum_stays(train_gpt, {"steps": 100, "batch_size": 16, "seq_len": 32, "n_head": 2}, 1.0, list(range(-12, -7)))


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
            depths=[2, 8, 32],  # the 16x range of [2, 4, 8, 16, 32] at 2/3 of its cost: same verdicts, slopes
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
