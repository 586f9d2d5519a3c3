"""µP on a meta-built target: parametrize from shapes, init laws read off the base, `mt.init_weights`, `mt.check`.

Multi-process (DTensor) checks live in test_sharded.py; these are the one-process ones.
"""

import math

import pytest
import torch
from torch import nn

import mutransfer as mt
from mutransfer._core.init_law import draw, read_law
from mutransfer.errors import ExportError, ModelError
from mutransfer.recipes import GPT, MLP, Llama, ResMLP


def rms(t):
    return float(t.detach().double().pow(2).mean().sqrt())


def meta_and_eager(make, base_w, width, seed=0, **kw):
    torch.manual_seed(1)
    base = make(base_w)
    with torch.device("meta"):
        delta = make(2 * base_w)
        target = make(width)
    mt.parametrize(target, base=base, delta=delta, **kw)
    torch.manual_seed(seed)
    eager = mt.parametrize(make(width), base=base, delta=delta, **kw)
    return target, eager


# ------------------------------------------------------------------------------------------ laws


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize(
    "make, kind",
    [
        # values made inside the test from their own generator: drawn at collection time from the global
        # RNG they depended on the tests run before (a 1 % KS rejection in one order)
        (lambda: torch.randn(128, 64, generator=_gen()) * 0.02, "normal"),
        (lambda: nn.init.kaiming_uniform_(torch.empty(128, 64), a=math.sqrt(5), generator=_gen()), "uniform"),
        (
            lambda: nn.init.trunc_normal_(torch.empty(128, 64), std=0.02, a=-0.04, b=0.04, generator=_gen()),
            "trunc_normal",
        ),
        (lambda: nn.init.trunc_normal_(torch.empty(128, 64), std=0.02, generator=_gen()), "normal"),  # timm's: ±2 ≫ σ
        (lambda: torch.ones(64), "constant"),
        (lambda: torch.zeros(64, 8), "zeros"),
        (lambda: nn.init.sparse_(torch.empty(128, 64), 0.5, generator=_gen()), "empirical"),
    ],
    ids=["normal", "kaiming_uniform", "trunc_2sigma", "timm_trunc", "ones", "zeros", "sparse"],
)
def test_the_law_family_is_read_off_the_values(make, kind):
    values = make()
    torch.manual_seed(0)
    law = read_law(values, [True] * values.ndim)
    assert law.kind == kind, law
    out = torch.empty(4 * values.shape[0], *values.shape[1:])
    draw(law, out, out.shape, [torch.arange(s) for s in out.shape], seed=3, name="w")
    assert rms(out) == pytest.approx(law.rms, rel=0.05)
    if kind in ("uniform", "trunc_normal"):
        assert out.abs().max() <= values.abs().max() * 1.01  # bounded like the base


def test_computed_values_are_tiled_or_refused_not_redrawn():
    decay = torch.log(torch.arange(1, 17.0)).repeat(64, 1)  # a per-channel log-decay (Mamba's A_log)
    law = read_law(decay, [True, False])
    assert law.kind == "tiled"
    out = torch.empty(256, 16)
    draw(law, out, out.shape, [torch.arange(256), torch.arange(16)], seed=0, name="a")
    assert torch.equal(out, torch.log(torch.arange(1, 17.0)).repeat(256, 1))
    ramp = torch.arange(64.0)[:, None] * torch.ones(1, 8) / 64  # varies along the dim that grows
    assert read_law(ramp, [True, False]).kind == "unknown"


