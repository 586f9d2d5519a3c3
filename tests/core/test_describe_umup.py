"""describe on u-µP models (issue 50): the shifted biases and the multipliers moved into an init are
described as what is in effect on the model now (observe, don't assume)."""

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import mutransfer as mt
from mutransfer._core.spec import find_spec
from mutransfer.errors import MuPWarning
from mutransfer.recipes import GPT
from mutransfer.scaled_forward import OUTPUT_ATTR


def umup_gpt(width=128):
    torch.manual_seed(0)
    return mt.parametrize(GPT(width), base=GPT(64), delta=GPT(128), parametrization="u-mup")


def line_of(text, start):
    hits = [line for line in text.splitlines() if line.startswith(start)]
    assert len(hits) == 1, text
    return hits[0]


def test_a_shifted_zero_bias_is_described_as_a_shift_not_as_an_init_std():
    model = umup_gpt()
    plan = find_spec(model).umup
    assert plan.folded["blocks.0.attn.qkv.bias"] == pytest.approx(128**0.5)
    assert plan.shifted["blocks.0.attn.qkv.bias"] == "blocks.0.attn.qkv"
    text = mt.describe(model)
    # before: "multiplier in the init (no layer carries it): blocks.0.attn.qkv.bias std 11.31" — the bias is zero
    assert "multiplier in the init" not in text and "std 11.31" not in text
    line = line_of(text, "shifted bias blocks.0.attn.qkv.bias")
    assert "zero now" in line and "output, bias included, by 0.08839" in line
    assert "Adam lr × 11.31" in line and "ε × 0.08839" in line
    # fc_out's output carries the τ rule's multiplier too: read off the module, not assumed
    line = line_of(text, "shifted bias blocks.0.fc_out.bias")
    assert "by 0.03125" in line and "0.7071 of its other scales" in line


def test_describe_reads_the_shift_off_the_model_as_it_is_now():
    model = umup_gpt()
    with torch.no_grad():
        model.blocks[0].fc.bias.fill_(0.5)
    del model.blocks[0].attn.qkv.__dict__[OUTPUT_ATTR]  # the layer's multiplier gone after parametrize
    text = mt.describe(model)
    assert "RMS now 0.5" in line_of(text, "shifted bias blocks.0.fc.bias")
    assert "NOT in effect" in line_of(text, "shifted bias blocks.0.attn.qkv.bias")
    assert "NOT in effect" not in line_of(text, "shifted bias blocks.1.attn.qkv.bias")


class _RawHidden(nn.Module):
    """A hidden weight used by the model's own forward (not a layer): u-µP's factor goes into its init."""

    def __init__(self, width):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.mid = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        return self.out(F.relu(F.linear(F.relu(self.inp(x)), self.mid)))


def test_a_weight_with_its_multiplier_in_the_init_is_described_with_its_rms_now():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MuPWarning)
        torch.manual_seed(0)
        model = mt.parametrize(
            _RawHidden(256),
            base=_RawHidden(32),
            delta=_RawHidden(64),
            parametrization="u-mup",
            example_inputs=torch.randn(4, 16),
        )
    plan = find_spec(model).umup
    assert plan.folded["mid"] == pytest.approx(256**-0.5) and "mid" not in plan.shifted
    line = line_of(mt.describe(model), "multiplier in the init (no layer carries it): mid")
    rms = float(model.mid.detach().double().pow(2).mean().sqrt())
    assert rms == pytest.approx(1 / 16, rel=0.05)
    assert "std 0.0625" in line and f"RMS now {rms:.4g}" in line
