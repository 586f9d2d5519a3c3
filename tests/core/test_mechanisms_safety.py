"""Issue 29, items 4, 5, 6, 8, 11: the safety net of `parametrize` on the models of tests/mechanisms_safety.py.

Each test says what the library did before (observed on main at 424b808) and asserts what it does now.
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from torch import nn

import mutransfer as mt
from mechanisms_safety import ClosureForward, DictInput, PatchViT, TinySSM, TwoInput
from mutransfer.errors import ModelError, MuPWarning, OptimizerError


def _mup(cls, width=128, **kw):
    return mt.parametrize(cls(width), base=cls(32), delta=cls(64), **kw)


# ------------------------------------------------------------------ item 4: inputs derived from the model
@pytest.mark.parametrize("cls", [PatchViT, TwoInput])
def test_probe_inputs_from_the_model(cls):
    """Before: a 32-pixel image (65 tokens for a 17-entry positional table) or one argument for a two-input
    forward; the probe failed, roles fell back to types and attention was ASSUMED 1/√d (verified False)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        model = _mup(cls)
    [a] = model._mutransfer_spec.attention
    assert a.verified and a.how == "sdpa"
    assert a.scale == pytest.approx((1 / math.sqrt(8)) * 8 / 32)  # α·s₀·d₀/d, measured
    assert re.search(r"roles from: observed usage on a probe forward \(\d+ parameters\)", mt.describe(model))


def test_attention_that_cannot_be_probed_is_an_error():
    """Before: a warning, then attention set by assuming 1/√d. Now: an error naming example_inputs=."""
    with pytest.raises(ModelError, match="could not run a probe forward.*attention \\(attn\\).*example_inputs="):
        _mup(DictInput)
    batch = {"tokens": torch.randint(0, 50, (1, 6))}  # width-free inputs: the base runs on them too
    model = _mup(DictInput, example_inputs=(batch,))
    assert model._mutransfer_spec.attention[0].verified
    _mup(DictInput, attention=False)  # the user says the model scales its own logits: roles only, warned


def test_example_inputs_for_a_patch_conv_follow_the_positional_table():
    from mutransfer._core.observe import example_inputs

    shapes = [tuple(c.shape) for c in example_inputs(PatchViT(32)) if isinstance(c, torch.Tensor)]
    assert shapes[0] == (1, 3, 16, 16)  # 4×4 patches of 4 pixels + a class token = 17 positions


# ------------------------------------------------------------------ item 5: values that are not weights
def test_ssm_parameters_that_are_not_weights_keep_their_values():
    """Before: A_log × 0.46 and dt_bias × 0.75 (rms(base)/rms(model)), changing the decay and time step."""
    torch.manual_seed(0)
    model = TinySSM(128)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    mt.parametrize(model, base=TinySSM(32), delta=TinySSM(64))
    for name in ("A_log", "dt_bias", "D"):
        assert torch.equal(model.get_parameter(name), before[name]), name
    kept = model._mutransfer_spec.kept_values
    assert kept["A_log"].startswith("structured") and kept["dt_bias"] == "not centred on zero"
    assert "A_log" in mt.describe(model)
    # the hidden weights are still rescaled: in_proj's init × 1/√m relative to the base's rms
    assert model._mutransfer_spec.init_scales["in_proj.weight"] != 1.0


