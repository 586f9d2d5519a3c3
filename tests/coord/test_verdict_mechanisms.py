"""Issue 29, items 3, 7 and 10: the verdict over the run with a test against noise, the model
output row, and factories that seed themselves. Models in tests/mechanisms_verdict.py."""

import math

import pytest
import torch
from torch import nn

import mutransfer as mt
from mechanisms_verdict import DualEncoder, MoELM, dual_data, factory, lm_data
from mutransfer.coord import CoordCheckResult, Record
from mutransfer.coord.measure import MODEL_OUTPUT, ActivationMeter
from mutransfer.errors import MuPWarning
from mutransfer.recipes import MLP, get_recipe

KW = dict(optimizer="adam", lr=1e-2, progress=False)


def _mlp(width):
    return mt.parametrize(MLP(width), base=MLP(64), delta=MLP(128))


# --------------------------------------------------------------------------- item 3: the verdict


def test_correct_mup_mlp_with_one_seed_at_three_widths_passes():
    # main: FAIL, "readout size at step 1: slope +0.18 ± 0.02" — a per-step 2·SE rule at one residual
    # degree of freedom; the seed-to-seed scatter of that slope is 0.13
    r = mt.coord_check(_mlp, [64, 128, 256], get_recipe("mlp").data(), steps=4, seeds=1, **KW)
    assert r.passed, str(r)
    readout = next(t for t in r.trends if t.module == "readout" and t.quantity == "size" and len(t.steps) > 1)
    assert readout.steps == (1, 2, 3, 4) and readout.crit == pytest.approx(12.706)
    assert "one degree of freedom" in str(r)


def test_standard_parametrization_still_fails_with_one_seed_at_three_widths():
    def sp(width):
        return MLP(width)

    r = mt.coord_check(sp, [64, 128, 256], get_recipe("mlp").data(), steps=4, seeds=1, **KW)
    assert not r.passed and "readout" in r.failing_modules()


def _records(change_by_step, widths=(32, 64, 128, 256), seeds=3, jitter=0.03):
    """Records of one module's change: change_by_step[t](width) at step t, ± jitter across seeds."""
    out = []
    for t, f in change_by_step.items():
        for w in widths:
            for s in range(seeds):
                noise = 1 + jitter * math.sin(7.1 * s + 3.3 * w + t)
                out.append(Record("router", "change", t, w, s, f(w) * noise))
    return CoordCheckResult(out, widths=list(widths), steps=max(change_by_step), seeds=seeds, optimizer="adam", lr=0.01)


def test_noise_at_the_first_step_does_not_fail_but_a_vanishing_change_does():
    # a router's first Adam step: cross terms of random init, shrinking like width^-0.7; then Θ(1)
    router = _records({1: lambda w: w**-0.7, 2: lambda w: 0.5 * w**-0.1, 3: lambda w: 0.6, 4: lambda w: 0.6})
    first = next(t for t in router.step_trends if t.step == 1)
    assert first.slope + 2 * first.slope_se < -0.5  # what the per-step rule failed
    assert router.passed, str(router)
    # a change that vanishes over the whole run (Adam's ε unscaled, the kernel regime) fails
    vanishing = _records({t: (lambda w: w**-0.9) for t in (1, 2, 3, 4)})
    assert not vanishing.passed
    assert vanishing.failures[0].reason == "vanishes" and vanishing.failures[0].steps == (3, 4)


def test_the_critical_value_follows_the_degrees_of_freedom():
    # the same +0.2 slope (×1.5 over 8×) with a little curvature: at 1 residual dof it is not
    # significant; at 10 it is (4 widths × 3 seeds with the same scatter)
    def result(seeds, widths):
        recs = [
            Record("l", "size", 1, w, s, (w / 32) ** 0.35 * (1.04 if w == widths[1] else 1.0) * (1 + 0.001 * s))
            for w in widths
            for s in range(seeds)
        ]
        return CoordCheckResult(recs, widths=list(widths), steps=1, seeds=seeds, optimizer="adam", lr=0.01)

    loose, tight = result(1, (32, 64, 128)), result(3, (32, 64, 128, 256))
    assert loose.trends[0].crit == pytest.approx(12.706) and loose.passed
    assert tight.trends[0].crit == pytest.approx(2.228) and not tight.passed


