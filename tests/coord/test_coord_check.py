"""The coordinate check: passes correct µP, fails the classic mistakes, names the culprits."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt
from mutransfer.coord import CoordCheckResult, Record
from mutransfer.recipes import CNN, GPT, MLP, MHATransformer, get_recipe

MLP_DATA = get_recipe("mlp").data()
CNN_DATA = get_recipe("cnn").data()
GPT_DATA = get_recipe("gpt").data()
WIDTHS = [64, 128, 256, 512]  # verdict margins as with 1024 (MLP, GPT) at ⅓–½ the time: tests/conftest.py
# A transformer that must fail, over 64…256: less range has less power to see growth, so failing there is
# the stricter test (width 512 was over half of each check's cost)
FAILING_WIDTHS = WIDTHS[:3]
LR = {"sgd": 0.1, "adam": 1e-2}
GPT_LR = {"sgd": 1.0, "adam": 1e-2}


def factory(cls, base, mup=True, **parametrize_kw):
    def make(width):
        model = cls(width)
        if mup:
            mt.parametrize(model, base=cls(base), delta=cls(2 * base), **parametrize_kw)
        return model

    return make


def check(make, data, optimizer, lr, widths=WIDTHS, seeds=3):
    return mt.coord_check(make, widths, data, optimizer=optimizer, lr=lr, steps=4, seeds=seeds, progress=False)


# --------------------------------------------------------------------------- correct µP passes


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mup_mlp_passes(optimizer):
    result = check(factory(MLP, 64), MLP_DATA, optimizer, LR[optimizer])
    assert result.passed, str(result)
    assert result.parametrization == "µP"


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mup_cnn_passes(optimizer):
    result = check(factory(CNN, 16), CNN_DATA, optimizer, LR[optimizer], widths=[16, 32, 64, 128, 256])
    assert result.passed, str(result)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mup_tied_gpt_passes(optimizer):
    result = check(factory(GPT, 64), GPT_DATA, optimizer, GPT_LR[optimizer])
    assert result.passed, str(result)
    # attention logits were seen and recorded for both blocks
    attn = {t.module for t in result.trends if t.module.endswith("[attn logits]")}
    assert attn == {"blocks.0.attn [attn logits]", "blocks.1.attn [attn logits]"}


# --------------------------------------------------------------------------- classic mistakes fail


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_standard_parametrization_mlp_fails_at_the_logits(optimizer):
    result = check(factory(MLP, 64, mup=False), MLP_DATA, optimizer, LR[optimizer])
    assert not result.passed
    assert result.parametrization == "SP"
    assert {"readout", "(model output)"} <= set(result.failing_modules())
    logits = next(t for t in result.failures if t.module == "readout")
    # SP logits' updates grow ∝ width (pooled over the 4 steps: ×3.8 over 64→512): far beyond the 1.5× allowed
    assert logits.slope > 0.5 and logits.growth > 3


@pytest.mark.slow
def test_standard_parametrization_transformer_fails_at_the_logits():
    result = check(factory(GPT, 64, mup=False), GPT_DATA, "adam", 1e-2, widths=FAILING_WIDTHS, seeds=2)
    assert not result.passed
    assert "lm_head" in result.failing_modules()
    assert any(m.endswith("[attn logits]") for m in result.failing_modules())
    assert "lm_head" in str(result)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_attention_scaled_by_inverse_sqrt_d_fails_naming_attention(optimizer):
    # 2 seeds (not 3): the logits at init stay flat (slope +0.01 ± 0.02) where µP predicts -0.50, a miss of
    # ~0.5 against the 0.146 allowed, with 2 seeds as with 3 (under Adam the step-4 logits grow too, +0.70)
    result = check(factory(GPT, 64, attention=False), GPT_DATA, optimizer, GPT_LR[optimizer], FAILING_WIDTHS, seeds=2)
    assert not result.passed
    failing = result.failing_modules()
    assert any(m.endswith("[attn logits]") for m in failing), failing
    assert failing[0].endswith("[attn logits]")  # the attention logits are the worst offender


def _sp_readout_mlp(width):
    """µP everywhere but the readout: PyTorch's default init and an unscaled lr."""
    model = MLP(width)
    mt.parametrize(model, base=MLP(64), delta=MLP(128), lr_mult={"output": width / 64})
    model.readout.reset_parameters()
    return model


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_readout_left_in_standard_parametrization_fails(optimizer):
    result = check(_sp_readout_mlp, MLP_DATA, optimizer, LR[optimizer])
    assert not result.passed
    assert "readout" in result.failing_modules()


