"""Role classification and the exact lr / ε / weight-decay / init factors of every group."""

import pytest
import torch
from torch import nn

import mutransfer as mt
from model_helpers import build
from mutransfer.recipes import CNN, GPT, MLP, MHATransformer

M = 4.0  # width 256 over base 64


def roles_of(model):
    return {n: i.role for n, i in model._mutransfer_spec.params.items()}


def group_of(groups, param):
    return next(g for g in groups if any(p is param for p in g["params"]))


def test_mlp_roles_and_factors():
    m = build(MLP, 256, 64)
    assert roles_of(m) == {
        "input.weight": "input",
        "input.bias": "vector",
        "hidden.0.weight": "hidden",
        "hidden.0.bias": "vector",
        "readout.weight": "output",
        "readout.bias": "scalar",
    }
    lr, eps, wd = 1e-2, 1e-8, 0.1
    adam = mt.param_groups(m, lr, "adamw", eps=eps, weight_decay=wd)
    sgd = mt.param_groups(m, lr, "sgd", weight_decay=wd)
    expected = {  # name: (adam lr×, adam ε×, sgd lr×)
        "input.weight": (1, 1 / M, M),
        "input.bias": (1, 1 / M, M),
        "hidden.0.weight": (1 / M, 1 / M, 1),
        "hidden.0.bias": (1, 1 / M, M),
        "readout.weight": (1 / M, 1, 1 / M),
        "readout.bias": (1, 1, 1),
    }
    params = dict(m.named_parameters())
    for name, (a_lr, a_eps, s_lr) in expected.items():
        g = group_of(adam, params[name])
        assert g["lr"] == pytest.approx(lr * a_lr, rel=1e-12), name
        assert g["eps"] == pytest.approx(eps * a_eps, rel=1e-12), name
        assert g["lr"] * g["weight_decay"] == pytest.approx(lr * wd, rel=1e-12), name  # lr·wd constant
        s = group_of(sgd, params[name])
        assert s["lr"] == pytest.approx(lr * s_lr, rel=1e-12), name
        assert "eps" not in s
    independent = mt.param_groups(m, lr, "adamw", weight_decay=wd, weight_decay_policy="independent")
    assert {g["weight_decay"] for g in independent} == {wd}


def _std_ratio(model, base, name):
    return model.get_parameter(name).std().item() / base.get_parameter(name).std().item()


def test_mlp_init_is_rescaled_relative_to_the_base_init():
    torch.manual_seed(0)
    base, target = MLP(64, d_in=128), MLP(1024, d_in=128)
    ref_sp = {n: p.std().item() for n, p in target.named_parameters()}
    mt.parametrize(target, base=base, delta=MLP(128, d_in=128))
    # µP: hidden std × 1/√m, output std × 1/m, input and biases × 1 relative to the base
    assert _std_ratio(target, base, "hidden.0.weight") == pytest.approx(16**-0.5, rel=0.03)
    assert _std_ratio(target, base, "readout.weight") == pytest.approx(1 / 16, rel=0.05)
    assert _std_ratio(target, base, "input.weight") == pytest.approx(1.0, rel=0.03)
    assert _std_ratio(target, base, "hidden.0.bias") == pytest.approx(1.0, rel=0.2)
    # PyTorch's default init already gives hidden weights 1/√fan_in: µP leaves it at the SP value
    assert target.hidden[0].weight.std().item() == pytest.approx(ref_sp["hidden.0.weight"], rel=0.05)


def test_constant_std_init_is_rescaled_too():
    # GPT's init is N(0, 0.02) at every width; µP must still shrink hidden weights by 1/√m.
    torch.manual_seed(0)
    base, target = GPT(64), GPT(256)
    mt.parametrize(target, base=base, delta=GPT(128))
    assert target.get_parameter("blocks.0.fc.weight").std().item() == pytest.approx(0.02 / 2, rel=0.03)
    assert target.get_parameter("wte.weight").std().item() == pytest.approx(0.02, rel=0.03)
    assert torch.all(target.get_parameter("ln_f.weight") == 1.0)  # ones stay ones
    assert torch.all(target.get_parameter("blocks.0.fc.bias") == 0.0)  # zeros stay zeros


def test_cnn_roles_and_factors():
    m = build(CNN, 256, 64)
    r = roles_of(m)
    assert r["conv1.weight"] == "input" and r["conv2.weight"] == "hidden"
    assert r["bn1.weight"] == "vector" and r["bn2.bias"] == "vector"
    assert r["readout.weight"] == "output" and r["readout.bias"] == "scalar"
    groups = mt.param_groups(m, 1.0, "adam")
    assert group_of(groups, m.conv2.weight)["lr"] == 1 / M
    assert group_of(groups, m.conv1.weight)["lr"] == 1.0
    assert group_of(groups, m.bn2.weight)["eps"] == pytest.approx(1e-8 / M)
    assert _std_ratio(m, CNN(64), "conv2.weight") == pytest.approx(0.5, rel=0.05)


