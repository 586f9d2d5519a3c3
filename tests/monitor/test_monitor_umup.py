"""mt.Monitor on u-µP (issue 50): its expectations come from the model's parametrization — update sizes
scaled by rules.UMUP at the absolute fans, unit activations at init — so a healthy u-µP run raises
nothing, at its own width or against a narrower u-µP proxy, and a broken one is named."""

import pytest
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer import rules
from mutransfer._core.spec import find_spec
from mutransfer.errors import UsageError
from mutransfer.monitor.monitor import load_trajectory
from mutransfer.recipes import GPT

V, CTX = 256, 16
pytestmark = pytest.mark.filterwarnings("ignore::mutransfer.errors.MuPWarning")


def _gpt(width: int) -> GPT:
    return GPT(width, vocab=V, n_layer=2, n_head=4, ctx=CTX, tied=False, init_std=None)


def build(width: int, parametrization: str = "u-mup") -> GPT:
    torch.manual_seed(0)
    model = _gpt(width)
    mt.parametrize(model, base=_gpt(32), delta=_gpt(64), parametrization=parametrization)
    return model


def adamw(model, lr=1e-2):
    return torch.optim.AdamW(mt.param_groups(model, lr=lr, optimizer="adamw", weight_decay=0.1))


def train(model, opt, steps=20, every=5, scale=None, **kw) -> mt.Monitor:
    if scale is not None:  # a weight changed after parametrize (the optimizer already holds it)
        with torch.no_grad():
            dict(model.named_parameters())[scale[0]].mul_(scale[1])
    mon = mt.Monitor(model, opt, every=every, **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, V, (4, CTX + 1), generator=g)
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss)
    return mon


def test_a_healthy_umup_run_raises_nothing_and_its_trajectory_carries_the_umup_rules():
    model = build(64)
    mon = train(model, adamw(model))
    assert mon.alarms == []
    traj = mon.trajectory()
    assert traj["parametrization"] == "u-mup"
    fc = traj["layers"]["blocks.0.fc"]
    assert (fc["row"], fc["fan_in"], fc["fan_out"]) == ("hidden", 64, 256)
    # u-µP's hidden Adam lr factor at the absolute fan_in 64 (rules.UMUP), × Depth-µP's L^-½ of its 2 blocks
    assert fc["factors"]["adam_lr"] == pytest.approx(rules.factor(rules.UMUP["hidden"].adam_lr, 64, 256) * 2**-0.5)
    assert fc["factors"]["adam_lr"] == pytest.approx(1 / 8 * 2**-0.5)
    # at init every unit-scaled layer's output is at most its installed output constant (qkv, fc: 1)
    first = traj["steps"][0]["layers"]
    assert 0.8 < first["blocks.0.fc"]["act_rms"] < 1.2 and 0.8 < first["blocks.0.attn.qkv"]["act_rms"] < 1.2


def test_zero_biases_raise_nothing_either():
    """The recipes' GPT at nanoGPT's init (zero biases, every matmul's 1/√fan_in on its output): before, the
    monitor counted that factor on top of unit scale — 10 false alarms (attention logit scale 1/1024 for the
    installed 1/16; qkv act_rms 1 for 1/8)."""
    torch.manual_seed(0)

    def gpt(w: int) -> GPT:
        return GPT(w, vocab=V, n_layer=2, n_head=4, ctx=CTX, tied=False, init_std=0.02)

    model = mt.parametrize(gpt(64), base=gpt(32), delta=gpt(64), parametrization="u-mup")
    mon = train(model, adamw(model))
    assert mon.alarms == []


