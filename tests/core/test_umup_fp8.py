"""u-µP and FP8 (issue 50 item 4): unit-scale matmul operands (the 1/√fan_in on the matmul's output),
a unit attention output, few operands below E4M3's smallest normal, and a unit-scaled backward."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import mutransfer as mt
from mutransfer._core.fp8 import SDPA
from mutransfer._core.spec import find_spec
from mutransfer._core.unit_ops import attention_output_scale
from mutransfer.precision import fp8_simulation, fp8_underflow
from mutransfer.recipes import GPT, Llama

CTX = 32
TOKENS = torch.randint(0, 256, (4, CTX), generator=torch.Generator().manual_seed(0))


def rms(t):
    return float(t.detach().double().pow(2).mean().sqrt())


def gpt(w):
    return GPT(w, n_layer=2, n_head=4, ctx=CTX, tied=False)


def llama(w):
    return Llama(w)


def build(make, width, parametrization="u-mup"):
    torch.manual_seed(0)
    model = make(width)
    return mt.parametrize(
        model, base=make(32), delta=make(64), parametrization=parametrization, example_inputs=TOKENS[:2]
    )


class _Operands(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.linear: list[tuple[float, float]] = []
        self.sdpa: list[tuple[float, float, float]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            self.linear.append((rms(args[0]), rms(args[1])))
        elif func is SDPA:
            self.sdpa.append(tuple(rms(a) for a in args[:3]))
        return func(*args, **kwargs)


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_every_matmul_sees_unit_scale_operands_at_init(make):
    model = build(make, 256)
    seen = _Operands()
    with torch.no_grad(), seen:
        model(TOKENS)
    assert len(seen.linear) >= 9 and seen.sdpa
    for x, w in seen.linear:  # input and weight of every Linear (the readout included)
        assert 0.5 <= x <= 2.0 and 0.5 <= w <= 2.0, seen.linear
    for q, k, v in seen.sdpa:  # what the FP8 simulation casts to E4M3 in attention
        assert all(0.5 <= a <= 2.0 for a in (q, k, v)), seen.sdpa


def test_the_matmul_scale_sits_on_the_layer_output_and_a_zero_bias_is_shifted():
    model = build(gpt, 256)
    plan = find_spec(model).umup
    c = {(m, str(side)): v for m, side, v in plan.constants}
    assert c[("blocks.0.attn.qkv", "output ×")] == pytest.approx(256**-0.5)
    assert ("blocks.0.attn.qkv", "input ×") not in c
    assert plan.folded["blocks.0.attn.qkv.bias"] == pytest.approx(16.0)  # b' = b/A: Adam lr × 1/A
    spec = find_spec(model)
    assert spec.factors("blocks.0.attn.qkv.bias", "adam")[0] == pytest.approx(16.0 * 2**-0.5)  # × L^-½


class _PlainMLP(torch.nn.Module):
    """nn.Linear with PyTorch's default init: every bias nonzero."""

    def __init__(self, width: int, depth: int = 3):
        super().__init__()
        self.inp = torch.nn.Linear(20, width)
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.out = torch.nn.Linear(width, 10)

    def forward(self, x):
        x = F.gelu(self.inp(x))
        for h in self.hidden:
            x = F.gelu(h(x))
        return self.out(x)


