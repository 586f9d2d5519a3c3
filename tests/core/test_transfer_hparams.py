"""`mt.transfer_hparams`: each rule's numbers, each refusal's message, the printed table."""

import math
import pickle
import warnings

import pytest

import mutransfer as mt
from mutransfer.errors import HParamTransferError, MuPWarning
from mutransfer.sweep.scale import Scale as SweepScale

P = mt.Scale(width=256, depth=4, batch_size=64, tokens=1e9)


def _t(**kw):
    return mt.Scale(**{"width": 1024, "depth": 8, "batch_size": 64, "tokens": 1e9, **kw})


def test_one_scale_for_sweeps_and_transfers():
    assert SweepScale is mt.Scale
    old = SweepScale(32, 32, "mup", 0, 4, 2)  # the positional form objectives and tests use
    assert (old.width, old.base_width, old.depth, old.base_depth, old.batch_size, old.tokens) == (
        32,
        32,
        4,
        2,
        None,
        None,
    )
    new = mt.Scale(width=256, depth=8, batch_size=512, tokens=2e9)
    assert new.base_width is None and new.mup
    assert pickle.loads(pickle.dumps(new)) == new


def test_width_and_depth_keep_the_base_values():
    out = mt.transfer_hparams({"lr": 3e-3, "weight_decay": 0.1}, P, _t(), critical_batch=1024)
    assert out.hparams == {"lr": 3e-3, "weight_decay": 0.1}
    first = out.rules[0]
    assert first.rule == "µP" and "base lr kept, per-layer factors by mt.param_groups" in first.regime
    assert "width 256 → 1024" in first.regime and "depth 4 → 8" in first.regime


@pytest.mark.parametrize(("optimizer", "factor"), [("adamw", 2.0), ("adam", 2.0), ("sgd", 4.0)])
def test_batch_rule_per_optimizer(optimizer, factor):
    out = mt.transfer_hparams({"lr": 1e-3}, P, _t(batch_size=256), optimizer=optimizer, critical_batch=2048)
    assert out.hparams["lr"] == pytest.approx(1e-3 * factor)
    batch = next(r for r in out.rules if r.rule.startswith("batch"))
    formula = "η ∝ B" if optimizer == "sgd" else "η ∝ √B"
    assert batch.rule == f"batch: {formula}"
    assert batch.regime.startswith("B = 256 is below the critical batch 2048")


def test_batch_rule_overrides():
    keep = mt.transfer_hparams({"lr": 1e-3}, P, _t(batch_size=256), rules={"batch": "none"})
    assert keep.hparams["lr"] == 1e-3 and "on purpose" in str(keep)
    lion = mt.transfer_hparams(
        {"lr": 1e-4}, P, _t(batch_size=256), optimizer="lion", rules={"batch": "sqrt"}, critical_batch=256
    )
    assert lion.hparams["lr"] == pytest.approx(2e-4) and "is at the critical batch 256" in str(lion)
    with pytest.raises(HParamTransferError, match=r"no batch-size rule for optimizer 'lion'.*rules=\{'batch'"):
        mt.transfer_hparams({"lr": 1e-4}, P, _t(batch_size=256), optimizer="lion", critical_batch=2048)


def test_batch_change_needs_the_critical_batch_and_stays_below_it():
    with pytest.raises(HParamTransferError, match=r"critical_batch= is needed.*McCandlish.*rules=\{'batch': 'none'\}"):
        mt.transfer_hparams({"lr": 1e-3}, P, _t(batch_size=256))
    with pytest.raises(HParamTransferError, match=r"target.batch_size 4096 is above critical_batch 2048.*surge"):
        mt.transfer_hparams({"lr": 1e-3}, P, _t(batch_size=4096), critical_batch=2048)


