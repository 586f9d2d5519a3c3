"""u-µP on a plain stack of blocks (a deep MLP's hidden Linears): no residual stream, so neither the τ rule
nor Depth-µP's in-block factors apply — and nothing is warned, since the blocks were *observed* to add
nothing onto their input. A residual model keeps both; a model with both kinds gets each its own."""

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import mutransfer as mt
from mutransfer._core.branches import find_branches
from mutransfer._core.depth import DepthMap
from mutransfer._core.spec import find_spec
from mutransfer.errors import ModelError, MuPWarning
from mutransfer.recipes.models import GPT, MLP, ResBlock, ResMLP


def umup_mlp(width=64, depth=3, base_depth=None):
    torch.manual_seed(0)
    bd = depth if base_depth is None else base_depth
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no MuPWarning (nor any other) at all
        return mt.parametrize(
            MLP(width, depth=depth), base=MLP(32, depth=bd), delta=MLP(48, depth=bd), parametrization="u-mup"
        )


def adam_lrs(model):
    """Parameter name → (lr, eps) of its Adam group at lr 1, eps 1."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]: (g["lr"], g.get("eps"))
        for g in mt.param_groups(model, lr=1.0, optimizer="adam", eps=1.0)
        for p in g["params"]
    }


# ------------------------------------------------------------------------------------------ a plain MLP


def test_a_plain_mlp_is_parametrized_under_umup_without_a_warning():
    """Before: "MuPWarning: parametrize (u-mup): no residual rule: … Linear.forward adds nothing onto its
    input … or pass depth_alpha=0" — a false alarm whose fixes u-µP refuses."""
    spec = find_spec(umup_mlp())
    plan = spec.umup
    assert plan.plain_stacks == {"hidden": 2}
    assert plan.branches == {} and plan.fallbacks == []
    assert spec.depth == {} and spec.depth_alpha == 0.0
    for name in ("hidden.0.weight", "hidden.1.weight", "hidden.1.bias"):
        info = spec.params[name]
        assert info.m_depth == 1.0 and info.depth_role == "outside" and info.block is None, name


@pytest.mark.parametrize("base_depth", [None, 3])
def test_a_plain_stack_gets_no_depth_factor(base_depth):
    """The hidden layers' Adam lr and ε are the same at depth 2 and 4 (before: × (L=3)^-½ at depth 4),
    whatever the base's depth (its names still map onto the base's blocks)."""
    shallow = adam_lrs(umup_mlp(64, depth=2, base_depth=base_depth))
    deep = adam_lrs(umup_mlp(64, depth=4, base_depth=base_depth))
    for name in ("hidden.0.weight", "hidden.0.bias"):
        assert deep[name] == pytest.approx(shallow[name]), name
    assert deep["hidden.2.weight"] == pytest.approx(shallow["hidden.0.weight"])
    assert deep["hidden.0.weight"][0] == pytest.approx(64**-0.5)  # u-µP's hidden rule alone: fan_in^-½
    for name in ("input.weight", "readout.weight"):
        assert deep[name] == pytest.approx(shallow[name]), name


def test_describe_names_the_plain_stack_and_no_depth_rule():
    text = mt.describe(umup_mlp(64, depth=4))
    lines = [line for line in text.splitlines() if line.startswith("plain stack hidden")]
    assert len(lines) == 1, text
    assert "L=3" in lines[0] and "no residual stream" in lines[0]
    assert "no τ rule" in lines[0] and "no depth rule" in lines[0]
    assert "Depth-µP" not in text and "τ rule (" not in text
    assert not any(line.startswith("depth ") for line in text.splitlines()), text
    assert "fallback" not in text


# ------------------------------------------------------------------------------------------ residual models


