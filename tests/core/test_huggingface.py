"""Hugging Face models parametrize without edits: GPT-2 (Conv1D, tied) and Llama (RMSNorm, untied)."""

import math

import pytest
import torch

import mutransfer as mt

transformers = pytest.importorskip("transformers")


def gpt2(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_embd=width, n_layer=2, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg)


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
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("make", [gpt2, llama])
def test_base_width_is_unchanged(make):
    plain, mu = make(64).eval(), make(64).eval()  # eval: GPT-2 has dropout
    mt.parametrize(mu, base=make(64), delta=make(128))
    x = torch.randint(0, 128, (2, 16))
    assert torch.equal(plain(x).logits, mu(x).logits)


@pytest.mark.slow
def test_gpt2_roles_attention_and_training():
    m = gpt2(256)
    mt.parametrize(m, base=gpt2(64), delta=gpt2(128))
    spec = m._mutransfer_spec
    assert spec.params["transformer.h.0.attn.c_attn.weight"].role == "hidden"  # Conv1D, stored (in, out)
    assert spec.params["transformer.wte.weight"].tied_readouts == ["lm_head"]
    assert m.transformer.h[0].attn.scaling == pytest.approx(math.sqrt(16) / 64)
    opt = torch.optim.AdamW(mt.param_groups(m, 3e-3, "adamw"))
    x = torch.randint(0, 128, (4, 16))
    losses = []
    for _ in range(10):
        loss = m(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.slow
def test_llama_roles_and_zero_query():
    m = llama(256)
    mt.parametrize(m, base=llama(64), delta=llama(128), zero_init_readout=True, zero_init_query=True)
    spec = m._mutransfer_spec
    roles = {n: i.role for n, i in spec.params.items()}
    assert roles["model.embed_tokens.weight"] == "input"
    assert roles["model.layers.0.self_attn.k_proj.weight"] == "hidden"
    assert roles["model.layers.0.mlp.down_proj.weight"] == "hidden"
    assert roles["model.norm.weight"] == "vector"
    assert roles["lm_head.weight"] == "output"
    assert torch.all(m.lm_head.weight == 0) and torch.all(m.model.layers[1].self_attn.q_proj.weight == 0)
    assert m.model.layers[0].self_attn.scaling == pytest.approx(math.sqrt(16) / 64)


def _llama_depth(width, layers, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.slow
def test_llama_across_depth_with_named_branches():
    """HF decoder layers do not trace with torch.fx: the error names the branches by the model's own modules (self_attn)."""
    base, delta = _llama_depth(64, 2), _llama_depth(128, 2)
    with pytest.raises(
        ValueError, match=r"residual_branches=\['model\.layers\.\*\.self_attn', 'model\.layers\.\*\.mlp'\]"
    ):
        mt.parametrize(_llama_depth(128, 8), base=base, delta=delta)
    model = mt.parametrize(
        _llama_depth(128, 8),
        base=base,
        delta=delta,
        depth_alpha=1.0,
        residual_branches=["model.layers.*.self_attn", "model.layers.*.mlp"],
    )
    spec = model._mutransfer_spec
    assert spec.depth == {"model.layers": (2, 8)}
    # the MLP's output is its down_proj's: folded there; attention returns a tuple: forward multiplier
    assert set(spec.folded_branches) == {f"model.layers.{i}.mlp.down_proj" for i in range(8)}
    assert set(spec.branches) == {f"model.layers.{i}.self_attn" for i in range(8)}
    assert all(c == pytest.approx(0.25) for c in [*spec.branches.values(), *spec.folded_branches.values()])
    x = torch.randint(0, 128, (2, 16))
    loss = model(x, labels=x).loss
    loss.backward()
    assert torch.isfinite(loss)
    groups = mt.param_groups(model, 1e-3, "adamw")
    names = {id(p): n for n, p in model.named_parameters()}
    lr = {names[id(p)]: g["lr"] for g in groups for p in g["params"]}
    assert lr["model.layers.5.self_attn.q_proj.weight"] == pytest.approx(1e-3 / 2)  # hidden: 1/m, α=1: ×1
    assert lr["model.layers.5.mlp.down_proj.weight"] == pytest.approx(1e-3 / 2 / 4)  # folded: × m_L^-1
    assert lr["model.norm.weight"] == pytest.approx(1e-3)


@pytest.mark.slow
def test_gpt2_across_depth_with_named_branches():
    def make(width, layers):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(
            n_embd=width, n_layer=layers, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
        )
        return transformers.GPT2LMHeadModel(cfg).eval()

    model = mt.parametrize(
        make(128, 6),
        base=make(64, 2),
        delta=make(128, 2),
        depth_alpha=0.5,
        residual_branches=["transformer.h.*.attn", "transformer.h.*.mlp"],
    )
    spec = model._mutransfer_spec
    assert spec.depth == {"transformer.h": (2, 6)}
    # Conv1D is not a Linear: both branches keep a forward multiplier (3^-½)
    assert set(spec.branches) == {f"transformer.h.{i}.{b}" for i in range(6) for b in ("attn", "mlp")}
    assert spec.folded_branches == {}
    block, x = model.transformer.h[3], torch.randn(2, 8, 128)
    mlp_in = block.ln_2(x)
    unscaled = type(block.mlp)._mutransfer_parent.forward(block.mlp, mlp_in)
    torch.testing.assert_close(block.mlp(mlp_in), unscaled * 3**-0.5)
    ids = torch.randint(0, 128, (2, 16))
    assert torch.isfinite(model(ids, labels=ids).loss)
