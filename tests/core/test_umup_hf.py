"""u-µP on Hugging Face models (issue 50 item 1), built from tiny configs (no download): GPT-2 (Conv1D,
tied readout, NewGELUActivation) and Llama (RMSNorm, SwiGLU, GQA, untied) parametrized with
parametrization="u-mup": they run, describe prints the scales, export gives the same logits, every
block output is unit-scaled at init, and GPT-2's written-out GELU gets tanh-GELU's unit rule."""

import warnings

import pytest
import torch

import mutransfer as mt
from mutransfer._core.spec import find_spec
from mutransfer.errors import MuPWarning

transformers = pytest.importorskip("transformers")

X = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def gpt2(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_embd=width, n_layer=2, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def llama(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


BLOCKS = {gpt2: "transformer.h", llama: "model.layers"}


def umup(make, width=128):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = mt.parametrize(make(width), base=make(32), delta=make(64), parametrization="u-mup")
    return model, [str(w.message) for w in caught if issubclass(w.category, MuPWarning)]


def block_rms(model, prefix):
    got = {}
    blocks = dict(model.named_modules())[prefix]

    def hook(i):
        return lambda m, a, o: got.__setitem__(
            i, float((o[0] if isinstance(o, tuple) else o).double().pow(2).mean().sqrt())
        )

    hooks = [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
    with torch.no_grad():
        logits = model(X).logits
    for h in hooks:
        h.remove()
    return got, logits


@pytest.mark.slow
@pytest.mark.parametrize("make", [gpt2, llama])
def test_umup_hf_model_runs_unit_scaled_describes_and_exports(make):
    model, _ = umup(make)
    spec = find_spec(model)
    assert spec.parametrization == "u-mup"
    # every hidden weight unit-variance (rules.UMUP's init column: 1)
    for name, row in spec.umup.rows.items():
        if row == "hidden":
            w = dict(model.named_parameters())[name]
            assert 0.9 < float(w.detach().double().pow(2).mean().sqrt()) < 1.1, name
    rms, logits = block_rms(model, BLOCKS[make])
    assert torch.isfinite(logits).all()
    assert len(rms) == 2 and all(0.5 <= v <= 2.0 for v in rms.values()), rms  # measured 1.50 … 1.90
    text = mt.describe(model)
    assert "u-µP" in text and "rules.UMUP" in text
    plain = mt.export(model)
    assert find_spec(plain) is None
    with torch.no_grad():
        exported = plain(X).logits
    assert torch.allclose(exported, logits, rtol=1e-4, atol=1e-5 * float(logits.abs().max()))


@pytest.mark.slow
def test_gpt2s_written_out_gelu_gets_the_unit_rule_of_tanh_gelu():
    """GPT-2's NewGELUActivation is tanh-GELU written out in mul/pow/add/tanh: the probe recognises it by
    its values as gelu(approximate="tanh"), so c_proj's input gets GELU's unit scale (before: named as an
    op without a unit rule, its input left at GELU's own scale)."""
    from mutransfer._core.unit_ops import activation_scale

    model, msgs = umup(gpt2)
    assert not [m for m in msgs if "no unit rule" in m], msgs
    sigma = activation_scale("gelu", 1.0, (("approximate", "tanh"),))
    acts = find_spec(model).umup.activations
    assert [(c, f) for c, f, _ in acts] == [(f"transformer.h.{i}.mlp.c_proj", "gelu") for i in range(2)]
    assert all(s == pytest.approx(sigma) for _, _, s in acts)
    # Llama's SiLU·up (SwiGLU) has its rule: no such warning
    _, msgs = umup(llama)
    assert not [m for m in msgs if "no unit rule" in m], msgs


def _deep(make, n_layer, width=64):
    def build(w, seed=0):
        model = make(w, seed)
        cfg = model.config
        cfg.num_hidden_layers = n_layer
        if hasattr(cfg, "n_layer"):
            cfg.n_layer = n_layer
        torch.manual_seed(seed)
        return type(model)(cfg).eval()

    return build


@pytest.mark.slow
@pytest.mark.parametrize("make", [gpt2, llama])
@pytest.mark.parametrize("n_layer", [4, 8])
def test_the_tau_rule_applies_to_hf_blocks_fx_cannot_trace(make, n_layer):
    """torch.fx cannot trace GPT2Block / LlamaDecoderLayer ("co_varnames is too small"): the residual
    branches are observed on the probe (the children whose outputs are added onto the block's input), so
    u-µP's τ rule applies — no fallback warning, and the residual stream stays at unit scale with depth
    (before: "no residual rule", every branch unit-scaled and summed, RMS ≈ √(1 + 2L))."""
    build = _deep(make, n_layer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = mt.parametrize(build(128), base=build(32), delta=build(64), parametrization="u-mup")
    msgs = [str(w.message) for w in caught if issubclass(w.category, MuPWarning)]
    assert not [m for m in msgs if "residual" in m], msgs
    plan = find_spec(model).umup
    attn = "attn" if make is gpt2 else "self_attn"
    assert sorted(plan.branches) == sorted(f"{BLOCKS[make]}.{i}.{b}" for i in range(n_layer) for b in (attn, "mlp"))
    assert [k for k, _ in plan.branches.values()].count("attention") == n_layer
    rms, logits = block_rms(model, BLOCKS[make])
    assert len(rms) == n_layer and all(0.5 <= v <= 2.0 for v in rms.values()), rms
    plain = mt.export(model)
    with torch.no_grad():
        exported = plain(X).logits
    assert torch.allclose(exported, logits, rtol=1e-4, atol=1e-5 * float(logits.abs().max()))


@pytest.mark.slow
def test_the_residual_fallback_names_the_models_own_branch_modules():
    """Where neither fx nor a probe finds the branches, the suggested patterns are the block's own children."""
    from mutransfer._core.branches import find_branches
    from mutransfer._core.depth import DepthMap
    from mutransfer.errors import ModelError

    model = llama(64)
    with pytest.raises(ModelError) as err:
        find_branches(model, DepthMap({"model.layers": (1, 2)}), None)  # no probe input
    msg = str(err.value)
    assert "'model.layers.*.self_attn'" in msg and "'model.layers.*.mlp'" in msg
    assert "'model.layers.*.attn'" not in msg and "layernorm" not in msg


def gpt_neox(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPTNeoXConfig(
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=128,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPTNeoXForCausalLM(cfg).eval()


def test_gpt_neoxs_parallel_residual_gets_the_tau_rule_and_exports():
    """GPT-NeoX adds attention and MLP together before the stream (`mlp + attn + x`), each through a dropout:
    the probe takes the sum's two sources as the branches and looks through the dropouts (before: 'adds a
    Tensor that no child of GPTNeoXLayer returned', no τ rule, a warning)."""
    model, msgs = umup(gpt_neox)
    assert not [m for m in msgs if "residual" in m], msgs
    branches = find_spec(model).umup.branches
    assert set(branches) == {f"gpt_neox.layers.{i}.{c}" for i in range(2) for c in ("attention", "mlp")}
    assert {kind for kind, _ in branches.values()} == {"attention", "mlp"}
    with torch.no_grad():
        logits = model(X).logits
        exported = mt.export(model)(X).logits
    assert torch.allclose(exported, logits, rtol=1e-4, atol=1e-5 * float(logits.abs().max()))
