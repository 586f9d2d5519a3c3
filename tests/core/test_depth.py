"""Depth scaling (Depth-µP α=½, CompleteP α=1): blocks, rules, branches, helper, errors, survival."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt
from mutransfer._core.spec import find_spec
from mutransfer.recipes.data import gaussian_batches
from mutransfer.recipes.models import GPT, MLP, ResMLP


def _resmlp(width=128, depth=8, alpha=1.0, **kw):
    torch.manual_seed(0)
    model = ResMLP(width, depth=depth)
    return mt.parametrize(model, base=ResMLP(64, depth=2), delta=ResMLP(128, depth=2), depth_alpha=alpha, **kw)


def _factors(model, optimizer):
    """Parameter name → (lr, eps) of its group, base lr 1 and base eps 1."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for g in mt.param_groups(model, lr=1.0, optimizer=optimizer, eps=1.0):
        for p in g["params"]:
            out[names[id(p)]] = (g["lr"], g.get("eps"))
    return out


def test_blocks_are_found_and_mapped_onto_the_base():
    spec = find_spec(_resmlp())
    assert spec.depth == {"blocks": (2, 8)}
    info = spec.params["blocks.7.fc1.weight"]
    assert info.base_name == "blocks.1.fc1.weight" and info.block == "blocks" and info.m_depth == 4.0
    assert spec.params["readout.weight"].block is None and spec.params["readout.weight"].m_depth == 1.0


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_depth_factors_follow_the_rules(alpha):
    m_w, m_l = 2.0, 4.0  # width 128 over 64, depth 8 over 2
    model = _resmlp(alpha=alpha)
    adam, sgd = _factors(model, "adam"), _factors(model, "sgd")
    # hidden weight inside a block: width (1/m lr, 1/m ε) times depth (m_L^(α-1) lr, m_L^-α ε)
    assert adam["blocks.5.fc1.weight"][0] == pytest.approx(m_l ** (alpha - 1) / m_w)
    assert adam["blocks.5.fc1.weight"][1] == pytest.approx(m_l**-alpha / m_w)
    assert sgd["blocks.5.fc1.weight"][0] == pytest.approx(m_l ** (2 * alpha - 1))
    # vector inside a block (norm gain): Adam lr m_L^(α-1), SGD lr m_w · m_L^(2α-1)
    assert adam["blocks.0.norm.weight"][0] == pytest.approx(m_l ** (alpha - 1))
    assert sgd["blocks.0.norm.weight"][0] == pytest.approx(m_w * m_l ** (2 * alpha - 1))
    # outside the blocks depth changes nothing
    assert adam["norm.weight"] == (pytest.approx(1.0), pytest.approx(1 / m_w))
    assert adam["readout.weight"][0] == pytest.approx(1 / m_w)
    assert adam["input.weight"][0] == pytest.approx(1.0)
    # Table 3: the branch multiplier is folded into fc2 (the branch's last layer): init × m_L^-α,
    # Adam lr × m_L^-1 (ε width-only), SGD lr × m_L^-1.
    spec = find_spec(model)
    assert spec.branches == {}
    assert spec.folded_branches == {f"blocks.{i}.fc2": pytest.approx(m_l**-alpha) for i in range(8)}
    assert adam["blocks.6.fc2.weight"] == (pytest.approx(1 / (m_w * m_l)), pytest.approx(1 / m_w))
    assert sgd["blocks.6.fc2.weight"][0] == pytest.approx(1 / m_l)
    assert adam["blocks.6.fc2.bias"][0] == pytest.approx(1 / m_l)
    # Table 8 keeps a forward multiplier on the branch instead, and fc2 follows the block row.
    spec8 = find_spec(_resmlp(alpha=alpha, formulation="table8"))
    assert spec8.folded_branches == {}
    assert spec8.branches == {f"blocks.{i}.fc2": pytest.approx(m_l**-alpha) for i in range(8)}