@pytest.mark.parametrize("shape", [(300, 70), (5000,), (3, 40, 600)])
def test_draws_depend_on_position_not_on_the_sharding(shape):
    law = read_law(torch.randn(64, 64), [True, True])

    def drawn(index, seed=5, name="p"):
        out = torch.empty([len(i) for i in index])
        draw(law, out, shape, index, seed, name)
        return out

    full = drawn([torch.arange(s) for s in shape])
    assert abs(float(full.mean())) < 0.05 and float(full.std()) == pytest.approx(law.std, rel=0.05)
    pieces = [torch.arange(s)[s // 3 : s // 3 + s // 2] for s in shape]  # a block-crossing piece of every dim
    strided = [torch.arange(s)[1::3] for s in shape]  # FSDP2-over-TP shards are strided
    for index in (pieces, strided):
        expect = full
        for d, i in enumerate(index):
            expect = expect.index_select(d, i)
        assert torch.equal(drawn(index), expect)
    assert not torch.equal(full, drawn([torch.arange(s) for s in shape], seed=6))
    assert not torch.equal(full, drawn([torch.arange(s) for s in shape], name="q"))


# ------------------------------------------------------------------------------------------ meta


def test_meta_target_gets_the_eager_roles_groups_and_attention_and_keeps_no_values():
    target, eager = meta_and_eager(Llama, 32, 256)
    assert all(p.is_meta for p in target.parameters())
    groups = lambda m: [(g["lr"], g.get("eps"), len(g["params"])) for g in mt.param_groups(m, 1e-2, "adamw")]  # noqa: E731
    assert groups(target) == groups(eager)
    s_meta, s_eager = target._mutransfer_spec, eager._mutransfer_spec
    assert {n: i.role for n, i in s_meta.params.items()} == {n: i.role for n, i in s_eager.params.items()}
    assert [(a.module, a.scale) for a in s_meta.attention] == [(a.module, a.scale) for a in s_eager.attention]
    text = mt.describe(target)
    assert "init NOT drawn yet" in text and "init×" not in text and "N(0, " in text


def test_a_meta_base_for_a_meta_target_is_refused_naming_base():
    with torch.device("meta"):
        base, target = Llama(32), Llama(128)
    with pytest.raises(ModelError, match="and so is `base`"):
        mt.parametrize(target, base=base)


@pytest.mark.parametrize(
    "make, base_w, width, kw",
    [
        (Llama, 32, 256, {}),
        (lambda w: MLP(w, d_in=16), 64, 512, {}),  # PyTorch's default (uniform) init
        (GPT, 32, 128, {"zero_init_query": True, "zero_init_readout": False}),
        (lambda w: ResMLP(w, depth=8), 32, 128, {"base_depth": 2}),  # depth: branch ends × (L/L₀)^-α
    ],
    ids=["llama", "mlp_uniform", "gpt_zero_query", "resmlp_depth"],
)
def test_init_weights_draws_the_eager_law_of_every_tensor(make, base_w, width, kw):
    target, eager = meta_and_eager(make, base_w, width, **kw)
    target.to_empty(device="cpu")
    if isinstance(target, GPT):
        with pytest.raises(ModelError, match="'lm_head.weight' is no longer the same tensor as 'wte.weight'"):
            mt.init_weights(target, seed=11)
        target.lm_head.weight = target.wte.weight  # to_empty untied them
    mt.init_weights(target, seed=11)
    eager_params = dict(eager.named_parameters())
    for name, p in target.named_parameters():
        q = eager_params[name]
        if rms(q) == 0:
            assert rms(p) == 0, name
            continue
        tol = max(0.1, 6 / math.sqrt(p.numel()))
        assert abs(math.log(rms(p) / rms(q))) < tol, (name, rms(p), rms(q))
    assert mt.check(target).passed and mt.check(eager).passed


def test_zero_init_query_rows_stay_zero_after_init_weights():
    target, _ = meta_and_eager(GPT, 32, 128, zero_init_query=True)
    target.to_empty(device="cpu")
    target.lm_head.weight = target.wte.weight
    mt.init_weights(target, seed=0)
    qkv = target.blocks[0].attn.qkv.weight
    assert rms(qkv[:128]) == 0 and rms(qkv[128:]) > 0
    assert rms(target.blocks[0].attn.qkv.bias[:128]) == 0


def test_same_seed_same_values_and_the_model_trains():
    a, _ = meta_and_eager(Llama, 32, 128)
    b, _ = meta_and_eager(Llama, 32, 128)
    for m in (a, b):
        m.to_empty(device="cpu")
        mt.init_weights(m, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    mt.init_weights(b, seed=5)
    assert not torch.equal(a.output.weight, b.output.weight)
    assert "init drawn by mt.init_weights (seed 5)" in mt.describe(b)
    opt = torch.optim.AdamW(mt.param_groups(a, lr=1e-2, optimizer="adamw"))
    x = torch.randint(0, 256, (4, 17))
    losses = []
    for _ in range(5):
        logits = a(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.1


def test_init_weights_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(ModelError, match="never parametrized"):
        mt.init_weights(Llama(64))
    with torch.device("meta"):
        target = Llama(128)
    mt.parametrize(target, base=Llama(32))
    with pytest.raises(ModelError, match="still on the meta device"):
        mt.init_weights(target)
    with pytest.raises(ExportError, match="still on the meta device"):
        mt.export(target)
    target.to_empty(device="cpu")
    with pytest.raises(ModelError, match="skip='nope'"):
        mt.init_weights(target, skip="nope")
    mt.save_shapes(Llama(32), Llama(64), tmp_path / "shapes.json")
    shapes_only = mt.parametrize(Llama(128), base_shapes=tmp_path / "shapes.json")
    with pytest.raises(ModelError, match="no init law is known"):
        mt.init_weights(shapes_only)
    with pytest.raises(TypeError, match="seed"):
        mt.init_weights(target, seed=-1)


class Decay(nn.Module):
    """A model with a computed per-channel parameter that varies along width (no law to draw)."""

    def __init__(self, width):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.ramp = nn.Parameter(torch.linspace(0, 1, width))
        self.out = nn.Linear(width, 2)

    def forward(self, x):
        return self.out(self.inp(x) * self.ramp)


def test_a_parameter_with_no_law_is_named_and_can_be_skipped():
    torch.manual_seed(0)
    with torch.device("meta"):
        target = Decay(256)
    mt.parametrize(target, base=Decay(32), delta=Decay(64))
    target.to_empty(device="cpu")
    with pytest.raises(ModelError, match=r"'ramp' from: computed values .* skip=\['ramp'\]"):
        mt.init_weights(target)
    mt.init_weights(target, skip=["ramp"])
    with torch.no_grad():
        target.ramp.copy_(torch.linspace(0, 1, 256))  # the model's own code
    assert mt.check(target).passed


# ------------------------------------------------------------------------------------------ the safety net


def test_check_names_the_parameter_reinitialised_by_the_models_own_init():
    torch.manual_seed(0)
    model = mt.parametrize(Llama(256), base=Llama(32), delta=Llama(64))
    assert mt.check(model).passed
    model.init_weights()  # the model's own (SP) init, as torchtitan calls after to_empty
    report = mt.check(model)
    assert not report.passed
    found = {f.parameter: f for f in report.findings}
    assert "output.weight" in found and "layers.0.attention.wq.weight" in found
    assert "tok_embeddings.weight" not in found  # the input layer's law does not change with width
    f = found["output.weight"]
    assert f.measured == pytest.approx(0.02, rel=0.05) and f.expected == pytest.approx(0.02 / 8, rel=0.05)
    assert "output.weight: init rms 0.02" in str(report) and "mt.init_weights" in str(report)


def test_check_catches_a_meta_build_never_given_its_init():
    with torch.device("meta"):
        target = Llama(128)
    mt.parametrize(target, base=Llama(32))
    target.to_empty(device="cpu")
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()  # what to_empty's memory may hold
    assert not mt.check(target).passed


def test_monitor_alarms_at_the_first_sample_on_a_reinitialised_model():
    torch.manual_seed(0)
    model = mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64))
    model.apply(lambda m: GPT._init(m, 0.02))  # nanoGPT's own init, after parametrize
    opt = torch.optim.AdamW(mt.param_groups(model, lr=1e-3, optimizer="adamw"))
    monitor = mt.Monitor(model, opt, every=10)
    x = torch.randint(0, 256, (2, 16))
    loss = model(x).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    alarms = monitor.step(loss)
    init = [a for a in alarms if a.what.startswith("init rms")]
    assert init and init[0].step == 1
    assert any(a.layer == "blocks.0.attn.qkv" and a.what == "init rms of weight" for a in init)
    assert "mt.init_weights" in init[0].cause
    # a healthy model raises none; a monitor started after training began does not check the init
    healthy = mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64))
    opt2 = torch.optim.AdamW(mt.param_groups(healthy, lr=1e-3, optimizer="adamw"))
    mon2 = mt.Monitor(healthy, opt2, every=10)
    healthy(x).logsumexp(-1).mean().backward()
    opt2.step()
    assert not [a for a in mon2.step() if a.what.startswith("init rms")]
    assert not mt.Monitor(model, opt)._init_found


