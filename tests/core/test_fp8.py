"""The FP8 simulation (issue 50, item 4): E4M3 operands in the forward with a straight-through
backward, E5M2 gradients at matmul outputs, no casting while parametrize runs, the underflow helper."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt
from mutransfer.precision import E4M3, E5M2, cast_fp8, fp8_simulation, fp8_underflow
from mutransfer.recipes.models import GPT


def _on_grid(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Every value of `x` is a finite value of the FP8 format `dtype`."""
    return bool(torch.equal(x.to(dtype).to(x.dtype), x))


def test_cast_rounds_to_the_formats_grids_and_saturates():
    x = torch.tensor([0.3, 1.0 / 3, 2**-6, 2**-9, 2**-11, 1000.0, -1e6, 70000.0])
    e4 = cast_fp8(x, E4M3)
    assert e4.tolist()[:3] == [0.3125, 0.34375, 2**-6]  # 3 mantissa bits: 1/3 → 0.34375
    assert e4[3].item() == 2**-9 and e4[4].item() == 0.0  # the smallest subnormal; below it: flushed
    assert e4[5].item() == 448 and e4[6].item() == -448 and e4[7].item() == 448  # saturating
    e5 = cast_fp8(x, E5M2)
    assert e5[1].item() == 0.3125 and e5[4].item() == 2**-11  # 2 mantissa bits, a wider range
    assert e5[6].item() == -57344 and e5[7].item() == 57344
    with pytest.raises(ValueError, match="dtype must be"):
        cast_fp8(x, torch.bfloat16)


def test_forward_operands_are_e4m3_and_the_gradient_is_straight_through():
    torch.manual_seed(0)
    x = torch.randn(5, 7, requires_grad=True)
    w = torch.randn(3, 7, requires_grad=True)
    seen = []

    with fp8_simulation(backward=None) as sim:
        y = F.linear(x, w)
    qx, qw = cast_fp8(x.detach(), E4M3), cast_fp8(w.detach(), E4M3)
    assert not torch.equal(qx, x.detach())  # the cast moved values
    assert torch.equal(y.detach(), qx @ qw.T)  # the matmul took the E4M3 values
    assert sim.matmuls == 1
    g = torch.randn(5, 3)
    y.backward(g)
    # straight-through: the gradient is the unquantized matmul's law evaluated at the rounded operands
    assert torch.allclose(x.grad, g @ qw, atol=1e-6)
    assert torch.allclose(w.grad, g.T @ qx, atol=1e-6)
    assert seen == []


def test_backward_gradient_at_the_output_is_rounded_to_e5m2():
    torch.manual_seed(1)
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 5, requires_grad=True)
    with fp8_simulation():
        y = x @ w
    g = torch.randn(4, 5) * 1e-3
    y.backward(g)
    g5 = cast_fp8(g, E5M2)
    assert not torch.equal(g5, g)
    qw, qx = cast_fp8(w.detach(), E4M3), cast_fp8(x.detach(), E4M3)
    assert torch.allclose(x.grad, g5 @ qw.T, atol=1e-9)
    assert torch.allclose(w.grad, qx.T @ g5, atol=1e-9)
    # the gradient was not pushed through E4M3 (the trap): small gradients survive in E5M2
    assert _on_grid(g5, E5M2) and not _on_grid(g5, E4M3)