def test_gpt_with_tied_embeddings():
    m = build(GPT, 256, 64)
    spec = m._mutransfer_spec
    info = spec.params["wte.weight"]
    assert info.role == "input" and info.tied_readouts == ["lm_head"]
    assert "lm_head.weight" not in spec.params  # one parameter, two uses
    assert spec.params["blocks.0.attn.qkv.weight"].role == "hidden"
    assert spec.params["blocks.0.ln1.weight"].role == "vector"
    assert spec.params["wpe.weight"].role == "input"
    # Table 8 on the tied readout: the readout's input is multiplied by 1/m
    assert spec.forward_constants == {"lm_head": ("input ×", 1 / M)}
    groups = mt.param_groups(m, 1.0, "adam")
    assert group_of(groups, m.wte.weight)["lr"] == 1.0
    assert group_of(groups, m.wte.weight)["eps"] == pytest.approx(1e-8 / M)
    assert group_of(groups, m.blocks[0].fc.weight)["lr"] == 1 / M
    # attention: head dim grows 16 → 64 at 4 heads, so logits get √16/64 instead of 1/√64
    assert [(a.module, a.how, a.d0, a.d) for a in spec.attention] == [
        ("blocks.0.attn", "sdpa", 16, 64),
        ("blocks.1.attn", "sdpa", 16, 64),
    ]


def test_multihead_attention_model():
    m = build(MHATransformer, 256, 64)
    r = roles_of(m)
    assert r["attn.in_proj_weight"] == "hidden" and r["attn.out_proj.weight"] == "hidden"
    assert r["attn.in_proj_bias"] == "vector" and r["embed.weight"] == "input"
    assert type(m.attn).__name__ == "MuMultiheadAttention"
    assert isinstance(m.attn, nn.MultiheadAttention)
    groups = mt.param_groups(m, 1.0, "sgd")
    assert group_of(groups, m.attn.in_proj_weight)["lr"] == 1.0
    assert group_of(groups, m.attn.in_proj_bias)["lr"] == M
    assert group_of(groups, m.readout.weight)["lr"] == 1 / M


class RawParams(nn.Module):
    """A custom module with raw parameters, one stored (in, out) like GPT-2's Conv1D."""

    def __init__(self, width, d_in=8, d_out=3):
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(width, d_in))
        self.w_hid = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.w_out_t = nn.Parameter(torch.randn(width, d_out) / width**0.5)  # (in, out)
        self.gain = nn.Parameter(torch.ones(width))
        self.temperature = nn.Parameter(torch.ones(()))

    def forward(self, x):
        h = torch.relu(x @ self.w_in.T) * self.gain
        h = torch.relu(h @ self.w_hid.T)
        return (h @ self.w_out_t) * self.temperature


def test_raw_parameters_convention_and_overrides():
    m = build(RawParams, 256, 64)
    assert roles_of(m) == {
        "w_in": "vector",
        "w_hid": "hidden",
        "w_out_t": "vector",
        "gain": "vector",
        "temperature": "scalar",
    }
    torch.manual_seed(0)
    m = RawParams(256)
    mt.parametrize(m, base=RawParams(64), delta=RawParams(128), roles={"w_out_t": "output"}, transposed=["w_out_t"])
    info = m._mutransfer_spec.params["w_out_t"]
    assert info.role == "output" and (info.m_in, info.m_out) == (M, 1.0)
    assert group_of(mt.param_groups(m, 1.0, "adam"), m.w_out_t)["lr"] == 1 / M


def test_hf_style_conv1d_is_recognised_as_transposed():
    class Conv1D(nn.Module):  # the layout of transformers.pytorch_utils.Conv1D
        def __init__(self, nf, nx):
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            return x @ self.weight + self.bias

    class Net(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.c_fc = Conv1D(w, 10)
            self.c_proj = Conv1D(w, w)
            self.head = Conv1D(5, w)

        def forward(self, x):
            return self.head(self.c_proj(self.c_fc(x)))

    m = build(Net, 256, 64)
    assert roles_of(m) == {
        "c_fc.weight": "input",
        "c_fc.bias": "vector",
        "c_proj.weight": "hidden",
        "c_proj.bias": "vector",
        "head.weight": "output",
        "head.bias": "scalar",
    }


def test_describe_lists_every_parameter():
    m = build(GPT, 256, 64)
    text = mt.describe(m)
    for name in m._mutransfer_spec.params:
        assert name in text
    assert "input (tied readout)" in text
    assert "lm_head input ×0.25" in text
    assert "d₀=16, d=64" in text