def test_check_catches_hugging_face_init_after_parametrize():
    transformers = pytest.importorskip("transformers")

    def make(w):
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            hidden_size=w,
            intermediate_size=2 * w,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            tie_word_embeddings=False,
        )
        return transformers.LlamaForCausalLM(cfg)

    model = mt.parametrize(make(256), base=make(32), delta=make(64))
    assert mt.check(model).passed
    model.apply(model._init_weights)  # what post_init / from_pretrained's missing-weights init run
    bad = {f.parameter for f in mt.check(model).findings}
    assert "lm_head.weight" in bad and "model.layers.0.mlp.down_proj.weight" in bad


class RelBias(nn.Module):
    """A finite-shape parameter whose own init shrinks with width (as T5's relative attention bias)."""

    def __init__(self, width):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.bias_table = nn.Parameter(torch.randn(32, 4) * width**-0.5)
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        return self.out(torch.relu(self.inp(x)))[:, :4] + self.bias_table[:1]


def test_a_finite_shape_parameter_whose_init_follows_width_keeps_the_bases_scale():
    torch.manual_seed(0)
    base = RelBias(32)
    model = mt.parametrize(RelBias(512), base=base, delta=RelBias(64))
    assert rms(model.bias_table) == pytest.approx(rms(base.bias_table), rel=0.25)  # not 4× smaller
    assert model._mutransfer_spec.init_scales["bias_table"] == pytest.approx(4.0, rel=0.25)
    assert mt.check(model).passed
    torch.manual_seed(1)
    same = RelBias(32)
    before = same.bias_table.detach().clone()
    mt.parametrize(same, base=base, delta=RelBias(64))  # at base width: the user's model exactly
    assert torch.equal(same.bias_table, before)