def test_branch_output_is_scaled_in_the_forward():
    model = _resmlp(alpha=1.0, formulation="table8")
    block = model.blocks[3]
    x = torch.randn(5, 128)
    expected = x + 0.25 * F.linear(F.relu(block.fc1(block.norm(x))), block.fc2.weight, block.fc2.bias)
    torch.testing.assert_close(block(x), expected)
    folded = _resmlp(alpha=1.0)  # same seed: Table 3 holds 0.25 × Table 8's fc2 and computes the same
    torch.testing.assert_close(folded.blocks[3].fc2.weight, 0.25 * block.fc2.weight)
    torch.testing.assert_close(folded.blocks[3].fc1.weight, block.fc1.weight)
    torch.testing.assert_close(folded(x[:, :32]), model(x[:, :32]))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("build", ["resmlp", "gpt"])
def test_folded_and_multiplied_branches_train_identically(optimizer, build):
    """abc-symmetry across depth: Table 3 (folded) and Table 8 (multiplier) give the same trajectory."""
    torch.set_default_dtype(torch.float64)
    try:
        if build == "resmlp":
            make = lambda w, d: ResMLP(w, depth=d)  # noqa: E731
            x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        else:
            make = lambda w, d: GPT(w, n_layer=d, ctx=16, tied=False)  # noqa: E731
            x = torch.randint(0, 256, (4, 16))
            y = torch.randint(0, 256, (4, 16))
        outs = []
        for formulation in ("table3", "table8"):
            torch.manual_seed(0)
            model = make(64, 6)
            mt.parametrize(model, base=make(32, 2), delta=make(64, 2), formulation=formulation, depth_alpha=0.5)
            lr = 0.05 if optimizer == "sgd" else 1e-2
            opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(
                mt.param_groups(model, lr, optimizer, eps=1e-6)
            )
            for _ in range(5):
                loss = F.cross_entropy(model(x).reshape(-1, model(x).shape[-1]), y.reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
            outs.append(model(x))
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-8, atol=1e-9)
    finally:
        torch.set_default_dtype(torch.float32)


def test_at_base_depth_depth_scaling_changes_nothing():
    torch.manual_seed(0)
    plain = ResMLP(64, depth=2)
    model = copy.deepcopy(plain)
    mt.parametrize(model, base=ResMLP(64, depth=2), delta=ResMLP(128, depth=2), depth_alpha=0.5)
    spec = find_spec(model)
    assert spec.depth == {} and spec.branches == {}
    x = torch.randn(4, 32)
    assert torch.equal(model(x), plain(x))
    assert all(g["lr"] == 0.1 for g in mt.param_groups(model, 0.1, "adam"))


def test_alpha_zero_changes_depth_without_depth_scaling():
    model = _resmlp(alpha=0.0)
    spec = find_spec(model)
    assert spec.branches == {} and spec.depth_alpha == 0.0
    adam = _factors(model, "adam")
    assert adam["blocks.5.fc1.weight"][0] == pytest.approx(0.5)
    assert adam["blocks.5.norm.weight"][0] == pytest.approx(1.0)


def test_gpt_branches_and_attention_in_deeper_blocks():
    torch.manual_seed(0)
    model = GPT(128, n_layer=6)
    mt.parametrize(model, base=GPT(64, n_layer=2), delta=GPT(128, n_layer=2), depth_alpha=0.5)
    spec = find_spec(model)
    # attention's output is its out-projection's: both branches fold into a Linear layer
    assert set(spec.folded_branches) == {f"blocks.{i}.{b}" for i in range(6) for b in ("attn.proj", "fc_out")}
    assert all(c == pytest.approx(3**-0.5) for c in spec.folded_branches.values())
    assert spec.branches == {} and spec.forward_constants == {"lm_head": ("input ×", 0.5)}
    assert {a.module for a in spec.attention} == {f"blocks.{i}.attn" for i in range(6)}
    assert model(torch.randint(0, 256, (2, 16))).shape == (2, 16, 256)
    assert "depth blocks: L₀=2 → L=6" in mt.describe(model)