def test_a_width_scaled_vector_init_is_still_rescaled():
    """A raw vector whose init shrinks like 1/√width is a random scale: µP keeps the base's scale."""

    class Net(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.fc = nn.Linear(8, w)
            self.gain = nn.Parameter(torch.randn(w) / math.sqrt(w))
            self.out = nn.Linear(w, 2)

        def forward(self, x):
            return self.out(self.fc(x) * self.gain)

    torch.manual_seed(0)
    model = mt.parametrize(Net(512), base=Net(32), delta=Net(64))
    assert model._mutransfer_spec.init_scales["gain"] == pytest.approx(4.0, rel=0.15)  # √(512/32)
    assert "gain" not in model._mutransfer_spec.kept_values


# ------------------------------------------------------------------ item 6: arguments that do nothing
def test_multipliers_that_match_nothing_warn():
    """Before: output_mult on a model without a readout (and the others) were accepted silently."""

    class Trunk(nn.Module):  # width in, width out: no readout, no embedding, no attention
        def __init__(self, w):
            super().__init__()
            self.fc = nn.Linear(w, w)

        def forward(self, x):
            return self.fc(x)

    with pytest.warns(MuPWarning) as record:
        mt.parametrize(
            Trunk(128),
            base=Trunk(32),
            delta=Trunk(64),
            output_mult=2.0,
            embedding_mult=3.0,
            attn_mult=0.5,
            lr_mult={"output": 2.0},
        )
    text = " ".join(str(r.message) for r in record)
    for arg in ("output_mult=2", "embedding_mult=3", "attn_mult=0.5", "lr_mult['output']=2"):
        assert arg in text, arg
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        _mup(PatchViT, output_mult=2.0, attn_mult=0.5)  # both act here: no warning


# ------------------------------------------------------------------ item 8: the safety net after parametrize
def test_a_plain_optimizer_over_a_mup_model_is_caught():
    """Before: no warning at all, and check_lr_ratios returned None."""
    model = _mup(PatchViT)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    with pytest.warns(MuPWarning, match="mt.param_groups"):
        opt.step()
    with pytest.raises(OptimizerError, match="not built by mt.param_groups"):
        mt.optim.check_lr_ratios(opt)
    good = torch.optim.AdamW(mt.param_groups(model, lr=1e-3, optimizer="adamw"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        good.step()
    mt.optim.check_lr_ratios(good)


def test_a_plain_optimizer_at_base_width_is_fine():
    """At base width µP is the user's model: one lr for all is right, so nothing is said."""
    model = mt.parametrize(PatchViT(32), base=PatchViT(32), delta=PatchViT(64))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        opt.step()
    mt.optim.check_lr_ratios(opt)


def test_layers_added_or_replaced_after_parametrize():
    """Before: a raw KeyError in param_groups (added) and stale factors used silently (replaced)."""
    model = _mup(PatchViT)
    model.extra = nn.Linear(128, 4)
    with pytest.raises(ModelError, match="'extra.weight' .* was added after mt.parametrize"):
        mt.param_groups(model, lr=1e-3)
    del model.extra
    model.head = nn.Linear(128, 20)  # a wider readout
    with pytest.raises(ModelError, match="'head.weight' has shape \\(20, 128\\).*recorded \\(10, 128\\)"):
        mt.param_groups(model, lr=1e-3)


# ------------------------------------------------------------------ item 11: closures, and what is in effect
def test_export_of_a_deeper_wider_model_whose_forward_is_a_closure():
    """Before: "module 'blocks.0.mlp' did not run on the probe forward" — the copies export makes shared
    the closure, which ran the original's layers. Now the copies' forwards run the copies."""
    model = mt.parametrize(
        ClosureForward(64, 4), base=ClosureForward(32, 2), delta=ClosureForward(48, 2), formulation="table8"
    )
    assert model._mutransfer_spec.branches  # depth multipliers as forward constants
    plain = mt.export(model)
    assert type(plain) is ClosureForward and "_mutransfer_spec" not in plain.__dict__
    ids = torch.randint(0, 50, (2, 8))
    torch.testing.assert_close(plain(ids), model(ids), rtol=1e-5, atol=1e-6)
    before = plain(ids)
    with torch.no_grad():
        next(plain.blocks[0].mlp.parameters()).mul_(2.0)  # the exported forward runs the exported layers
    assert not torch.allclose(plain(ids), before)


def test_a_constant_on_a_module_with_an_instance_forward_is_refused():
    """A constant installed by switching the class would not run under an instance-level forward."""

    class Net(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.embed = nn.Embedding(50, w)
            self.head = nn.Linear(w, 50)
            self.head.forward = lambda x, f=self.head.forward: f(x)

        def forward(self, ids):
            return self.head(self.embed(ids))

    with pytest.raises(ModelError, match="'head' needs a µP forward constant.*set on the instance"):
        mt.parametrize(Net(128), base=Net(32), delta=Net(64), formulation="table8")


def test_describe_never_prints_a_constant_that_is_not_in_effect():
    """Before: a readout replaced after parametrize still showed "head input ×0.25" though nothing applied it."""
    model = _mup(PatchViT, formulation="table8")
    assert "head input ×0.25" in mt.describe(model) and "NOT in effect" not in mt.describe(model)
    model.head = nn.Linear(128, 10)  # same shape, plain class: the readout multiplier is gone
    assert "head input ×0.25 (NOT in effect: the module was replaced or changed after parametrize)" in mt.describe(
        model
    )