def test_computed_tables_and_small_bases_are_not_redrawn_as_noise():
    pos, i = torch.arange(16.0)[:, None], torch.arange(32.0)[None]
    sincos = torch.cat([torch.sin(pos / 10000 ** (i / 32)), torch.cos(pos / 10000 ** (i / 32))], 1)  # MAE's table
    law = read_law(sincos, [False, True])
    assert law.kind == "unknown" and "correlated" in law.reason
    torch.manual_seed(0)
    small = torch.rand(16) * 0.1 + 1e-3  # a small base's bounded init (Mamba-2's dt over 8 heads, say)
    law = read_law(small, [True])
    out = torch.empty(4096)
    draw(law, out, out.shape, [torch.arange(4096)], seed=0, name="dt")
    assert law.kind == "empirical" and small.min() <= out.min() and out.max() <= small.max()


def test_a_kept_finite_shape_constant_is_checked_against_its_own_value():
    class Temp(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.inp, self.out = nn.Linear(8, width), nn.Linear(width, 4)
            self.temp = nn.Parameter(torch.full((4,), width**-0.5))  # a constant the model's code sets per width

        def forward(self, x):
            return self.out(torch.relu(self.inp(x))) * self.temp

    model = mt.parametrize(Temp(512), base=Temp(32), delta=Temp(64))
    assert "temp" in model._mutransfer_spec.kept_values and mt.check(model).passed


def test_a_monitor_started_after_plain_sgd_steps_does_not_check_the_init():
    torch.manual_seed(0)
    model = mt.parametrize(MLP(128, d_in=16), base=MLP(32, d_in=16), delta=MLP(64, d_in=16))
    opt = torch.optim.SGD(mt.param_groups(model, lr=0.5, optimizer="sgd"))  # no momentum: no optimizer state
    x, y = torch.randn(64, 16), torch.randint(0, 10, (64,))
    for _ in range(20):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert not opt.state
    assert not mt.Monitor(model, opt)._init_found  # gradients show the run has started
    assert mt.Monitor(model, opt, check_init=True)._init_found  # asked: the trained values are off the init