class HelperBlock(nn.Module):
    """A block whose forward tracing cannot see through (data-dependent branch) unless told."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + mt.residual_branch(self, torch.tanh(self.fc(x)))


class UntraceableBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        if x.sum() > 1e9:  # data-dependent control flow: torch.fx cannot trace it
            return x
        return x + self.fc(x)


class Stack(nn.Module):
    def __init__(self, width, depth, block):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(block(width) for _ in range(depth))
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def test_helper_scales_branches_written_by_hand():
    torch.manual_seed(0)
    model = Stack(32, 8, HelperBlock)
    mt.parametrize(model, base=Stack(16, 2, HelperBlock), delta=Stack(32, 2, HelperBlock), depth_alpha=1.0)
    assert find_spec(model).branches == {f"blocks.{i}": 0.25 for i in range(8)}
    block, x = model.blocks[2], torch.randn(3, 32)
    torch.testing.assert_close(block(x), x + 0.25 * torch.tanh(block.fc(x)))
    plain = Stack(32, 8, HelperBlock)  # not parametrized: the helper is the identity
    torch.testing.assert_close(plain.blocks[0](x), x + torch.tanh(plain.blocks[0].fc(x)))


def test_untraceable_block_needs_patterns():
    with pytest.raises(ValueError, match="residual_branches=") as err:
        mt.parametrize(
            Stack(32, 8, UntraceableBlock), base=Stack(16, 2, UntraceableBlock), delta=Stack(32, 2, UntraceableBlock)
        )
    assert "blocks" in str(err.value) and "depth_alpha=0" in str(err.value)
    model = mt.parametrize(
        Stack(32, 8, UntraceableBlock),
        base=Stack(16, 2, UntraceableBlock),
        delta=Stack(32, 2, UntraceableBlock),
        residual_branches=["blocks.*.fc"],
    )
    assert set(find_spec(model).folded_branches) == {f"blocks.{i}.fc" for i in range(8)}
    with pytest.raises(ValueError, match="matches no module"):
        mt.parametrize(
            Stack(32, 8, UntraceableBlock),
            base=Stack(16, 2, UntraceableBlock),
            delta=Stack(32, 2, UntraceableBlock),
            residual_branches=["blocks.*.nope"],
        )


def test_non_residual_blocks_cannot_be_depth_scaled():
    with pytest.raises(ValueError, match="no residual connection") as err:
        mt.parametrize(MLP(128, depth=8), base=MLP(64, depth=3), delta=MLP(128, depth=3))
    assert "'hidden'" in str(err.value) and "depth_alpha=0" in str(err.value)
    model = mt.parametrize(MLP(128, depth=8), base=MLP(64, depth=3), delta=MLP(128, depth=3), depth_alpha=0)
    assert find_spec(model).depth == {"hidden": (2, 7)}


@pytest.mark.parametrize("alpha, error", [(1.5, ValueError), (-0.1, ValueError), ("1", TypeError)])
def test_bad_depth_alpha(alpha, error):
    with pytest.raises(error, match="depth_alpha"):
        _resmlp(alpha=alpha)


class MHABlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)

    def forward(self, x):
        h = self.norm(x)
        return x + self.attn(h, h, h, need_weights=False)[0]


class MHAStack(Stack):
    def __init__(self, width, depth):
        super().__init__(width, depth, MHABlock)

    def forward(self, x):
        return super().forward(x).mean(1)


def test_tuple_output_branch_scales_its_first_element():
    torch.manual_seed(0)
    model = MHAStack(32, 4)
    mt.parametrize(model, base=MHAStack(16, 2), delta=MHAStack(32, 2), depth_alpha=1.0)
    assert set(find_spec(model).branches) == {f"blocks.{i}.attn" for i in range(4)}
    block, x = model.blocks[1], torch.randn(2, 5, 32)
    h = block.norm(x)
    unscaled_forward = type(block.attn)._mutransfer_parent.forward  # the class before the multiplier
    attn_out = unscaled_forward(block.attn, h, h, h, need_weights=False)[0]
    torch.testing.assert_close(block(x), x + 0.5 * attn_out)


def test_base_depth_given_explicitly_and_shapes_file(tmp_path):
    # A base model at the target's depth, declared to stand for depth 2.
    with torch.device("meta"):
        base, delta = ResMLP(64, depth=8), ResMLP(128, depth=8)
    model = mt.parametrize(ResMLP(128, depth=8), base=base, delta=delta, base_depth=2)
    assert find_spec(model).depth == {"blocks": (2, 8)}
    with pytest.raises(ValueError, match="base_depth"):
        mt.parametrize(ResMLP(128, depth=8), base=base, delta=delta, base_depth={"nope": 2})
    # A shapes file saved from the depth-2 proxies serves a depth-16 target.
    path = tmp_path / "resmlp.json"
    mt.save_shapes(ResMLP(64, depth=2), ResMLP(128, depth=2), path)
    assert "blocks.0.fc1.weight" in json.loads(path.read_text())["params"]
    model = mt.parametrize(ResMLP(256, depth=16), base_shapes=path, depth_alpha=0.5)
    spec = find_spec(model)
    assert spec.depth == {"blocks": (2, 16)} and spec.folded_branches["blocks.15.fc2"] == pytest.approx(8**-0.5)


def test_depth_multipliers_survive_deepcopy_and_pickle(tmp_path):
    model = _resmlp()
    x = torch.randn(4, 32)
    ref = model(x)
    torch.testing.assert_close(copy.deepcopy(model)(x), ref)
    torch.save(model, tmp_path / "m.pt")
    torch.testing.assert_close(torch.load(tmp_path / "m.pt", weights_only=False)(x), ref)


@pytest.mark.slow  # torch.compile's CPU codegen: ~10 s on a loaded 2-core machine
def test_depth_multipliers_survive_compile():
    model = _resmlp()
    x = torch.randn(4, 32)
    ref = model(x)
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(x), ref)
    assert len(mt.param_groups(compiled, 1e-3, "adam")) == len(mt.param_groups(model, 1e-3, "adam"))


@pytest.mark.slow
def test_coordinate_check_across_depth():
    data = gaussian_batches(4, 64, 32, 10)

    def check(alpha, optimizer, lr):
        def make(width, depth):
            return mt.parametrize(
                ResMLP(width, depth=depth), base=ResMLP(32, depth=2), delta=ResMLP(64, depth=2), depth_alpha=alpha
            )

        return mt.coord_check(
            make,
            widths=[64],
            depths=[2, 4, 8, 16, 32],
            data=data,
            optimizer=optimizer,
            lr=lr,
            steps=3,
            seeds=2,
            progress=False,
        )

    for alpha in (1.0, 0.5):
        result = check(alpha, "adam", 1e-2)
        assert result.passed, str(result)
        assert result.axis == "depth" and result.widths == [2, 4, 8, 16, 32]
    result = check(0.0, "adam", 1e-2)
    assert not result.passed
    assert "blocks.last" in result.failing_modules()
    assert "16× depth" in str(result)
    result = check(0.0, "sgd", 0.1)
    assert not result.passed


def test_coord_check_depth_arguments():
    data = gaussian_batches(1, 8, 32, 10)
    with pytest.raises(ValueError, match="one width"):
        mt.coord_check(lambda w, d: ResMLP(w, depth=d), widths=[32, 64], depths=[2, 4], data=data)
    with pytest.raises(ValueError, match="depths"):
        mt.coord_check(lambda w, d: ResMLP(w, depth=d), widths=32, depths=[2], data=data)


def test_a_depth_check_names_its_sizes_depths():
    from mutransfer.coord import CoordCheckResult

    r = CoordCheckResult(
        [], widths=[2, 4, 8], steps=1, seeds=1, optimizer="adam", lr=1e-3, axis="depth", fixed_width=64
    )
    assert r.sizes == r.depths == [2, 4, 8] and r.to_dict()["sizes"] == [2, 4, 8]
    w = CoordCheckResult([], widths=[32, 64], steps=1, seeds=1, optimizer="adam", lr=1e-3)
    assert w.depths is None and w.sizes == [32, 64]