def test_a_residual_model_keeps_its_tau_rule_and_depth_lines():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        model = mt.parametrize(GPT(128), base=GPT(64), delta=GPT(128), parametrization="u-mup")
    spec = find_spec(model)
    assert spec.umup.plain_stacks == {}
    assert spec.depth == {"blocks": (1, 2)}
    assert len(spec.umup.branches) == 4
    text = mt.describe(model)
    assert "depth blocks: L=2 blocks: in-block Adam lr and ε × L^-½ (Depth-µP)" in text.splitlines()
    assert any(
        line.startswith("τ rule (pre-norm: one multiplier per branch output): 2 attention, 2 MLP")
        for line in text.splitlines()
    )
    assert "plain stack" not in text
    lr = adam_lrs(model)
    assert lr["blocks.1.fc.weight"][0] == pytest.approx(128**-0.5 * 2**-0.5)


class _Both(nn.Module):
    """Residual blocks in one container, a plain stack of Linears in another."""

    def __init__(self, width, n_res=3, n_plain=3, block=ResBlock):
        super().__init__()
        self.input = nn.Linear(16, width)
        self.blocks = nn.ModuleList(block(width) for _ in range(n_res))
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(n_plain))
        self.readout = nn.Linear(width, 4)

    def forward(self, x):
        h = self.input(x)
        for b in self.blocks:
            h = b(h)
        for layer in self.hidden:
            h = F.relu(layer(h))
        return self.readout(h)


def test_residual_blocks_and_a_plain_stack_in_one_model():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        model = mt.parametrize(_Both(64), base=_Both(32), delta=_Both(48), parametrization="u-mup")
    spec = find_spec(model)
    assert spec.umup.plain_stacks == {"hidden": 3}
    assert spec.depth == {"blocks": (1, 3)}
    assert sorted(spec.umup.branches) == [f"blocks.{i}.fc2" for i in range(3)]
    lr = adam_lrs(model)
    assert lr["blocks.1.fc1.weight"][0] == pytest.approx(64**-0.5 * 3**-0.5)  # Depth-µP in the residual blocks
    assert lr["hidden.1.weight"][0] == pytest.approx(64**-0.5)  # nothing on the plain stack
    assert spec.params["hidden.2.weight"].depth_role == "outside"
    text = mt.describe(model)
    assert "depth blocks: L=3 blocks" in text and "plain stack hidden: L=3" in text
    assert "depth hidden" not in text


class _AddsTanh(nn.Module):
    """A residual block whose branch is not a child module's output (tanh of it): fx and the probe both
    see the addition, neither can name a branch module."""

    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class _Stack(nn.Module):
    def __init__(self, width, depth=3, block=_AddsTanh):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(block(width) for _ in range(depth))
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def test_unfindable_residual_branches_warn_with_a_fix_umup_accepts():
    with pytest.warns(MuPWarning, match="no residual rule") as caught:
        model = mt.parametrize(_Stack(64), base=_Stack(32), delta=_Stack(48), parametrization="u-mup")
    msg = next(str(w.message) for w in caught if "no residual rule" in str(w.message))
    assert "residual_branches=['blocks.*.fc']" in msg
    assert "depth_alpha" not in msg and "mt.residual_branch" not in msg
    assert find_spec(model).umup.plain_stacks == {}  # an addition was observed: not a plain stack


def test_a_plain_stack_is_recognised_beside_blocks_whose_branches_are_not_found():
    """Each container is looked at on its own: the warning names the residual one only, and the plain stack
    still gets no depth factor."""
    with pytest.warns(MuPWarning, match="no residual rule") as caught:
        model = mt.parametrize(_Both(64, block=_AddsTanh), base=_Both(32, block=_AddsTanh), parametrization="u-mup")
    msgs = [str(w.message) for w in caught if issubclass(w.category, MuPWarning)]
    assert len(msgs) == 1 and "'blocks'" in msgs[0] and "'hidden'" not in msgs[0], msgs
    spec = find_spec(model)
    assert spec.umup.plain_stacks == {"hidden": 3} and spec.umup.branches == {}
    assert spec.depth == {"blocks": (1, 3)}
    assert adam_lrs(model)["hidden.0.weight"][0] == pytest.approx(64**-0.5)


