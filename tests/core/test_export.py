"""`mt.export`: a µP model made plain — reloaded by code that knows nothing of µP, same outputs."""

import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_depth import Stack
from torch import nn

import mutransfer as mt
from zoo import GPT, ZOO, loss_of, params, run

# Largest relative difference (max |Δ| / max |reference|) allowed after an export round trip. Measured
# (float32, 2-core CPU): at most 2.7e-7 over the round trips of this file and every zoo model (T5 the
# worst; some are exact, 0); `pytest -s` prints each. 1e-6 (about 8 float32 ε) leaves 3.7×;
# export's own check allows 1e-5.
RTOL = 1e-6


def rel(a, b, what="export round trip"):
    error = float((a - b).abs().max() / b.abs().max())
    print(f"{os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}: {what}, relative difference {error:.2g}")
    return error


def train(model, batches, lr=1e-2):
    """A few AdamW steps so that q and k align (the attention fold then matters more)."""
    opt = torch.optim.AdamW(mt.param_groups(model, lr=lr, optimizer="adamw"))
    model.train()
    for inputs, targets in batches:
        loss = loss_of(run(model, inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


# ---------------------------------------------------------------------------- hand-written GPT (SDPA)


def nanogpt(width, layers=2, seed=0):
    torch.manual_seed(seed)
    return GPT(width, n_layer=layers)


@pytest.mark.parametrize("layers", [2, 4])
def test_hand_written_gpt_reloads_into_its_plain_class(layers):
    m = nanogpt(128, layers)
    mt.parametrize(m, base=nanogpt(32), delta=nanogpt(64), output_mult=2.0, attn_mult=1.5)
    data = [ZOO["nanogpt"].batch(s) for s in range(3)]
    train(m, data)
    x = data[0][0]
    before = run(m, x)[0].detach()
    plain = mt.export(m)
    fresh = nanogpt(128, layers)  # the user's class, never parametrized
    fresh.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert rel(run(fresh.eval(), x)[0], before) <= RTOL
        # the µP model itself is untouched: same class, same outputs
        assert type(m.transformer.h[0].attn).__name__.startswith("MuScaled") or m._mutransfer_spec.attention
        assert torch.equal(run(m, x)[0], before)
    # exported: no µP class, no spec; the tie is kept (the factor went into ln_f)
    assert all("MuScaled" not in type(mod).__name__ for mod in plain.modules())
    assert not hasattr(plain, "_mutransfer_spec")
    assert plain.lm_head.weight is plain.transformer.wte.weight
    # and the naive state_dict copy is wrong: the reason export exists
    naive = nanogpt(128, layers)
    naive.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert rel(run(naive.eval(), x)[0], before, "reloaded without export") > 0.05


# ---------------------------------------------------------------------------- other attention forms


class MHANet(nn.Module):
    def __init__(self, width, heads=4):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h + self.attn(h, h, h, need_weights=False)[0])


class HelperAttention(nn.Module):
    def __init__(self, width, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(c, -1))
        att = (mt.attn_logits(self, q, k)).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class HelperBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.attn = HelperAttention(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        x = x + mt.residual_branch(self, self.attn(self.ln(x)))
        return x + mt.residual_branch(self, self.fc(F.gelu(x)))


def HelperNet(width, depth=2):
    return Stack(width, depth, HelperBlock)  # test_depth's stack of blocks, with the helper blocks


@pytest.mark.parametrize(
    "make, kwargs",
    [
        (lambda w, d=2: MHANet(w), {}),
        (HelperNet, {}),
        (HelperNet, {"formulation": "table8", "output_mult": 3.0}),
    ],
)
def test_mha_helper_attention_and_helper_branches_reload(make, kwargs):
    torch.manual_seed(0)
    deep = make(128, 4)
    torch.manual_seed(1)
    mt.parametrize(deep, base=make(32, 2), delta=make(64, 2), attn_mult=2.0, **kwargs)
    x = torch.randn(2, 6, 8)
    plain = mt.export(deep)
    fresh = make(128, 4)
    fresh.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert rel(fresh(x), deep(x)) <= RTOL
    assert type(plain.modules().__next__()) is type(fresh)
    assert all(type(a) is type(b) for a, b in zip(plain.modules(), fresh.modules()))


# ---------------------------------------------------------------------------- what cannot be made plain


class TiedNoNorm(nn.Module):
    """A tied readout right after a GELU: no affine norm can take the readout multiplier."""

    def __init__(self, width):
        super().__init__()
        self.emb = nn.Embedding(50, width)
        self.mid = nn.Linear(width, width)
        self.head = nn.Linear(width, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(F.gelu(self.mid(self.emb(idx))))


def test_a_tied_readout_without_a_norm_is_refused_by_name_and_untie_makes_it_plain():
    torch.manual_seed(0)
    m = mt.parametrize(TiedNoNorm(128), base=TiedNoNorm(32), delta=TiedNoNorm(64))
    with pytest.raises(ValueError, match=r"readout 'head' shares its weight with emb\.weight .*untie=True"):
        mt.export(m)
    plain = mt.export(m, untie=True)
    assert plain.head.weight is not plain.emb.weight
    idx = torch.randint(0, 50, (2, 5))
    fresh = TiedNoNorm(128)
    fresh.head.weight = nn.Parameter(torch.empty_like(fresh.head.weight))  # the plain code, untied
    fresh.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert rel(fresh(idx), m(idx)) <= RTOL


class RawQuery(nn.Module):
    """q from a raw parameter (no layer to fold into), SDPA with its inline scale."""

    def __init__(self, width, heads=4):
        super().__init__()
        self.heads = heads
        self.wq = nn.Parameter(torch.randn(width, width) / math.sqrt(width))
        self.wk = nn.Parameter(torch.randn(width, width) / math.sqrt(width))
        self.v = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k = ((x @ w).view(b, t, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk))
        v = self.v(x).view(b, t, self.heads, -1).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c)


class RawNet(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.attn = RawQuery(width)
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        return self.out(self.attn(self.inp(x)))


def test_attention_whose_query_no_layer_makes_is_refused_naming_the_module():
    torch.manual_seed(0)
    m = mt.parametrize(RawNet(128), base=RawNet(32), delta=RawNet(64), example_inputs=torch.randn(2, 6, 8))
    with pytest.raises(ValueError, match=r"attention module 'attn' \(RawQuery\) needs its logits ×0\.5"):
        mt.export(m, torch.randn(2, 6, 8))


def test_a_model_that_was_never_parametrized_is_refused():
    with pytest.raises(ValueError, match="never parametrized"):
        mt.export(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="nn.Module"):
        mt.export("model")


# ---------------------------------------------------------------------------- Hugging Face round trip


transformers = pytest.importorskip("transformers")


def gpt2(width, tied=True, layers=2, seed=0):
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_embd=width,
            n_layer=layers,
            n_head=4,
            vocab_size=128,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=tied,
        )
    )


def llama(width, tied=False, layers=2, seed=0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=32,
            tie_word_embeddings=tied,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
    )


BRANCHES = {
    gpt2: ["transformer.h.*.attn", "transformer.h.*.mlp"],
    llama: ["model.layers.*.self_attn", "model.layers.*.mlp"],
}


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("layers", [2, 4], ids=["width", "width+depth"])
def test_hugging_face_save_pretrained_reloads_in_plain_transformers(tmp_path, make, tied, layers):
    m = make(256, tied, layers)
    mt.parametrize(
        m, base=make(32, tied), delta=make(64, tied), residual_branches=BRANCHES[make] if layers > 2 else None
    )
    x = torch.randint(0, 128, (2, 16))
    train(m, [({"input_ids": x, "labels": x}, x)] * 3, lr=3e-3)
    with torch.no_grad():
        ref = m(x).logits
    m.save_pretrained(tmp_path / "naive")
    mt.export(m).save_pretrained(tmp_path / "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        naive = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "naive").eval()
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    with torch.no_grad():
        assert rel(plain(x).logits, ref) <= RTOL
        # without export the reload is silently different
        assert rel(naive(x).logits, ref, "reloaded without export") > 1e-4
    if tied:
        assert plain.lm_head.weight.data_ptr() == plain.get_input_embeddings().weight.data_ptr()
    assert plain.config.use_cache


# ---------------------------------------------------------------------------- every zoo model


@pytest.mark.slow
@pytest.mark.parametrize("name", params())  # every entry; an uninstalled package skips
def test_every_zoo_model_exports_after_training(name):
    e = ZOO[name]
    m = e.make(128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mt.parametrize(
            m,
            base=e.make(32),
            delta=e.make(64),
            output_mult=2.0,
            attn_mult=1.3,
            embedding_mult=1.0 if "vit" in name else 1.5,
        )
    train(m, e.data(2))
    x = e.inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = mt.export(m, x)
    fresh = e.make(128)
    fresh.load_state_dict(plain.state_dict())
    fresh.eval()
    from mutransfer._core.export_check import relative_error as _error

    with torch.no_grad():
        error = _error(run(fresh, x), run(m, x))
    print(f"{name}: export round trip, relative difference {error:.2g}")
    assert error <= RTOL


def test_zero_initialised_readout_and_query_still_fold_correctly():
    # the fold decisions are taken on a copy with the zeros filled, so they cannot pass on zeros;
    # after training the weights are not zero and the reload must match
    m = llama(128)
    mt.parametrize(m, base=llama(32), delta=llama(64), zero_init_readout=True, zero_init_query=True)
    plain0 = mt.export(m)  # at init: exported with its zeros
    assert not plain0.model.layers[0].self_attn.q_proj.weight.any() and not plain0.lm_head.weight.any()
    x = torch.randint(0, 128, (2, 16))
    train(m, [({"input_ids": x, "labels": x}, x)] * 3, lr=3e-3)
    fresh = llama(128)
    fresh.load_state_dict(mt.export(m).state_dict())
    with torch.no_grad():
        assert rel(fresh.eval()(x).logits, m(x).logits) <= RTOL


# ---------------------------------------------------------------------------- the command


BUILD = """
import mutransfer as mt
from mutransfer.recipes import GPT

def build():
    return mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64))
"""


def test_the_export_command_writes_a_checkpoint_the_plain_class_loads(tmp_path, capsys):
    from mutransfer.cli import main
    from mutransfer.recipes import GPT

    (tmp_path / "build.py").write_text(BUILD)
    torch.manual_seed(0)
    m = mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64), output_mult=2.0)  # trained: values differ from build()
    torch.save({"model": m.state_dict(), "opt": {}}, tmp_path / "ckpt.pt")
    out = tmp_path / "plain.pt"
    assert main(["export", str(tmp_path / "ckpt.pt"), "--build", f"{tmp_path}/build.py:build", "--out", str(out)]) == 0
    assert "exported state_dict" in capsys.readouterr().out
    fresh = GPT(128)
    fresh.load_state_dict(torch.load(out))
    import importlib.util

    spec = importlib.util.spec_from_file_location("b", tmp_path / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mu = mod.build()
    mu.load_state_dict(torch.load(tmp_path / "ckpt.pt")["model"])
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert rel(fresh(x), mu(x)) <= RTOL
    # bad inputs: a clear message and exit 2, nothing written
    assert (
        main(
            [
                "export",
                str(tmp_path / "nope.pt"),
                "--build",
                f"{tmp_path}/build.py:build",
                "--out",
                str(tmp_path / "x.pt"),
            ]
        )
        == 2
    )
    assert "not found" in capsys.readouterr().err
    (tmp_path / "plainbuild.py").write_text("from mutransfer.recipes import GPT\ndef build():\n    return GPT(128)\n")
    assert (
        main(
            [
                "export",
                str(tmp_path / "ckpt.pt"),
                "--build",
                f"{tmp_path}/plainbuild.py:build",
                "--out",
                str(tmp_path / "x.pt"),
            ]
        )
        == 2
    )
    assert "not a model put in µP" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_models_are_folded_in_float32_and_keep_their_dtype(dtype):
    torch.manual_seed(0)
    m = mt.parametrize(
        GPT(128).to(dtype), base=GPT(32).to(dtype), delta=GPT(64).to(dtype), output_mult=3.0, attn_mult=1.3
    )
    plain = mt.export(m)
    assert {p.dtype for p in plain.parameters()} == {dtype}
    x = ZOO["nanogpt"].inputs()
    fresh = GPT(128).to(dtype)
    fresh.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert rel(run(fresh.eval(), x)[0].float(), run(m.eval(), x)[0].float()) <= 8 * torch.finfo(dtype).eps
