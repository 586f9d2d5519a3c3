"""Every bad input gives a ValueError/TypeError that names what is wrong."""

import pytest
import torch
from torch import nn

import mutransfer as mt
from mutransfer.recipes import GPT, MLP


def test_no_width_dim():
    with pytest.raises(ValueError, match="no width dim found"):
        mt.parametrize(MLP(64), base=MLP(64), delta=MLP(64))
    with pytest.raises(ValueError, match="pass delta="):
        mt.parametrize(MLP(64), base=MLP(64))


def test_different_parameter_names():
    class Net(nn.Module):
        def __init__(self, w, extra=False):
            super().__init__()
            self.inp = nn.Linear(8, w)
            self.out = nn.Linear(w, 2)
            if extra:
                self.gate = nn.Linear(w, w)

    with pytest.raises(ValueError, match=r"different parameter names.*gate\.weight"):
        mt.parametrize(Net(128, extra=True), base=Net(64), delta=Net(128))


def test_more_plain_layers_is_a_depth_change_without_residual_branches():
    # MLP.hidden holds identical Linear layers: a block container, but with no residual connection
    with pytest.raises(ValueError, match=r"'hidden'.*no residual connection.*depth_alpha=0"):
        mt.parametrize(MLP(128, depth=3), base=MLP(64, depth=2), delta=MLP(128, depth=2))


def test_different_ranks():
    class A(nn.Module):
        def __init__(self, w, flat=False):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(w * w) if flat else torch.zeros(w, w))

    with pytest.raises(ValueError, match="parameter 'w' has rank 2 in base but rank 1 in delta"):
        mt.parametrize(A(64), base=A(32), delta=A(48, flat=True))


def test_width_dim_that_shrinks():
    with pytest.raises(ValueError, match="dim 0 shrinks from 64 in base to 32 in delta"):
        mt.parametrize(MLP(128), base=MLP(64), delta=MLP(32))


def test_parametrize_twice():
    m = mt.parametrize(MLP(128), base=MLP(64), delta=MLP(96))
    with pytest.raises(ValueError, match="already called"):
        mt.parametrize(m, base=MLP(64), delta=MLP(96))


def test_param_groups_on_plain_model():
    with pytest.raises(ValueError, match="never parametrized.*mt.parametrize"):
        mt.param_groups(MLP(64), 1e-3, "adam")
    with pytest.raises(ValueError, match="never parametrized"):
        mt.describe(MLP(64))


def test_unknown_optimizer():
    m = mt.parametrize(MLP(128), base=MLP(64), delta=MLP(96))
    with pytest.raises(ValueError, match="unknown optimizer 'shampoo'"):
        mt.param_groups(m, 1e-3, "shampoo")
    with pytest.raises(TypeError, match="optimizer must be a name"):
        mt.param_groups(m, 1e-3, torch.optim.Adam)
    with pytest.raises(ValueError, match="weight_decay_policy"):
        mt.param_groups(m, 1e-3, "adamw", weight_decay_policy="scaled")


def test_wrong_argument_types():
    with pytest.raises(TypeError, match="`model`"):
        mt.parametrize("MLP", base=MLP(64))
    with pytest.raises(TypeError, match="base must be an nn.Module"):
        mt.parametrize(MLP(128), base={"a": 1})
    with pytest.raises(ValueError, match="needs base="):
        mt.parametrize(MLP(128))
    with pytest.raises(ValueError, match="either base_shapes= or base="):
        mt.parametrize(MLP(128), base=MLP(64), base_shapes={})
    with pytest.raises(ValueError, match="roles\\['readout.weight'\\] = 'readout' is not a role"):
        mt.parametrize(MLP(128), base=MLP(64), delta=MLP(96), roles={"readout.weight": "readout"})


def test_failed_parametrize_leaves_the_model_untouched():
    torch.manual_seed(0)
    m = MLP(128)
    before = [p.clone() for p in m.parameters()]
    with pytest.raises(ValueError):
        mt.parametrize(m, base=MLP(64), delta=MLP(32))
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    mt.parametrize(m, base=MLP(64), delta=MLP(96))  # still usable


def test_zero_init_readout_refuses_a_tied_readout():
    with pytest.raises(ValueError, match="tied to the input embedding"):
        mt.parametrize(GPT(128), base=GPT(64), delta=GPT(96), zero_init_readout=True)


def test_attention_without_a_readable_head_dim():
    """No head-dim attribute: the head dim is read from the query at call time on the probe forward."""

    class Attn(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.qkv = nn.Linear(w, 3 * w)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    m = mt.parametrize(Attn(128), base=Attn(64), delta=Attn(96))
    [a] = m._mutransfer_spec.attention
    assert (a.module, a.how, a.d0, a.d, a.verified) == ("", "sdpa", 64, 128, True)
    assert a.scale == pytest.approx(8 / 128)

    # a forward of three tensors: the probe passes one input per argument and measures the scale
    class Opaque(Attn):
        def forward(self, x, y, z):
            return super().forward(x)

    [a] = mt.parametrize(Opaque(128), base=Opaque(64), delta=Opaque(96))._mutransfer_spec.attention
    assert a.verified and a.scale == pytest.approx(8 / 128)

    # inputs that cannot be made: an error naming example_inputs=, never a scale assumed
    class Keyed(Attn):
        def forward(self, batch):
            return super().forward(batch["x"])

    with pytest.raises(mt.errors.ModelError, match="could not run a probe forward .*example_inputs="):
        mt.parametrize(Keyed(128), base=Keyed(64), delta=Keyed(96))
    x = {"x": torch.randn(1, 4, 128)}  # sized for the model: the base head dim is then given
    m = mt.parametrize(Keyed(128), base=Keyed(64), delta=Keyed(96), example_inputs=(x,), attn_base_head_dim=64)
    assert m._mutransfer_spec.attention[0].verified