def test_sdpa_bmm_einsum_addmm_and_linear_modules_are_cast():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    lin = nn.Linear(5, 2)
    with fp8_simulation() as sim:
        att = F.scaled_dot_product_attention(q, k, v)
        bm = torch.bmm(a, b)
        es = torch.einsum("bij,bjk->bik", a, b)
        am = torch.addmm(torch.ones(2), a[0], b[0])
        out = lin(a[0])
    Q = [cast_fp8(t, E4M3) for t in (q, k, v)]
    assert torch.allclose(att, F.scaled_dot_product_attention(*Q), atol=1e-6)
    qa, qb = cast_fp8(a, E4M3), cast_fp8(b, E4M3)
    assert torch.allclose(bm, torch.bmm(qa, qb), atol=1e-6)
    assert torch.allclose(es, torch.bmm(qa, qb), atol=1e-6)
    assert torch.allclose(am, 1 + qa[0] @ qb[0], atol=1e-6)  # the bias (added, not multiplied) is not cast
    assert torch.allclose(out, F.linear(qa[0], cast_fp8(lin.weight.detach(), E4M3), lin.bias), atol=1e-6)
    assert sim.matmuls == 5
    # outside the block: no casting
    assert torch.equal(torch.bmm(a, b), a @ b)


def test_exclude_keeps_a_module_in_full_precision():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(2, 4)
    with fp8_simulation(model, exclude=["2"]) as sim:
        y = model(x)
    h = F.relu(F.linear(cast_fp8(x, E4M3), cast_fp8(model[0].weight.detach(), E4M3), model[0].bias))
    assert torch.allclose(y, model[2](h), atol=1e-6)  # the last layer unrounded
    assert sim.matmuls == 1
    with pytest.raises(ValueError, match="exclude names no module of the model: head"):
        fp8_simulation(model, exclude=["head"])
    with pytest.raises(TypeError, match="pass the model too"):
        fp8_simulation(exclude=["2"])
    with pytest.raises(ValueError, match="backward must be one of 'e4m3', 'e5m2'"):
        fp8_simulation(backward="fp16")


def _gpt(width: int) -> GPT:
    return GPT(width, n_layer=2, n_head=4, ctx=16, tied=False, init_std=0.02)


def test_nothing_is_cast_while_parametrize_runs():
    """Parametrizing inside the block gives the model parametrizing outside gives (same init, same
    constants), with one warning; the training forward after it is cast."""

    def build():
        torch.manual_seed(0)
        model = _gpt(64)
        torch.manual_seed(1)
        return mt.parametrize(model, base=_gpt(16), delta=_gpt(32))

    plain = build()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fp8_simulation() as sim:
            inside = build()
    assert sim.matmuls == 0
    assert sum("parametrize ran inside the block" in str(w.message) for w in caught) == 1
    for (n, a), (_, b) in zip(plain.state_dict().items(), inside.state_dict().items()):
        assert torch.equal(a, b), n
    idx = torch.randint(0, 256, (2, 16))
    with fp8_simulation() as sim:
        cast_out = inside(idx)
    assert sim.matmuls == 2 * 5 + 1  # qkv, SDPA, proj, fc, fc_out per block; lm_head
    assert not torch.allclose(cast_out, plain(idx))


def test_underflow_counts_hidden_operands_below_the_smallest_normal():
    torch.manual_seed(0)
    model = mt.parametrize(_gpt(64), base=_gpt(16), delta=_gpt(32))
    idx = torch.randint(0, 256, (2, 16))
    report = fp8_underflow(model, idx)
    w = model.blocks[0].fc.weight.detach()
    assert report.by_layer["blocks.0.fc.weight"] == pytest.approx(float((w.abs() < 2**-6).float().mean()))
    assert "lm_head.weight" not in report.by_layer and "wte.weight" not in report.by_layer  # not hidden
    assert {"blocks.0.attn:query", "blocks.0.attn:key", "blocks.0.attn:value"} <= set(report.by_layer)
    assert 0 < report.weights < 1 and 0 <= report.activations < 1
    small = w.abs() < 2**-6
    w2 = w.double() ** 2
    assert report.mass_by_layer["blocks.0.fc.weight"] == pytest.approx(float(w2[small].sum() / w2.sum()))
    assert report.mass == pytest.approx(sum(report.mass_by_layer.values()) / len(report.mass_by_layer))
    assert report.mass < report.fraction  # small elements hold less than their share of the norm
    # a model with every hidden weight scaled up 100×: nothing below the smallest normal in them
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in report.by_layer:
                p.mul_(1e4)
    assert fp8_underflow(model, idx).by_layer["blocks.0.fc.weight"] < report.by_layer["blocks.0.fc.weight"]
    with pytest.raises(ValueError, match="not parametrized"):
        fp8_underflow(_gpt(64), idx)
    plain = _gpt(64)
    named = fp8_underflow(plain, idx, hidden=["blocks.0.fc.weight"])
    linears = {n for n in named.by_layer if ":" not in n or n.endswith(":input")}
    assert linears == {"blocks.0.fc.weight", "blocks.0.fc:input"}  # (the attention's q, k, v beside them)
    with pytest.raises(ValueError, match="hidden names no parameter"):
        fp8_underflow(plain, idx, hidden=["nope.weight"])


