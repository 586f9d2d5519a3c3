"""The µP spec survives deepcopy, a state_dict round trip and torch.compile."""

import copy

import pytest
import torch

import mutransfer as mt
from model_helpers import build
from mutransfer.recipes import GPT, MHATransformer


def _groups(model):
    return [
        (g["lr"], g.get("eps"), [tuple(p.shape) for p in g["params"]]) for g in mt.param_groups(model, 1e-2, "adam")
    ]


def test_deepcopy_keeps_spec_hooks_and_outputs():
    m = build(GPT, 128, 32)
    x = torch.randint(0, 256, (2, 16))
    c = copy.deepcopy(m)
    assert torch.equal(m(x), c(x))
    assert _groups(m) == _groups(c)
    assert mt.describe(m) == mt.describe(c)
    assert c.lm_head.weight is c.wte.weight  # tying survives too


def test_state_dict_round_trip_into_a_fresh_model():
    m = build(MHATransformer, 128, 32)
    x = torch.randn(2, 5, 16)
    opt = torch.optim.Adam(mt.param_groups(m, 1e-2, "adam"))
    m(x).sum().backward()
    opt.step()
    state = m.state_dict()
    assert set(state) == set(MHATransformer(128).state_dict())  # keys are the plain model's
    # the documented rebuild: construct, parametrize the same way, load the weights
    fresh = build(MHATransformer, 128, 32, seed=123)
    fresh.load_state_dict(state)
    assert torch.equal(m(x), fresh(x))
    assert _groups(m) == _groups(fresh)


def test_a_plain_models_checkpoint_loads_into_a_mup_model():
    plain = MHATransformer(128)
    mu = build(MHATransformer, 128, 32)
    mu.load_state_dict(plain.state_dict())  # no missing or unexpected keys


@pytest.mark.slow
def test_torch_compile_same_outputs_and_groups():
    m = build(GPT, 128, 32)
    x = torch.randint(0, 256, (2, 16))
    eager = m(x)
    compiled = torch.compile(m)
    assert torch.allclose(compiled(x), eager, atol=1e-5, rtol=1e-5)
    assert _groups(compiled) == _groups(m)
    # a training step through the compiled model uses µP's groups
    opt = torch.optim.Adam(mt.param_groups(compiled, 1e-2, "adam"))
    compiled(x).logsumexp(-1).mean().backward()
    opt.step()
    assert torch.allclose(compiled(x), m(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_attention_hooks_do_not_break_the_compiled_graph():
    import torch._dynamo as dynamo

    dynamo.reset()
    m = build(GPT, 128, 32)
    explanation = dynamo.explain(m)(torch.randint(0, 256, (2, 16)))
    assert explanation.graph_break_count == 0


@pytest.mark.slow
def test_compiling_a_plain_model_first_does_not_drop_mup_multipliers():
    """Dynamo does not guard on forward hooks: µP must not depend on them (tied readout, SDPA)."""
    import torch._dynamo as dynamo

    dynamo.reset()
    x = torch.randint(0, 256, (2, 16))
    build(GPT, 64, 32)  # mutransfer's global state (the SDPA wrapper) exists before anything compiles
    torch.manual_seed(0)
    plain = GPT(128)
    torch.compile(plain)(x)  # a plain instance of the same classes compiled first
    m = build(GPT, 128, 32)
    eager = m(x)
    assert torch.allclose(torch.compile(m)(x), eager, atol=1e-5, rtol=1e-5)


def test_pickled_mup_model_loads_with_its_multipliers(tmp_path):
    import io

    m = build(GPT, 128, 32)
    x = torch.randint(0, 256, (2, 16))
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(x), m(x))
    assert _groups(loaded) == _groups(m)


def test_mup_classes_rebuild_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "model.pt"
    m = build(GPT, 128, 32)
    torch.save(m, path)
    code = (
        f"import torch; m = torch.load(r'{path}', weights_only=False); "
        "print(type(m.lm_head).__name__, m.lm_head._mutransfer_input_mult)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["MuScaledLinear", str(1 / 4)]
