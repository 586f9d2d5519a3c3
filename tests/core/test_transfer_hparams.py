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