def test_adam_with_unscaled_hidden_lr_fails_at_the_hidden_layer():
    make = factory(MLP, 64)

    def unscaled(w):
        return mt.parametrize(MLP(w), base=MLP(64), delta=MLP(128), lr_mult={"hidden": w / 64})

    assert check(make, MLP_DATA, "adam", 1e-2).passed
    result = check(unscaled, MLP_DATA, "adam", 1e-2)
    assert not result.passed
    assert result.failing_modules()[0] == "hidden.0"


# --------------------------------------------------------------------------- outputs and losses


class TupleOut(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.mlp = MLP(width)

    def forward(self, x):
        return self.mlp(x), {"aux": torch.zeros(())}


class DictOut(TupleOut):
    def forward(self, x):
        return {"logits": self.mlp(x)}


class LogitsObj(TupleOut):
    class Out:
        def __init__(self, logits):
            self.logits = logits

    def forward(self, x):
        return self.Out(self.mlp(x))


class LossObj(TupleOut):
    """Returns an object with `.loss`, as Hugging Face models do when given labels."""

    def forward(self, x, labels=None):
        logits = self.mlp(x)
        return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


@pytest.mark.parametrize("cls", [TupleOut, DictOut, LogitsObj])
def test_models_returning_tuples_dicts_or_logits_objects(cls):
    result = check(factory(cls, 64), MLP_DATA, "adam", 1e-2, widths=[64, 256, 512], seeds=2)
    assert result.passed
    assert any(t.module == "mlp.readout" for t in result.trends)


def test_model_that_returns_its_loss_and_a_user_loss_fn():
    data = [({"x": x, "labels": y}, None) for x, y in MLP_DATA]
    result = check(factory(LossObj, 64), data, "adam", 1e-2, widths=[64, 256, 512], seeds=2)
    assert result.passed
    calls = []

    def loss_fn(output, target):
        calls.append(1)
        return F.mse_loss(output, F.one_hot(target, 10).float())

    result = mt.coord_check(factory(MLP, 64), [64, 256], MLP_DATA, "sgd", 0.1, steps=2, seeds=1, progress=False)
    user = mt.coord_check(
        factory(MLP, 64), [64, 256], MLP_DATA, "sgd", 0.1, steps=2, seeds=1, loss_fn=loss_fn, progress=False
    )
    assert len(calls) == 2 * 2  # 2 widths × 2 steps

    # a different loss gives different changes
    def get(r):
        return next(t.means for t in r.trends if t.module == "readout" and t.quantity == "change")

    assert get(user) != get(result)[: len(get(user))]


def test_mha_attention_logits_are_recorded():
    result = check(
        factory(MHATransformer, 32),
        [(torch.randn(4, 6, 16), torch.randint(0, 10, (4,)))],
        "adam",
        1e-2,
        widths=[32, 128],
        seeds=1,
    )
    assert any(t.module == "attn [attn logits]" for t in result.trends)


class HandWritten(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.n_head, self.head_dim = 2, width // 2
        self.qkv = nn.Linear(width, 3 * width)
        self.embed = nn.Linear(8, width)
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        h = self.embed(x)
        b, t, c = h.shape
        q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in self.qkv(h).split(c, -1))
        a = mt.attn_logits(self, q, k).softmax(-1) @ v
        return self.out(a.transpose(1, 2).reshape(b, t, c).mean(1))


def test_hand_written_attention_through_the_helper_is_recorded():
    data = [(torch.randn(4, 5, 8), torch.randint(0, 10, (4,)))]
    result = check(factory(HandWritten, 32), data, "adam", 1e-2, widths=[32, 128], seeds=1)
    assert any(t.module == "(model output) [attn logits]" for t in result.trends)


# --------------------------------------------------------------------------- the verdict itself


def _result(values_by_width, quantity="change", seeds=1):
    records = [
        Record("layer", quantity, 1, w, s, v * (1 + 0.01 * s)) for w, v in values_by_width.items() for s in range(seeds)
    ]
    return CoordCheckResult(records, widths=sorted(values_by_width), steps=1, seeds=seeds, optimizer="sgd", lr=0.1)


def test_verdict_threshold_is_growth_per_16x_width():
    assert _result({64: 1.0, 1024: 1.45}).passed
    assert not _result({64: 1.0, 1024: 1.6}).passed
    # over a 4× range the allowed growth is 1.5^(1/2)
    assert _result({64: 1.0, 256: 1.2}).passed
    assert not _result({64: 1.0, 256: 1.3}).passed
    # a change that vanishes (the kernel regime, or Adam's ε swamping shrinking gradients) fails too
    shrinking = _result({64: 1.0, 1024: 0.01})
    assert not shrinking.passed and shrinking.failures[0].reason == "vanishes"
    assert _result({64: 1.0, 1024: 0.5}).passed  # slope −¼: within µP's Θ(1)


def test_verdict_uses_the_scatter_across_seeds():
    # same mean growth (×2 over 16×), tight across seeds: fails; wildly noisy: not significant
    tight = [
        Record("l", "change", 1, w, s, v * (1 + 0.01 * s))
        for w, v in ((64, 1.0), (256, 1.4), (1024, 2.0))
        for s in range(3)
    ]
    noisy = [
        Record("l", "change", 1, w, s, v * (0.2, 1.0, 5.0)[(s + i) % 3])
        for i, (w, v) in enumerate(((64, 1.0), (256, 1.4), (1024, 2.0)))
        for s in range(3)
    ]
    kw = dict(widths=[64, 256, 1024], steps=1, seeds=3, optimizer="sgd", lr=0.1)
    assert not CoordCheckResult(tight, **kw).passed
    assert CoordCheckResult(noisy, **kw).passed


def test_non_finite_values_and_diverged_runs_fail():
    assert not _result({64: 1.0, 1024: float("nan")}).passed
    r = CoordCheckResult(
        [Record("l", "size", 0, w, 0, 1.0) for w in (64, 128)],
        widths=[64, 128],
        steps=1,
        seeds=1,
        optimizer="sgd",
        lr=0.1,
        diverged=[(128, 0, 1)],
    )
    assert not r.passed and "diverged" in str(r)


def test_all_zero_quantities_are_skipped():
    r = _result({64: 0.0, 1024: 0.0}, quantity="size")
    assert r.passed and r.trends == []


def test_diverging_training_is_reported():
    result = check(factory(MLP, 64, mup=False), MLP_DATA, "sgd", 1e6, widths=[64, 256], seeds=1)
    assert not result.passed
    assert result.diverged


# --------------------------------------------------------------------------- exports


def test_exports_csv_json_plot_and_text(tmp_path):
    result = check(factory(MLP, 64, mup=False), MLP_DATA, "adam", 1e-2, widths=[64, 256, 512], seeds=2)
    result.to_csv(tmp_path / "c.csv")
    result.to_json(tmp_path / "c.json")
    result.plot(tmp_path / "c.png")
    lines = (tmp_path / "c.csv").read_text().splitlines()
    assert lines[0].startswith("module,quantity,step,width,mean,std,slope,slope_se,growth,passed")
    n_modules = len({t.module for t in result.trends})
    assert len(lines) - 1 == n_modules * 3 * (1 + 2 * 4)  # widths × (size at 5 steps + change at 4)
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["passed"] is False and data["failures"][0]["module"] in result.failing_modules()
    assert math.isclose(data["max_slope"], math.log(1.5) / math.log(16))
    png = (tmp_path / "c.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    text = str(result)
    assert "FAIL" in text and "readout" in text


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(widths=[64]), "two different"),
        (dict(widths=[64, -1]), "two different"),
        (dict(data=[]), "empty"),
        (dict(optimizer="shampoo"), "optimizer"),
        (dict(lr=0), "lr"),
        (dict(steps=0), "steps"),
        (dict(max_growth=1.0), "max_growth"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(make_model=factory(MLP, 64), widths=[64, 128], data=MLP_DATA, optimizer="sgd", lr=0.1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        mt.coord_check(**args, progress=False)


def test_factory_must_return_a_module():
    with pytest.raises(TypeError, match="nn.Module"):
        mt.coord_check(lambda w: None, [64, 128], MLP_DATA, progress=False)
