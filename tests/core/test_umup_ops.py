"""u-µP's unit rules for nonlinearities written out in elementary ops (issue 50): Hugging Face GPT-2's
``NewGELUActivation`` is tanh-GELU in mul/pow/add/tanh; the probe recognises it by its values."""

import math
import warnings

import pytest
import torch
from torch import nn

import mutransfer as mt
from mutransfer._core.spec import find_spec
from mutransfer._core.unit_ops import activation_scale, find_unit_ops
from mutransfer.errors import MuPWarning


class NewGELU(nn.Module):
    """transformers.activations.NewGELUActivation, written out the same way."""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class SiLUWrittenOut(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class Mlp(nn.Module):
    def __init__(self, width, act):
        super().__init__()
        self.inp, self.act, self.mid, self.out = nn.Linear(16, width), act, nn.Linear(width, width), nn.Linear(width, 4)

    def forward(self, x):
        return self.out(self.mid(self.act(self.inp(x))))


class ScaledThenGelu(nn.Module):
    """x · 0.5 · (1 + tanh(…)) of a layer's output times 3: no nonlinearity of that output."""

    def forward(self, x):
        return NewGELU()(x) * 3.0 + x


X = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))


def build(act, width=256):
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = mt.parametrize(
            Mlp(width, act), base=Mlp(32, act), delta=Mlp(64, act), parametrization="u-mup", example_inputs=X
        )
    return model, [str(w.message) for w in caught if issubclass(w.category, MuPWarning)]


def test_written_out_tanh_gelu_gets_gelus_unit_scale():
    model, msgs = build(NewGELU())
    assert not [m for m in msgs if "no unit rule" in m], msgs  # before: "'mid' … pow, mul, add, tanh … no unit rule"
    plan = find_spec(model).umup
    sigma = activation_scale("gelu", 1.0, (("approximate", "tanh"),))
    assert [(c, f) for c, f, _ in plan.activations] == [("mid", "gelu")]
    assert plan.activations[0][2] == pytest.approx(sigma)
    c = {(m, str(s)): v for m, s, v in plan.constants}
    # 1/σ of the unit GELU on the input; the scaled matmul's 1/√fan_in on the output (nn.Linear's nonzero
    # bias shifted by abc-symmetry)
    assert c[("mid", "input ×")] == pytest.approx(1 / sigma)
    assert c[("mid", "output ×")] == pytest.approx(256**-0.5)
    seen = {}
    model.mid.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    with torch.no_grad():
        model(torch.randn(512, 16))
    x = seen["x"] / sigma  # the unit GELU's output
    assert 0.8 < float(x.pow(2).mean().sqrt()) < 1.25


def test_the_probe_tells_tanh_gelu_from_erf_gelu_and_silu_written_out():
    x = X * 4  # values out to |x| ≈ 10: the candidates differ by ≫ float error
    found = find_unit_ops(Mlp(64, NewGELU()), x).activations
    assert [(a.function, a.kwargs) for a in found] == [("gelu", (("approximate", "tanh"),))]
    found = find_unit_ops(Mlp(64, SiLUWrittenOut()), x).activations
    assert [(a.function, a.kwargs) for a in found] == [("silu", ())]


def test_an_expression_that_is_no_known_nonlinearity_is_still_named():
    _, msgs = build(ScaledThenGelu())
    assert any("'mid'" in m and "no unit rule" in m for m in msgs), msgs