def test_correct_mup_moe_with_router_and_shared_expert_gate_passes():
    r = mt.coord_check(factory(MoELM), [32, 64, 128], lm_data(), steps=3, seeds=2, **KW)
    assert r.passed, str(r)
    assert {"moes.0.router", "moes.0.shared_expert_gate"} <= {t.module for t in r.trends}


# --------------------------------------------------------------------------- item 7: the output row


def test_model_output_row_is_the_logits_of_a_loss_logits_tuple():
    # main: the row was the loss (≈ ln 8 = 2.08, flat in width), and without loss_fn the check
    # raised "data has no targets"
    make = factory(DualEncoder, example_inputs=dual_data()[0][0])
    r = mt.coord_check(make, [32, 64, 128, 256], dual_data(), steps=2, seeds=2, **KW)
    init = next(t for t in r.step_trends if t.module == MODEL_OUTPUT and t.quantity == "size" and t.step == 0)
    assert init.means[0] < 0.2  # logits of two readouts at init, not the loss
    assert init.slope < -0.5  # the product of two readouts shrinking like fan_in^-½ each
    assert r.passed, str(r)


class _Dropped(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(8, width)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        return self.out(self.drop(self.fc(x)))


def test_dropout_is_off_while_measuring_and_has_no_row_of_its_own():
    model = _Dropped(32).train()
    meter = ActivationMeter(model)
    x = torch.randn(4, 8)
    a, b = meter.measure(x), meter.measure(x)
    meter.close()
    assert "drop" not in a  # main: a second row for fc's output, with a random mask
    assert all(torch.equal(a[k], b[k]) for k in a)  # main: the masks made two measurements differ
    assert model.drop.training  # training mode restored


# --------------------------------------------------------------------------- item 10: seeds


def _by_seed(r, module, step=0):
    return {(x.width, x.seed): x.value for x in r.records if x.module == module and x.step == step}


def test_a_factory_that_seeds_itself_is_reseeded_per_seed():
    r = mt.coord_check(factory(MoELM, seed=0), [32, 64], lm_data(), steps=1, seeds=2, **KW)
    values = _by_seed(r, "embed")
    assert values[(32, 0)] != values[(32, 1)]  # main: identical (every seed was the same model)
    assert any("seeds itself" in n for n in r.notes) and "seeds itself" in str(r)
    assert torch.manual_seed.__module__ == "torch.random"  # restored after the check
    # seed 0 is the factory's own model
    with torch.no_grad():
        own = factory(MoELM, seed=0)(32).embed(lm_data()[0][0]).abs().mean()
    assert values[(32, 0)] == pytest.approx(float(own))


def test_identical_models_across_seeds_are_counted_once():
    def fixed(width):
        g = torch.Generator().manual_seed(0)
        model = MLP(width)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        return model

    with pytest.warns(MuPWarning, match="identical initial parameters"):
        r = mt.coord_check(fixed, [32, 64], get_recipe("mlp").data(), steps=1, seeds=3, **KW)
    assert {s for _, s in _by_seed(r, "readout")} == {0}
    assert "counted once" in str(r)


def test_parametrize_inside_make_model_probes_with_the_batch_coord_check_trains_on():
    # issue 29 item 4: a model whose inputs cannot be derived (a dict) needs example_inputs= to be
    # parametrized alone; inside coord_check, the batch it was given is the probe's input.
    from mechanisms_safety import VOCAB, DictInput

    def make(width):
        return mt.parametrize(DictInput(width), base=DictInput(32), delta=DictInput(64))

    with pytest.raises(mt.errors.ModelError, match="example_inputs="):
        make(64)
    g = torch.Generator().manual_seed(0)
    batch = {"tokens": torch.randint(0, VOCAB, (8, 6), generator=g)}
    data = [((batch,), torch.randint(0, 10, (8,), generator=g))]
    result = mt.coord_check(make, [32, 64], data, optimizer="adam", lr=1e-2, steps=1, seeds=1, progress=False)
    assert result.parametrization == "µP"
    assert any(t.module.endswith("[attn logits]") for t in result.trends)  # attention seen on that batch