def test_a_nonzero_bias_is_shifted_too_so_the_matmul_operands_stay_unit():
    """PyTorch's default Linear has a nonzero bias; with the matmul's 1/√fan_in on its input the hidden
    matmuls' inputs had RMS 1/32 at width 1024 (68 % below 2^-6). Shifted like a zero bias, b' = b/A."""
    torch.manual_seed(0)
    model = mt.parametrize(_PlainMLP(1024), base=_PlainMLP(64), delta=_PlainMLP(128), parametrization="u-mup")
    plan = find_spec(model).umup
    c = {(m, str(side)): v for m, side, v in plan.constants}
    assert c[("hidden.0", "output ×")] == pytest.approx(1024**-0.5)
    assert plan.shifted["hidden.0.bias"] == "hidden.0" and plan.folded["hidden.0.bias"] == pytest.approx(32.0)
    x = torch.randn(64, 20, generator=torch.Generator().manual_seed(1))
    report = fp8_underflow(model, x)
    assert report.fraction <= 0.05 and report.activations <= 0.05, report
    seen = _Operands()
    with torch.no_grad(), seen:
        out = model(x)
    for inp, w in seen.linear[1:-1]:  # the hidden layers' operands
        assert 0.5 <= inp <= 2.0 and 0.5 <= w <= 2.0, seen.linear
    # the same function as the exported plain model (its biases back at b = A·b')
    plain = mt.export(model)
    assert torch.allclose(plain(x), out, atol=1e-5)
    assert rms(plain.hidden[0].bias) == pytest.approx(rms(model.hidden[0].bias) / 32.0, rel=1e-5)
    # and the same groups as a zero-bias model's: the shift's lr and ε compensation applies alike
    torch.manual_seed(0)
    zero = _PlainMLP(1024)
    for layer in (zero.inp, *zero.hidden, zero.out):
        torch.nn.init.zeros_(layer.bias)
    zero = mt.parametrize(zero, base=_PlainMLP(64), delta=_PlainMLP(128), parametrization="u-mup")
    groups = {tuple(id(p) for p in g["params"]): g for g in mt.param_groups(model, lr=0.1, optimizer="adam")}
    names = {id(p): n for n, p in model.named_parameters()}
    zgroups = mt.param_groups(zero, lr=0.1, optimizer="adam")
    znames = {id(p): n for n, p in zero.named_parameters()}
    lr = {names[i]: (g["lr"], g.get("eps")) for ids, g in groups.items() for i in ids}
    zlr = {znames[id(p)]: (g["lr"], g.get("eps")) for g in zgroups for p in g["params"]}
    assert lr == zlr


def test_the_attention_output_is_unit_scaled_at_the_probe_length():
    assert attention_output_scale(32, 32, causal=True) == pytest.approx(
        math.sqrt(sum(1 / i for i in range(1, 33)) / 32)
    )
    assert attention_output_scale(5, 20, causal=False) == pytest.approx(20**-0.5)
    mask = torch.tensor([[True, False], [True, True]])
    assert attention_output_scale(2, 2, causal=False, mask=mask) == pytest.approx(math.sqrt(0.75))
    plan = find_spec(build(gpt, 128)).umup
    assert [m for m, _ in plan.attention_outputs] == ["blocks.0.attn.proj", "blocks.1.attn.proj"]
    assert all(s == pytest.approx(attention_output_scale(CTX, CTX, True)) for _, s in plan.attention_outputs)


def test_under_umup_at_most_5_percent_of_hidden_operands_underflow_mup_far_more():
    probe = TOKENS
    umup = fp8_underflow(build(gpt, 256), probe)
    mup = fp8_underflow(build(gpt, 256, "mup"), probe)
    assert umup.fraction <= 0.05
    assert mup.fraction >= 0.3


def test_the_unit_scaled_backward_keeps_the_gradients_of_fp32_where_plain_e5m2_flushes_them():
    model = build(gpt, 128)
    y = torch.randint(0, 256, TOKENS.shape, generator=torch.Generator().manual_seed(1))

    def grads(**kw):
        model.zero_grad(set_to_none=True)
        if kw.get("fp32"):
            logits = model(TOKENS)
        else:
            with fp8_simulation(model, forward=None, **kw) as sim:
                logits = model(TOKENS)
        F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).backward()
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out, (None if kw.get("fp32") else sim)

    ref, _ = grads(fp32=True)
    unit, sim = grads()
    plain, _ = grads(grad_scale=None)
    n = TOKENS.numel()
    assert sim.backward_scale == 2.0 ** round(math.log2(n * 16))  # N·√V, a power of two
    name = "blocks.0.attn.qkv.weight"

    def err(g):
        return rms(g[name] - ref[name]) / rms(ref[name])

    assert err(unit) < 0.2  # E5M2 rounding only (2 mantissa bits, several casts on the way)
    assert err(plain) > 3 * err(unit), (err(plain), err(unit))  # flushed to zero or subnormal


def test_grad_scale_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="grad_scale"):
        fp8_simulation(grad_scale=-1.0)
    with pytest.raises(TypeError, match="grad_scale"):
        fp8_simulation(grad_scale="loud")


def test_a_fixed_grad_scale_applies_to_any_model():
    sim = fp8_simulation(grad_scale=1024.0)
    with sim:
        pass
    assert sim.backward_scale == 1024.0