def test_tau_rule_for_weight_decay():
    # B ×4 (√ rule: η ×2), D ×4: λ × B/(η·D) = 4/(2·4) = 1/2
    out = mt.transfer_hparams({"lr": 1e-3, "weight_decay": 0.1}, P, _t(batch_size=256, tokens=4e9), critical_batch=2048)
    assert out.hparams["lr"] == pytest.approx(2e-3)
    assert out.hparams["weight_decay"] == pytest.approx(0.05)
    tau = out.rules[-1]
    assert tau.rule == "τ rule" and "η ×2, B ×4, D ×4 ⇒ λ ×0.5" in tau.regime
    # horizon only: λ ∝ 1/D; the horizon keeps lr and says why
    longer = mt.transfer_hparams({"lr": 1e-3, "weight_decay": 0.1}, P, _t(tokens=1e10))
    assert longer.hparams == {"lr": 1e-3, "weight_decay": pytest.approx(0.01)}
    assert any("no rule: η*(D) needs a measured fit" in r.regime for r in longer.rules)
    same = mt.transfer_hparams(
        {"lr": 1e-3, "weight_decay": 0.1},
        P,
        _t(batch_size=256, tokens=4e9),
        rules={"weight_decay": "independent"},
        critical_batch=2048,
    )
    assert same.hparams["weight_decay"] == 0.1


def test_tau_rule_needs_tokens_and_other_optimizers_choose():
    no_tokens = mt.Scale(width=256, batch_size=64)
    with pytest.raises(HParamTransferError, match=r"τ rule for weight_decay needs tokens on both scales"):
        mt.transfer_hparams({"lr": 1e-3, "weight_decay": 0.1}, no_tokens, mt.Scale(width=512, batch_size=64))
    with pytest.raises(HParamTransferError, match=r"no default weight-decay rule for optimizer 'sgd'.*'independent'"):
        mt.transfer_hparams({"lr": 1e-1, "weight_decay": 1e-4}, P, _t(), optimizer="sgd")
    zero = mt.transfer_hparams({"lr": 1e-1, "weight_decay": 0.0}, P, _t(), optimizer="sgd")
    assert zero.hparams["weight_decay"] == 0.0
    no_horizon = mt.transfer_hparams({"lr": 1e-3, "weight_decay": 0.0}, no_tokens, mt.Scale(width=512, batch_size=64))
    assert no_horizon.hparams["weight_decay"] == 0.0 and "λ = 0 stays 0" in str(no_horizon)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hparams": {"wd": 0.1}}, r"hparams has no 'lr'"),
        ({"hparams": {"lr": -1.0}}, r"hparams\['lr'\] must be a positive number"),
        ({"hparams": {"lr": 1e-3, "weight_decay": -0.1}}, r"hparams\['weight_decay'\] must be a number ≥ 0"),
        ({"proxy": mt.Scale(width=0)}, r"proxy.width must be a positive integer"),
        ({"target": _t(batch_size=0)}, r"target.batch_size must be a positive integer"),
        ({"target": _t(tokens=-1.0)}, r"target.tokens must be a positive number"),
        ({"target": _t(tokens=None)}, r"tokens is set on the proxy only"),
        ({"target": _t(width=128)}, r"target.width 128 is below proxy.width 256"),
        ({"target": _t(depth=2)}, r"target.depth 2 is below proxy.depth 4"),
        ({"optimizer": "shampoo"}, r"unknown optimizer 'shampoo'; use one of sgd, adam, adamw"),
        ({"rules": {"batchsize": "sqrt"}}, r"unknown rules key 'batchsize'; use 'batch', 'weight_decay'"),
        ({"rules": {"batch": "cube"}}, r"unknown rules\['batch'\] value 'cube'; use one of 'auto'"),
        ({"critical_batch": 0}, r"critical_batch must be a positive number"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, match):
    args = {"hparams": {"lr": 1e-3}, "proxy": P, "target": _t(), **kwargs}
    with pytest.raises(HParamTransferError, match=match) as info:
        mt.transfer_hparams(**args)
    assert isinstance(info.value, ValueError)


