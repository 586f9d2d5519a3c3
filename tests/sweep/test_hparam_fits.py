"""Measured rules: power laws of the optimal lr (and weight decay) along batch size and horizon,
fitted on trials built here, checked on a held-out batch size, and applied by `transfer_hparams`."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import mutransfer as mt
from mutransfer.errors import HParamTransferError, MuPWarning
from mutransfer.sweep.analysis.analysis import TrialResult
from mutransfer.sweep.analysis.hparam_fits import fit_measured_laws
from mutransfer.sweep.config.config import config_from_dict

BATCHES = [16, 32, 64, 128]


def law_optimum(b):
    """The known law: log2 lr* = -6 + 0.5·log2(B/16)."""
    return -6 + 0.5 * math.log2(b / 16)


def sweep(axis="batch_sizes", values=BATCHES, seeds=4, space=None, **more):
    cfg = config_from_dict(
        {
            "objective": "m:f",
            "widths": [32],
            "parametrizations": ["mup"],
            "seeds": list(range(seeds)),
            axis: values,
            "space": space or {"lr": {"type": "log", "low": 2**-10, "high": 2**-2, "grid": 9}},
            **more,
        }
    )
    return SimpleNamespace(config=cfg)


def trials(s, optimum, axis="batch_size", noise=0.01, curvature=0.1, seed=3, p="mup"):
    """Trials of every cell along `axis`: loss curvature·(log2 lr − optimum(x))² + seed noise.

    Over noise draws 0–99 (4 seeds) the exponent's 90 % interval held 0.5 in 88 and the held-out
    check passed in 94; draw 3 is one of those (draw 0 is not: its interval is [0.51, 0.56])."""
    cfg = s.config
    rng = np.random.default_rng(seed)
    values, n = cfg.axes[axis], len(cfg.seeds)
    out = []
    for v in values:
        extra = () if v == values[0] else ((axis, v),)
        for i, lr in enumerate(cfg.space_for(p)["lr"].grid_points()):
            ls = tuple(
                curvature * (math.log2(lr) - optimum(v)) ** 2 + 1.0 + noise * rng.standard_normal() for _ in range(n)
            )
            out.append(TrialResult(p, 32, i, {"lr": lr}, sum(ls) / n, False, 0.0, None, ls, extra=extra))
    return out


def test_a_known_power_law_is_recovered_and_validated_on_the_held_out_batch():
    s = sweep()
    law = fit_measured_laws(s, trials(s, law_optimum))["lr"]["batch_size"]
    assert isinstance(law, mt.MeasuredLaw), law
    lo, hi = law.exponent_interval
    assert lo <= 0.5 <= hi and hi - lo < 0.3
    assert law.exponent == pytest.approx(0.5, abs=0.05)
    assert law.fit_range == (16, 64) and law.held_out == 128 and law.n_points == 3
    assert law.validated
    assert law.prediction_interval[0] <= law.held_out_optimum <= law.prediction_interval[1]
    assert law.value_at_reference == pytest.approx(2**-6, rel=0.05)
    assert law.predict(128) == pytest.approx(2**-4.5, rel=0.1)
    assert law.formula.startswith("η ∝ B^0.") and "held-out B = 128" in str(law)
    # applied by transfer_hparams in place of η ∝ √B: no critical batch asked for
    out = mt.transfer_hparams(
        {"lr": 2**-6},
        mt.Scale(width=32, batch_size=16),
        mt.Scale(width=32, batch_size=64),
        measured=fit_measured_laws(s, trials(s, law_optimum)),
    )
    assert out.hparams["lr"] == pytest.approx(2**-6 * 4**law.exponent)
    rule = out.rules[-2]
    assert rule.rule.startswith("batch: measured η ∝ B^") and rule.source == "measured on this sweep"
    assert "fit on B = 16…64" in rule.regime and "held-out B = 128" in rule.regime and "inside" in rule.regime


def test_a_kink_at_the_largest_batch_fails_the_held_out_check_and_is_not_applied():
    s = sweep()
    kinked = trials(s, lambda b: -6.5 if b == 128 else law_optimum(b))  # the surge: lr* falls again
    fits = fit_measured_laws(s, kinked)
    law = fits["lr"]["batch_size"]
    assert isinstance(law, mt.MeasuredLaw) and not law.validated and "outside" in law.check
    out = mt.transfer_hparams(
        {"lr": 2**-6},
        mt.Scale(width=32, batch_size=16),
        mt.Scale(width=32, batch_size=64),
        measured=fits,
        critical_batch=1024,
    )
    assert out.hparams["lr"] == pytest.approx(2**-5)  # the default η ∝ √B
    batch = out.rules[-2]
    assert batch.rule == "batch: η ∝ √B" and "not used: it failed its held-out check" in batch.regime


def test_too_few_batch_sizes_give_a_reason_not_a_law():
    s = sweep(values=[16, 32, 64])
    reason = fit_measured_laws(s, trials(s, law_optimum))["lr"]["batch_size"]
    assert isinstance(reason, str) and "3 measured batch_size values (16, 32, 64)" in reason
    assert "sweep at least 4 values" in reason


def test_an_optimum_on_the_grid_edge_is_not_located_and_named():
    s = sweep()
    reason = fit_measured_laws(s, trials(s, lambda b: -9.9 if b == 32 else law_optimum(b)))["lr"]["batch_size"]
    assert isinstance(reason, str)
    assert "2 located optima in the fit" in reason and "B = 32 (on the grid's low edge)" in reason


def test_non_monotone_optima_state_their_values():
    s = sweep()
    zigzag = {16: -6.0, 32: -4.0, 64: -6.0, 128: -6.0}
    reason = fit_measured_laws(s, trials(s, zigzag.__getitem__))["lr"]["batch_size"]
    assert isinstance(reason, str) and "not monotone in batch_size" in reason
    assert "at B = 16, 32, 64" in reason and "up from 16 to 32, down from 32 to 64" in reason


def test_a_linear_scaled_hparam_and_one_seed_are_refused():
    space = {
        "lr": {"type": "log", "low": 2**-10, "high": 2**-2, "grid": 9},
        "weight_decay": {"type": "uniform", "low": 0.0, "high": 0.2, "grid": 3},
    }
    s = sweep(space=space, seeds=2)
    assert "not log-scaled (Uniform)" in fit_measured_laws(s, [])["weight_decay"]["batch_size"]
    one = sweep(seeds=1)
    assert "one seed" in fit_measured_laws(one, trials(one, law_optimum))["lr"]["batch_size"]


def test_a_horizon_law_applies_to_steps_from_tokens_and_batch():
    s = sweep(axis="horizons", values=[100, 200, 400, 800])
    law = fit_measured_laws(s, trials(s, lambda v: -5 - 0.5 * math.log2(v / 100), axis="steps"))["lr"]["steps"]
    assert isinstance(law, mt.MeasuredLaw) and law.validated and law.exponent == pytest.approx(-0.5, abs=0.05)
    out = mt.transfer_hparams(
        {"lr": 2**-5}, mt.Scale(width=32, tokens=1e6), mt.Scale(width=64, tokens=4e6), measured=[law]
    )
    assert out.hparams["lr"] == pytest.approx(2**-5 * 4**law.exponent)
    assert out.rules[-1].rule.startswith("horizon: measured η ∝ S^-0.")
    assert "S 100 → 400" in out.rules[-1].regime


def test_extrapolation_past_a_decade_is_refused_unless_asked():
    s = sweep()
    fits = fit_measured_laws(s, trials(s, law_optimum))
    p, far = mt.Scale(width=32, batch_size=16), mt.Scale(width=32, batch_size=2048)  # 16× past 128
    with pytest.raises(
        HParamTransferError, match=r"target.batch_size 2048 is 16× beyond the measured range B = 16…128"
    ):
        mt.transfer_hparams({"lr": 2**-6}, p, far, measured=fits)
    with pytest.warns(MuPWarning, match="extrapolating: target.batch_size 2048"):
        out = mt.transfer_hparams({"lr": 2**-6}, p, far, measured=fits, extrapolate=True)
    assert out.hparams["lr"] == pytest.approx(2**-6 * 128 ** fits["lr"]["batch_size"].exponent)
    assert "extrapolated 16× beyond the measured range" in out.rules[-2].regime
    near = mt.transfer_hparams({"lr": 2**-6}, p, mt.Scale(width=32, batch_size=1024), measured=fits)  # 8×: allowed
    assert near.hparams["lr"] > 2**-6


def test_lr_and_weight_decay_are_fitted_on_their_profiles_and_a_lost_held_out_optimum_is_named():
    space = {
        "lr": {"type": "log", "low": 2**-10, "high": 2**-2, "grid": 9},
        "weight_decay": {"type": "log", "low": 2**-8, "high": 2**0, "grid": 5},
    }
    s = sweep(space=space)
    cfg = s.config
    grid = [(lr, wd) for lr in cfg.space["lr"].grid_points() for wd in cfg.space["weight_decay"].grid_points()]

    def rows(wd_slope):
        rng, out = np.random.default_rng(3), []
        for b in BATCHES:
            extra = () if b == 16 else (("batch_size", b),)
            wd_star = -4 + wd_slope * math.log2(b / 16)
            for i, (lr, wd) in enumerate(grid):
                mean = 0.1 * (math.log2(lr) - law_optimum(b)) ** 2 + 0.05 * (math.log2(wd) - wd_star) ** 2 + 1.0
                ls = tuple(mean + 0.01 * rng.standard_normal() for _ in range(4))
                params = {"lr": lr, "weight_decay": wd}
                out.append(TrialResult("mup", 32, i, params, sum(ls) / 4, False, 0.0, None, ls, extra=extra))
        return out

    fits = fit_measured_laws(s, rows(1.0))  # λ* ∝ B
    assert isinstance(fits["lr"]["batch_size"], mt.MeasuredLaw) and fits["lr"]["batch_size"].validated
    wd = fits["weight_decay"]["batch_size"]
    assert isinstance(wd, mt.MeasuredLaw) and wd.validated and wd.exponent == pytest.approx(1.0, abs=0.1)
    beyond = fit_measured_laws(s, rows(1.25))["weight_decay"]["batch_size"]  # λ* at B = 128: 2^-0.25, by the edge
    assert isinstance(beyond, str) and "3 located optima in the fit" in beyond
    assert "B = 128 (on the grid's high edge)" in beyond


def test_each_parametrization_is_fitted_on_its_own_grid():
    s = sweep(
        parametrizations=["mup", "sp"], sp={"space": {"lr": {"type": "log", "low": 2**-8, "high": 2**0, "grid": 9}}}
    )
    sp_law = lambda b: -3 + 0.5 * math.log2(b / 16)  # noqa: E731 — at B = 128: -1.5, past mup's grid (2^-2)
    law = fit_measured_laws(s, trials(s, sp_law, p="sp"), "sp")["lr"]["batch_size"]
    assert (
        isinstance(law, mt.MeasuredLaw) and law.validated and law.value_at_reference == pytest.approx(2**-3, rel=0.05)
    )
    with pytest.raises(ValueError, match="parametrization must be one the sweep ran"):
        fit_measured_laws(sweep(), [], "sp")