def test_a_umup_target_4x_wider_than_its_proxy_passes_and_plain_adamw_does_not(tmp_path):
    """u-µP's hidden Adam lr is fan_in^-½: ×½ from width 64 to 256 where µP's Table 3 says ×¼ — with µP's
    exponents every hidden layer of this healthy target raised an update alarm (measured: 13 alarms)."""
    proxy = build(64)
    path = train(proxy, adamw(proxy)).save_trajectory(tmp_path / "proxy.json")
    good = build(256)
    mon = train(good, adamw(good), proxy=path)
    assert mon.alarms == []
    # the updates did shrink with width, by u-µP's factor: ½ for a hidden layer (weight decay excluded)
    p_fc = [r["layers"]["blocks.0.fc"]["dw_rms"] for r in load_trajectory(path)["steps"]]
    t_fc = [r["layers"]["blocks.0.fc"]["dw_rms"] for r in mon.trajectory()["steps"]]
    assert t_fc[-1] / p_fc[-1] == pytest.approx(0.5, rel=0.25)
    bad = build(256)  # one lr for every parameter: hidden updates far above u-µP's
    mon = train(bad, torch.optim.AdamW(bad.parameters(), lr=1e-2, weight_decay=0.1), proxy=path)
    updates = {a.layer for a in mon.alarms if a.what in ("dw_rms", "dw_spec")}
    assert {"blocks.0.fc", "blocks.1.attn.qkv"} <= updates


def test_a_weight_scaled_after_parametrize_is_named_by_its_unit_scale_at_init():
    model = build(64)
    mon = train(model, adamw(model), scale=("blocks.0.fc.weight", 8.0), check_init=False)  # the init check off
    unit = [a for a in mon.alarms if a.what == "act_rms at init"]
    # the layer itself first, at ×8; what reads its output downstream in the same branch (fc_out, through the
    # GELU) grows too; the next block reads the stream through a norm and is unit again
    assert unit[0].layer == "blocks.0.fc" and {a.layer for a in unit} <= {"blocks.0.fc", "blocks.0.fc_out"}
    assert unit[0].step == 1 and unit[0].measured == pytest.approx(8.0, rel=0.2) and unit[0].expected == 1.0
    assert "u-µP" in unit[0].cause
    model = build(64)  # with the init check on (the default), both name it
    mon = train(model, adamw(model), scale=("blocks.0.fc.weight", 8.0))
    assert {(a.layer, a.what) for a in mon.alarms} >= {
        ("blocks.0.fc", "act_rms at init"),
        ("blocks.0.fc", "init rms of weight"),
    }


def test_a_mup_proxy_is_refused_for_a_umup_model(tmp_path):
    proxy = build(64, "mup")
    path = train(proxy, adamw(proxy, 3e-3), steps=5).save_trajectory(tmp_path / "mup.json")
    model = build(64)
    with pytest.raises(UsageError, match="parametrization 'mup'.*'u-mup'"):
        mt.Monitor(model, adamw(model), proxy=path)


def test_a_hugging_face_llama_raises_nothing():
    """HF's attention carries q and k to SDPA its own way (rotary, repeat_kv): the recorder saw one of the two
    scaled-matmul factors, and the monitor, expecting both, raised 'attention logit scale' on every layer. It
    now compares with what the recorder measured right after parametrize (`MuSpec.attention_effective`)."""
    transformers = pytest.importorskip("transformers")

    class Wrap(torch.nn.Module):
        def __init__(self, w: int):
            super().__init__()
            cfg = transformers.LlamaConfig(
                vocab_size=V,
                hidden_size=w,
                intermediate_size=2 * w,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
            )
            cfg._attn_implementation = "sdpa"
            self.m = transformers.LlamaForCausalLM(cfg)

        def forward(self, idx):
            return self.m(input_ids=idx).logits

    torch.manual_seed(0)
    x = torch.randint(0, V, (2, CTX))
    model = mt.parametrize(Wrap(128), base=Wrap(32), delta=Wrap(64), parametrization="u-mup", example_inputs=x)
    spec = find_spec(model)
    assert set(spec.attention_effective) == {f"m.model.layers.{i}.self_attn" for i in range(2)}
    mon = train(model, adamw(model), steps=8, every=4)
    assert [a for a in mon.alarms if a.what == "attention logit scale"] == []
