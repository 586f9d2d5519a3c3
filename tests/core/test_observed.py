"""Observe, don't assume: roles from how the forward uses each parameter, attention scales measured.

Each of the five silent failures found on real architectures has a test here that failed before
the probe forward existed: T5's scale-1 attention, timm's non-fused ``q * self.scale``, Mixtral's
router and fused 3-D experts, a coordinate check blind to attention left at 1/√d, and nanoGPT's
attention written inline in the block.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt


def observe_model(model, inputs=None):
    from mutransfer._core.observe import observe_model as observe  # imported here: each test fails on its own before

    return observe(model, inputs)


def factors(model, name, family):
    return model._mutransfer_spec.factors(name, family)


# --------------------------------------------------------------------------- hand-written models


class TimmStyleAttention(nn.Module):
    """timm's Attention: fused SDPA or, with fused_attn=False, `q * self.scale` then matmul → softmax."""

    def __init__(self, dim, num_heads=4, fused=False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            q = q * self.scale
            x = (q @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class TinyViT(nn.Module):
    def __init__(self, width, fused=False, tokens=8, classes=10):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, width) * 0.02)
        self.patch = nn.Linear(12, width)
        self.norm = nn.LayerNorm(width)
        self.attn = TimmStyleAttention(width, fused=fused)
        self.gamma = nn.Parameter(torch.full((width,), 0.1))  # layer scale
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.patch(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = x + self.gamma * self.attn(self.norm(x))
        return self.head(x[:, 0])


class RawMoE(nn.Module):
    """A router and fused experts held as raw parameters, used through F.linear / einsum."""

    def __init__(self, width, experts=4, classes=8):
        super().__init__()
        self.embed = nn.Embedding(32, width)
        self.router = nn.Parameter(torch.randn(experts, width) / width**0.5)
        self.w_in = nn.Parameter(torch.randn(experts, 2 * width, width) / width**0.5)  # (E, f, d)
        self.w_out = nn.Parameter(torch.randn(experts, width, 2 * width) / width**0.5)  # (E, d, f)
        self.readout = nn.Parameter(torch.randn(width, classes) / width**0.5)  # used as x @ W

    def forward(self, ids):
        x = self.embed(ids)
        gates = F.linear(x, self.router).softmax(-1)  # (b, t, E)
        h = torch.einsum("btd,efd->btef", x, self.w_in).relu()
        y = torch.einsum("btef,edf->bted", h, self.w_out)
        x = x + (gates.unsqueeze(-1) * y).sum(-2)
        return x @ self.readout


class NanoBlock(nn.Module):
    """nanoGPT-style: attention written inline in the block, `self.n_head`, no `n_embd` attribute."""

    def __init__(self, width, n_head=4):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, width, vocab=64, n_layer=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(16, width)
        self.h = nn.ModuleList(NanoBlock(width) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class InlineEager(nn.Module):
    """Hand-written attention dividing by math.sqrt(d) itself: nothing outside can rescale it."""

    def __init__(self, width, n_head=2):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in self.qkv(x).split(c, -1))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        return (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)


# --------------------------------------------------------------------------- usage → roles


def test_usage_of_raw_router_fused_experts_and_raw_readout():
    # seeded: the init scale below is the ratio of two single draws' rms (noisy for small tensors),
    # and without a seed it depended on which tests ran before
    torch.manual_seed(0)
    model = mt.parametrize(RawMoE(256), base=RawMoE(32), delta=RawMoE(64))
    spec = model._mutransfer_spec
    info = spec.params
    assert info["router"].role == "output" and info["router"].source == "usage"
    # einsum "btd,efd->btef": d contracted (fan_in); f and the finite expert dim e are kept (fan_out)
    assert info["w_in"].role == "hidden" and info["w_in"].fan_in_dims == (2,)
    assert (info["w_in"].m_in, info["w_in"].m_out) == (8.0, 8.0)
    assert info["w_out"].role == "hidden" and (info["w_out"].fan_in_dims, info["w_out"].fan_out_dims) == ((2,), (1,))
    assert info["readout"].role == "output"  # x @ W: fan_in is dim 0 of a (d, classes) matrix
    assert info["embed.weight"].role == "input"
    # m = 8: router Adam lr 1/8; experts SGD lr ×1 (m_out/m_in) and Adam ε ×1/8
    assert factors(model, "router", "adam")[0] == pytest.approx(1 / 8)
    assert factors(model, "w_in", "sgd")[0] == pytest.approx(1.0)
    assert factors(model, "w_in", "adam") == pytest.approx((1 / 8, 1 / 8))
    assert factors(model, "readout", "adam")[0] == pytest.approx(1 / 8)
    # init: the readout ×1/m against the base's init, the hidden experts ×1/√m (both rescaled from the base)
    assert spec.init_scales["readout"] == pytest.approx((1 / 8) * (256 / 32) ** 0.5, rel=0.1)


def test_vit_style_raw_parameters_are_vector_like():
    model = mt.parametrize(TinyViT(128), base=TinyViT(32), delta=TinyViT(64), example_inputs=torch.randn(2, 8, 12))
    info = model._mutransfer_spec.params
    for name in ("cls_token", "pos_embed", "gamma"):
        assert info[name].role == "vector" and info[name].source == "usage", name
    assert info["patch.weight"].role == "input" and info["head.weight"].role == "output"


def test_roles_without_a_probe_warn_and_name_the_override():
    class Opaque(nn.Module):  # no input can be made for it
        def __init__(self, w):
            super().__init__()
            self.w = nn.Parameter(torch.randn(w, w))

        def forward(self, x, y, z):
            return x @ self.w

    with pytest.warns(mt.MuPWarning, match=r"roles of w follow their shapes only .*example_inputs="):
        mt.parametrize(Opaque(64), base=Opaque(16), delta=Opaque(32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = mt.parametrize(Opaque(64), base=Opaque(16), delta=Opaque(32), example_inputs=(torch.randn(2, 64), 0, 0))
    assert m._mutransfer_spec.params["w"].source == "usage"


def test_bad_example_inputs_are_an_error():
    with pytest.raises(ValueError, match="could not run the model on example_inputs"):
        mt.parametrize(NanoGPT(64), base=NanoGPT(32), delta=NanoGPT(48), example_inputs=torch.randn(2, 3))


# --------------------------------------------------------------------------- attention measured


def test_timm_non_fused_attention_gets_the_mup_scale_through_its_attribute():
    x = torch.randn(2, 8, 12)
    model = mt.parametrize(TinyViT(128), base=TinyViT(32), delta=TinyViT(64))  # inputs made from its first layer
    attn = model.attn  # 4 heads: d = 32, d₀ = 8
    assert attn.scale == pytest.approx(math.sqrt(8) / 32)
    [entry] = model._mutransfer_spec.attention
    assert entry.how == "attribute scale" and entry.verified
    assert entry.scale == pytest.approx(math.sqrt(8) / 32)  # measured on the probe forward
    assert observe_model(model, x).attention[0].scale == pytest.approx(math.sqrt(8) / 32)
    assert "0.08839" in mt.describe(model)


def test_timm_fused_attention_too():
    x = torch.randn(2, 8, 12)
    model = mt.parametrize(TinyViT(128, fused=True), base=TinyViT(32, fused=True), delta=TinyViT(64, fused=True))
    assert observe_model(model, x).attention[0].scale == pytest.approx(math.sqrt(8) / 32)


def test_nanogpt_inline_attention_head_dim_read_at_call_time():
    model = mt.parametrize(NanoGPT(128), base=NanoGPT(32), delta=NanoGPT(64))
    entries = {a.module: a for a in model._mutransfer_spec.attention}
    assert set(entries) == {"h.0", "h.1"}  # the blocks call SDPA themselves
    assert all((a.d0, a.d, a.how) == (8, 32, "sdpa") for a in entries.values())
    seen = observe_model(model, torch.randint(0, 64, (1, 8))).attention
    assert [round(c.scale, 6) for c in seen] == [round(math.sqrt(8) / 32, 6)] * 2


def test_inline_eager_scale_cannot_be_reached_and_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"attention module '' \(InlineEager\).*mt.attn_scale\(self, head_dim\)"):
        mt.parametrize(
            InlineEager(64), base=InlineEager(16), delta=InlineEager(32), example_inputs=torch.randn(1, 4, 64)
        )
    model = mt.parametrize(
        InlineEager(64),
        base=InlineEager(16),
        delta=InlineEager(32),
        example_inputs=torch.randn(1, 4, 64),
        attention=False,
    )
    assert model._mutransfer_spec.attention == []


def test_qk_norm_scale_counts_only_what_follows_the_norm():
    class QKNorm(nn.Module):
        def __init__(self, w, n_head=2):
            super().__init__()
            self.n_head, self.scaling = n_head, (w // n_head) ** -0.5
            self.qkv = nn.Linear(w, 3 * w)

        def rms(self, z):
            z = z * 7.0  # a constant before the norm does not reach the logits
            return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in self.qkv(x).split(c, -1))
            y = F.scaled_dot_product_attention(self.rms(q), self.rms(k), v, scale=self.scaling)
            return y.transpose(1, 2).reshape(b, t, c)

    x = torch.randn(1, 4, 64)
    assert observe_model(QKNorm(64), x).attention[0].scale == pytest.approx(32**-0.5)
    model = mt.parametrize(QKNorm(64), base=QKNorm(16), delta=QKNorm(32), example_inputs=x)
    assert model.scaling == pytest.approx(math.sqrt(8) / 32)
    assert model._mutransfer_spec.attention[0].how == "attribute scaling"


class ScaleOne(nn.Module):
    """T5-style: no constant on q·kᵀ (the 1/√d would live in the query's init)."""

    def __init__(self, width, n_head=4):
        super().__init__()
        self.n_head, self.scaling = n_head, 1.0
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in self.qkv(x).split(c, -1))
        return ((q @ k.transpose(-2, -1)) * self.scaling).softmax(-1) @ v


def test_scale_one_attention_through_a_shapes_file(tmp_path):
    path = tmp_path / "shapes.json"
    mt.save_shapes(ScaleOne(32), ScaleOne(64), path)  # the base's scale (1) is measured and saved
    model = mt.parametrize(ScaleOne(128), base_shapes=path)
    assert model.scaling == pytest.approx(8 / 32)  # d₀/d, not √(d₀/d)
    assert model._mutransfer_spec.attention[0].verified


# --------------------------------------------------------------------------- Hugging Face

transformers = pytest.importorskip("transformers")


def t5(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.T5Config(
        vocab_size=64,
        d_model=width,
        d_kv=width // 4,
        d_ff=2 * width,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        dropout_rate=0.0,
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return transformers.T5ForConditionalGeneration(cfg)


def mixtral(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=64,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return transformers.MixtralForCausalLM(cfg)


@pytest.mark.slow
def test_t5_scale_one_attention_gets_d0_over_d():
    model = mt.parametrize(t5(256), base=t5(64), delta=t5(128))
    spec = model._mutransfer_spec
    # T5 keeps its 1/√d in the query's init and computes q·kᵀ × 1: µP's scale is 1 · d₀/d = 1/4
    assert {a.how for a in spec.attention} == {"attribute scaling"}
    assert all(a.scale == pytest.approx(0.25) and a.verified for a in spec.attention)
    assert model.encoder.block[0].layer[0].SelfAttention.scaling == pytest.approx(0.25)
    text = mt.describe(model)
    assert "× 0.25" in text and "0.125" not in text


@pytest.mark.slow
def test_mixtral_router_and_fused_experts():
    model = mt.parametrize(mixtral(256), base=mixtral(32), delta=mixtral(64))
    info = model._mutransfer_spec.params
    router = "model.layers.0.mlp.gate.weight"
    assert info[router].role == "output"
    assert factors(model, router, "adam")[0] == pytest.approx(1 / 8)
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert info[name].role == "hidden", name
        assert factors(model, name, "sgd")[0] == pytest.approx(1.0)
        assert factors(model, name, "adam") == pytest.approx((1 / 8, 1 / 8))


def gpt2(width, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_embd=width,
        n_layer=2,
        n_head=4,
        vocab_size=64,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg)


@pytest.mark.slow
def test_coord_check_catches_gpt2_attention_left_at_one_over_sqrt_d():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (8, 16))
    data = [({"input_ids": ids, "labels": ids}, None)]

    def make(attention):
        def build(width):
            return mt.parametrize(gpt2(width), base=gpt2(32), delta=gpt2(64), attention=attention)

        return build

    widths = [32, 64, 128, 256]
    good = mt.coord_check(make(True), widths, data, steps=3, progress=False)
    assert good.passed, str(good)
    bad = mt.coord_check(make(False), widths, data, steps=3, progress=False)
    assert not bad.passed
    culprits = [t for t in bad.failures if t.module.endswith("[attn logits]")]
    assert culprits and culprits[0].step == 0 and culprits[0].expected == pytest.approx(-0.5)


def test_a_roles_pattern_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match="roles pattern 'embed_out.weight' matches no parameter"):
        mt.parametrize(NanoGPT(64), base=NanoGPT(32), delta=NanoGPT(48), roles={"embed_out.weight": "output"})


def _family(name, width):
    torch.manual_seed(0)
    common = dict(vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if name == "bloom":  # ALiBi, baddbmm(alibi, q, k, alpha=inv_norm_factor)
        return transformers.BloomForCausalLM(transformers.BloomConfig(hidden_size=width, n_layer=1, n_head=4, **common))
    if name == "olmo2":  # QK-norm
        return transformers.Olmo2ForCausalLM(
            transformers.Olmo2Config(
                hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1, num_attention_heads=4, **common
            )
        )
    if name == "gemma2":  # logit soft-capping, query_pre_attn_scalar, sliding window
        return transformers.Gemma2ForCausalLM(
            transformers.Gemma2Config(
                hidden_size=width,
                intermediate_size=2 * width,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=width // 4,
                query_pre_attn_scalar=width // 4,
                **common,
            )
        )
    raise KeyError(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bloom", "olmo2", "gemma2"])
def test_other_attention_families_get_a_measured_mup_scale(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.MuPWarning)
        model = mt.parametrize(_family(name, 256), base=_family(name, 64), delta=_family(name, 128))
    entries = model._mutransfer_spec.attention
    assert entries and all(a.verified and a.scale == pytest.approx(math.sqrt(16) / 64) for a in entries)
    assert all(a.how.startswith("attribute") for a in entries)