def test_str_lists_every_rule_applied():
    out = mt.transfer_hparams(
        {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.95)}, P, _t(batch_size=256, tokens=4e9), critical_batch=2048
    )
    text = str(out)
    lines = text.splitlines()
    assert (
        lines[0]
        == "hyperparameters from (width 256, depth 4, batch 64, tokens 1e+09) to (width 1024, depth 8, batch 256, tokens 4e+09)"
    )
    assert len(lines) == 1 + len(out.rules) == 7
    for record in out.rules:
        assert record.rule in text and record.regime in text
        assert "\n" not in str(record)
        assert set(record.as_dict()) == {"hparam", "from", "to", "rule", "regime", "source"}
    assert "betas" in text and "kept" in text
    assert math.isclose(out.rules[2].as_dict()["to"], 2e-3)


def test_tau_rule_warns_when_the_model_grows_and_not_when_only_batch_and_tokens_change():
    # Power Lines: the optimal τ is a power law in tokens per parameter, so keeping τ is exact only at the
    # same model size; a larger model changes D/N, which the rule does not correct: said, and warned
    hp = {"lr": 1e-3, "weight_decay": 0.1}
    with pytest.warns(MuPWarning, match="tokens per parameter"):
        out = mt.transfer_hparams(hp, P, _t(tokens=4e9))
    assert "measured power law in D/N" in out.rules[-1].regime
    same_model = mt.Scale(width=256, depth=4, batch_size=64, tokens=4e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = mt.transfer_hparams(hp, P, same_model)
    assert out.hparams["weight_decay"] == pytest.approx(0.025) and "D/N" not in out.rules[-1].regime


# ----------------------------------------------------------------------------- measured laws (measured=)


def _law(hparam="lr", axis="batch_size", exponent=0.4, validated=True, reference=16.0, value=1e-3, **kw):
    held = kw.pop("held_out", 128.0)
    return mt.MeasuredLaw(
        hparam=hparam,
        axis=axis,
        exponent=exponent,
        exponent_interval=(exponent - 0.1, exponent + 0.1),
        reference=reference,
        value_at_reference=value,
        fit_range=(reference, held / 2),
        held_out=held,
        held_out_optimum=value * (held / reference) ** exponent,
        prediction_interval=(
            0.9 * value * (held / reference) ** exponent,
            1.1 * value * (held / reference) ** exponent,
        ),
        validated=validated,
        n_points=3,
        **kw,
    )


PB = mt.Scale(width=256, batch_size=16, tokens=1e6)


def test_a_validated_measured_batch_law_replaces_the_sqrt_rule_and_needs_no_critical_batch():
    out = mt.transfer_hparams({"lr": 1e-3}, PB, mt.Scale(width=1024, batch_size=64, tokens=4e6), measured=[_law()])
    assert out.hparams["lr"] == pytest.approx(1e-3 * 4**0.4)
    batch = next(r for r in out.rules if r.rule.startswith("batch"))
    assert batch.rule == "batch: measured η ∝ B^0.40 [0.30, 0.50]" and batch.source == "measured on this sweep"
    assert "fit on B = 16…64 (3 optima), held-out B = 128: measured" in batch.regime and "inside" in batch.regime
    assert "B 16 → 64" in batch.regime


def test_a_law_that_failed_its_check_or_a_reason_leaves_the_default_rule_and_says_why():
    failed = mt.transfer_hparams(
        {"lr": 1e-3},
        PB,
        mt.Scale(width=256, batch_size=64, tokens=1e6),
        measured=[_law(validated=False)],
        critical_batch=1024,
    )
    assert failed.hparams["lr"] == pytest.approx(2e-3)
    batch = next(r for r in failed.rules if r.rule.startswith("batch"))
    assert batch.rule == "batch: η ∝ √B" and "measured η ∝ B^0.40 [0.30, 0.50] not used: it failed" in batch.regime
    reason = {"lr": {"batch_size": "lr along batch_size: the optima are not monotone"}}
    told = mt.transfer_hparams(
        {"lr": 1e-3}, PB, mt.Scale(width=256, batch_size=64, tokens=1e6), measured=reason, critical_batch=1024
    )
    assert "measured η*(B) not used: lr along batch_size: the optima are not monotone" in str(told)
    chosen = mt.transfer_hparams(
        {"lr": 1e-3},
        PB,
        mt.Scale(width=256, batch_size=64, tokens=1e6),
        measured=[_law()],
        rules={"batch": "none"},
    )
    assert chosen.hparams["lr"] == 1e-3 and "not used: rules= chooses the rule" in str(chosen)


def test_measured_horizon_and_weight_decay_laws_replace_no_rule_and_the_tau_rule():
    laws = [
        _law("lr", "steps", exponent=-0.5, reference=100.0, held_out=800.0),
        _law("weight_decay", "batch_size", exponent=1.0, value=0.1),
        _law("weight_decay", "steps", exponent=-1.0, reference=100.0, held_out=800.0, value=0.1),
    ]
    # B ×2 at tokens ×8: steps ×4
    out = mt.transfer_hparams(
        {"lr": 1e-3, "weight_decay": 0.1},
        PB,
        mt.Scale(width=256, batch_size=32, tokens=8e6),
        measured=laws,
        critical_batch=1024,
    )
    assert out.hparams["lr"] == pytest.approx(1e-3 * 2**0.5 * 4**-0.5)  # √B default, then measured S^-0.5
    assert out.hparams["weight_decay"] == pytest.approx(0.1 * 2 / 4)
    rules = [r.rule for r in out.rules]
    assert "horizon: measured η ∝ S^-0.50 [-0.60, -0.40]" in rules
    assert (
        "batch: measured λ ∝ B^1.00 [0.90, 1.10]" in rules and "horizon: measured λ ∝ S^-1.00 [-1.10, -0.90]" in rules
    )
    assert not any(r.startswith("τ") for r in rules)
    assert "S 100 → 400" in str(out)
    # λ*(S) missing while the horizon changes: the τ rule, and why
    tau = mt.transfer_hparams(
        {"lr": 1e-3, "weight_decay": 0.1},
        PB,
        mt.Scale(width=256, batch_size=32, tokens=8e6),
        measured=laws[:2],
        critical_batch=1024,
    )
    assert tau.rules[-1].rule == "τ rule" and "λ*(S) was not measured and horizon changes" in tau.rules[-1].regime


def test_a_measured_law_past_a_decade_needs_extrapolate():
    far = mt.Scale(width=256, batch_size=4096, tokens=1e6)  # 32× past 128
    with pytest.raises(
        HParamTransferError,
        match=r"target.batch_size 4096 is 32× beyond the measured range B = 16…128.*extrapolate=True",
    ):
        mt.transfer_hparams({"lr": 1e-3}, PB, far, measured=[_law()])
    with pytest.warns(MuPWarning, match=r"extrapolating: target.batch_size 4096 is 32× beyond"):
        out = mt.transfer_hparams({"lr": 1e-3}, PB, far, measured=[_law()], extrapolate=True)
    assert out.hparams["lr"] == pytest.approx(1e-3 * 256**0.4)


def test_bad_measured_input_is_named():
    with pytest.raises(HParamTransferError, match=r"MeasuredLaw.hparam must be one of lr, weight_decay"):
        _law(hparam="momentum")
    with pytest.raises(HParamTransferError, match=r"MeasuredLaw for lr along batch_size: every number must be finite"):
        _law(value=-1.0)
    with pytest.raises(HParamTransferError, match=r"measured\['lr'\]\['steps'\] holds the law of lr along batch_size"):
        mt.transfer_hparams({"lr": 1e-3}, PB, PB, measured={"lr": {"steps": _law()}})
    with pytest.raises(HParamTransferError, match=r"measured holds two laws of lr along batch_size"):
        mt.transfer_hparams({"lr": 1e-3}, PB, PB, measured=[_law(), _law()])
    with pytest.raises(TypeError, match=r"measured must hold MeasuredLaw objects"):
        mt.transfer_hparams({"lr": 1e-3}, PB, PB, measured=[0.5])