def test_fp8_precision_in_a_recipe_trains_through_the_simulation():
    from mutransfer.sweep.recipes import train_mlp
    from mutransfer.sweep.scale import Scale

    hp = dict(lr=1e-2, steps=6)
    fp32 = train_mlp(dict(hp), Scale(64, 32, "mup", 0))
    fp8 = train_mlp(dict(hp), Scale(64, 32, "mup", 0, precision="fp8"))
    assert fp8 == pytest.approx(fp32, rel=0.05) and fp8 != fp32  # close, not the same numbers


def test_coord_check_trains_in_the_precision_it_is_given():
    from mutransfer.recipes.models import MLP

    torch.manual_seed(0)
    data = [(torch.randn(16, 8), torch.randint(0, 4, (16,)))]

    def make(width: int) -> nn.Module:
        def mlp(w: int) -> nn.Module:
            return MLP(w, d_in=8, d_out=4)

        return mt.parametrize(mlp(width), base=mlp(16), delta=mlp(32))

    kw = dict(widths=[16, 64], data=data, optimizer="adam", lr=1e-2, steps=2, seeds=1, progress=False)
    fp32 = mt.coord_check(make, **kw)
    fp8 = mt.coord_check(make, precision="fp8", **kw)
    a = {(r.module, r.quantity, r.step, r.width): r.value for r in fp32.records}
    b = {(r.module, r.quantity, r.step, r.width): r.value for r in fp8.records}
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a if k[2] == 0)  # the same models at init (parametrize never cast)
    assert any(a[k] != b[k] for k in a if k[2] > 0)  # trained through the FP8 simulation
    with pytest.raises(ValueError, match="precision must be one of 'fp32', 'bf16', 'fp8', got 'fp16'"):
        mt.coord_check(make, precision="fp16", **kw)


def test_underflow_mass_separates_a_sparse_operand_from_a_small_one():
    """Half the input's elements tiny (a sparse activation) vs every element tiny: the same kind of
    count, masses 1e-6 and 1."""

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(64, 64, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    model = One()
    with torch.no_grad():
        model.fc.weight.fill_(1.0)
    sparse = torch.ones(8, 64)
    sparse[:, ::2] = 1e-3
    report = fp8_underflow(model, sparse, hidden=["fc.weight"])
    assert report.by_layer["fc:input"] == 0.5
    assert report.mass_by_layer["fc:input"] == pytest.approx(1e-6 / (1 + 1e-6))
    assert report.mass_by_layer["fc.weight"] == 0.0
    relu = torch.ones(8, 64)
    relu[:, ::2] = 0.0  # exact zeros (a ReLU's output): held exactly by FP8, not counted, reported as zeros
    zeros = fp8_underflow(model, relu, hidden=["fc.weight"])
    assert zeros.by_layer["fc:input"] == 0.0 and zeros.zeros == pytest.approx(256 / (64 * 64 + 8 * 64))
    tiny = fp8_underflow(model, torch.full((8, 64), 1e-3), hidden=["fc.weight"])
    assert tiny.by_layer["fc:input"] == 1.0 and tiny.mass_by_layer["fc:input"] == 1.0
    assert "of their squared norm" in str(tiny)
