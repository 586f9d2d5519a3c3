"""Tunable multipliers (µTransfer HPs) and zero-init options."""

import pytest
import torch

import mutransfer as mt
from model_helpers import build
from mutransfer.recipes import GPT, MLP, MHATransformer


def test_init_and_lr_multipliers_per_role():
    torch.manual_seed(0)
    ref = mt.parametrize(MLP(256), base=MLP(64), delta=MLP(128))
    torch.manual_seed(0)
    m = mt.parametrize(MLP(256), base=MLP(64), delta=MLP(128), init_mult={"hidden": 2.0}, lr_mult={"output": 3.0})
    assert torch.allclose(m.hidden[0].weight, 2 * ref.hidden[0].weight)
    assert torch.equal(m.input.weight, ref.input.weight)
    lr = {id(p): g["lr"] for g in mt.param_groups(m, 1e-2, "adam") for p in g["params"]}
    assert lr[id(m.readout.weight)] == pytest.approx(3 * 1e-2 / 4)
    assert lr[id(m.hidden[0].weight)] == pytest.approx(1e-2 / 4)


def test_multipliers_apply_at_base_width_too():
    torch.manual_seed(0)
    plain = MLP(64)
    torch.manual_seed(0)
    m = mt.parametrize(MLP(64), base=MLP(64), delta=MLP(128), init_mult={"input": 0.5}, output_mult=2.0)
    assert torch.equal(m.input.weight, 0.5 * plain.input.weight)
    assert m._mutransfer_spec.forward_constants == {"readout": ("input ×", 2.0)}


def test_output_and_embedding_multipliers_scale_the_forward_pass():
    torch.manual_seed(0)
    ref = mt.parametrize(MLP(256, bias=False), base=MLP(64, bias=False), delta=MLP(128, bias=False))
    torch.manual_seed(0)
    m = mt.parametrize(
        MLP(256, bias=False), base=MLP(64, bias=False), delta=MLP(128, bias=False), output_mult=3.0, embedding_mult=2.0
    )
    x = torch.randn(5, 32)
    # relu is positively homogeneous and there are no biases: the two constants multiply through
    assert torch.allclose(m(x), 6.0 * ref(x), atol=1e-6)


def test_table8_readout_multiplier_is_one_over_m():
    m = build(MLP, 256, 64)
    torch.manual_seed(0)
    t8 = mt.parametrize(MLP(256), base=MLP(64), delta=MLP(128), formulation="table8", output_mult=2.0)
    assert t8._mutransfer_spec.forward_constants == {"readout": ("input ×", 0.5)}
    assert m._mutransfer_spec.forward_constants == {}


def test_zero_init_readout_and_query():
    m = build(GPT, 128, 32, tied=False)
    torch.manual_seed(0)
    z = mt.parametrize(
        GPT(128, tied=False),
        base=GPT(32, tied=False),
        delta=GPT(64, tied=False),
        zero_init_readout=True,
        zero_init_query=True,
    )
    assert torch.all(z.lm_head.weight == 0)
    qkv = z.blocks[0].attn.qkv
    assert torch.all(qkv.weight[:128] == 0) and torch.all(qkv.weight[128:] != 0)
    assert torch.all(qkv.bias[:128] == 0)
    assert z._mutransfer_spec.zero_init == [
        "lm_head.weight",
        "blocks.0.attn.qkv (query third)",
        "blocks.0.attn.qkv.bias (query third)",
        "blocks.1.attn.qkv (query third)",
        "blocks.1.attn.qkv.bias (query third)",
    ]
    assert not torch.all(m.lm_head.weight == 0)


def test_zero_init_query_of_multihead_attention_and_by_pattern():
    torch.manual_seed(0)
    m = mt.parametrize(MHATransformer(128), base=MHATransformer(32), delta=MHATransformer(64), zero_init_query=True)
    assert torch.all(m.attn.in_proj_weight[:128] == 0) and torch.all(m.attn.in_proj_weight[128:] != 0)
    torch.manual_seed(0)
    m = mt.parametrize(MLP(128), base=MLP(32), delta=MLP(64), zero_init_query="hidden.0")
    assert torch.all(m.hidden[0].weight == 0)
    with pytest.raises(ValueError, match="no query projection found"):
        mt.parametrize(MLP(128), base=MLP(32), delta=MLP(64), zero_init_query=True)


def test_embedding_mult_reaches_a_tied_token_embedding():
    # α_embedding used to skip an embedding tied to the readout (nanoGPT's wte): silently not in effect
    from mutransfer.recipes import GPT

    torch.manual_seed(0)
    m = mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64), embedding_mult=2.0)
    consts = m._mutransfer_spec.forward_constants
    assert consts["wte"] == ("output ×", 2.0) and consts["wpe"] == ("output ×", 2.0)
    assert consts["lm_head"][0] == "input ×"  # the readout keeps its own multiplier only
    idx = torch.randint(0, 256, (2, 8))
    assert torch.equal(m.wte(idx), 2.0 * torch.nn.functional.embedding(idx, m.wte.weight))
    assert m.lm_head.weight is m.wte.weight


def test_a_multiplier_for_a_module_that_never_runs_is_left_out_with_a_warning():
    transformers = pytest.importorskip("transformers")

    def mamba(w):
        torch.manual_seed(0)
        return transformers.MambaForCausalLM(
            transformers.MambaConfig(
                hidden_size=w,
                num_hidden_layers=1,
                vocab_size=64,
                state_size=4,
                expand=2,
                conv_kernel=2,
                time_step_rank=4,
                use_cache=False,
            )
        )

    with pytest.warns(mt.MuPWarning, match=r"'backbone\.layers\.0\.mixer\.dt_proj'.*never runs"):
        m = mt.parametrize(mamba(64), base=mamba(16), delta=mamba(32), embedding_mult=1.5)
    consts = m._mutransfer_spec.forward_constants
    assert "backbone.layers.0.mixer.dt_proj" not in consts  # not described as in effect
    assert consts["backbone.embeddings"] == ("output ×", 1.5)
    line = next(x for x in mt.describe(m).splitlines() if x.startswith("forward constants:"))
    assert "dt_proj" not in line and "backbone.embeddings output ×1.5" in line