def test_a_plain_stack_is_recognised_beside_named_branches():
    """With residual_branches= naming the residual container's branches, a container they do not reach is
    still looked at: a plain stack there gets no depth rule."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        model = mt.parametrize(_Both(64), base=_Both(32), parametrization="u-mup", residual_branches=["blocks.*.fc2"])
    spec = find_spec(model)
    assert spec.umup.plain_stacks == {"hidden": 3}
    assert sorted(spec.umup.branches) == [f"blocks.{i}.fc2" for i in range(3)]
    assert spec.params["hidden.1.weight"].depth_role == "outside"
    assert spec.params["blocks.1.fc1.weight"].depth_role == "block"


# ------------------------------------------------------------------------------------------ µP, unchanged


def test_mup_refuses_a_plain_stack_deeper_than_its_base_as_before():
    with pytest.raises(ModelError) as err:
        mt.parametrize(MLP(128, depth=8), base=MLP(64, depth=3), delta=MLP(128, depth=3))
    assert str(err.value) == (
        "depth scaling needs the residual branches of the blocks in 'hidden', but Linear.forward adds nothing "
        "onto its input (no residual connection found). Name the branch modules with "
        "residual_branches=['hidden.*.<branch>'] (patterns), write `x = x + mt.residual_branch(self, branch)` in "
        "the block's forward, or pass depth_alpha=0 to change depth without depth scaling"
    )


# ------------------------------------------------------------------------------------------ find_branches


class _UntraceablePlain(nn.Module):
    """fx cannot trace it (data-dependent branch); on the probe it adds nothing onto its input."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        if x.sum() > 1e9:
            return x
        return torch.relu(self.fc(x))


class _ChildAdds(nn.Module):
    def forward(self, x, y):
        return x + y


class _AddInAChild(nn.Module):
    """fx sees no addition in the block's own forward (the add is inside a child); the probe sees it."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.res = _ChildAdds()

    def forward(self, x):
        return self.res(x, self.fc(x))


def test_find_branches_reports_plain_stacks_only_when_asked():
    model = MLP(32, depth=4)
    depth = DepthMap({"hidden": (1, 3)})
    with pytest.raises(ModelError, match="depth_alpha=0"):
        find_branches(model, depth, None)
    found = find_branches(model, depth, None, report_plain=True)  # fx alone: it saw no addition
    assert found.plain == ["hidden"] and found.branches == [] and found.helpers == []
    found = find_branches(model, depth, None, torch.randn(2, 32), report_plain=True)  # and the probe agrees
    assert found.plain == ["hidden"]


def test_a_plain_stack_fx_cannot_trace_is_observed_on_the_probe():
    model = _Stack(16, 3, _UntraceablePlain)
    depth = DepthMap({"blocks": (1, 3)})
    with pytest.raises(ModelError, match="could not trace"):  # without a probe nothing was observed
        find_branches(model, depth, None, report_plain=True)
    assert find_branches(model, depth, None, torch.randn(2, 8), report_plain=True).plain == ["blocks"]


def test_an_addition_the_probe_sees_is_not_a_plain_stack():
    model = _Stack(16, 3, _AddInAChild)
    found = find_branches(model, DepthMap({"blocks": (1, 3)}), None, torch.randn(2, 8), report_plain=True)
    assert found.plain == [] and [b.module for b in found.branches] == ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc"]


def test_resmlp_under_umup_is_unchanged():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        model = mt.parametrize(ResMLP(64, depth=4), base=ResMLP(32, depth=2), parametrization="u-mup")
    spec = find_spec(model)
    assert spec.umup.plain_stacks == {} and spec.depth == {"blocks": (1, 4)}
    assert sorted(spec.umup.branches) == [f"blocks.{i}.fc2" for i in range(4)]
