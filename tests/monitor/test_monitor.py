"""mt.Monitor on the recipes' GPT: a healthy µP run raises nothing; each single mistake raises an alarm
naming the right layer at the first sample; a proxy trajectory catches an lr not in effect."""

import math

import pytest
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.errors import ModelError, MonitorAlarm, UsageError
from mutransfer.recipes import GPT
from mutransfer.recipes.models import CausalSelfAttention

V, CTX = 256, 16
PLAIN = pytest.mark.filterwarnings("ignore:AdamW group 0 holds parameters of a µP model")


def _gpt(width: int) -> GPT:
    return GPT(width, vocab=V, n_layer=2, n_head=4, ctx=CTX, tied=False, init_std=None)


def build(width: int = 128) -> GPT:
    torch.manual_seed(0)
    model = _gpt(width)
    mt.parametrize(model, base=_gpt(32), delta=_gpt(64))
    return model


def train(model, opt, steps: int, every: int, sched=None, **kw) -> mt.Monitor:
    mon = mt.Monitor(model, opt, every=every, **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, V, (4, CTX + 1), generator=g)
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        mon.step(loss)
    return mon


def mup_adamw(model, lr=3e-3):
    return torch.optim.AdamW(mt.param_groups(model, lr=lr, optimizer="adamw", weight_decay=0.1))


def warmup_cosine(opt, steps: int):
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )


def test_healthy_run_with_warmup_cosine_and_weight_decay_raises_nothing():
    model = build(64)
    opt = mup_adamw(model)
    mon = train(model, opt, steps=120, every=20, sched=warmup_cosine(opt, 120))
    assert mon.alarms == []
    steps = mon.trajectory()["steps"]
    assert [r["step"] for r in steps] == [1, 20, 40, 60, 80, 100, 120]
    last = steps[-1]["layers"]
    # the measured lr of a hidden layer is the base lr in effect × 1/m (m = 2)
    assert last["blocks.0.fc"]["lr"] == pytest.approx(last["wte"]["lr"] / 2, rel=1e-6)
    assert 0 < last["blocks.0.fc"]["dw_spec"] < last["blocks.0.fc"]["w_spec"]
    assert last["(model output)"]["act_rms"] > 0 and last["blocks.1.attn"]["attn_logit_max"] > 0
    # zero cost on steps that are not sampled: no hook is left registered between samples
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks


@PLAIN
def test_adamw_over_model_parameters_alarms_on_hidden_and_readout_layers():
    model = build()
    mon = train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), steps=2, every=5)
    layers = {a.layer for a in mon.alarms if a.what == "lr"}
    assert {"blocks.0.fc", "blocks.1.attn.qkv", "lm_head"} <= layers
    assert "wte" not in layers and "blocks.0.ln1" not in layers  # their µP lr is the base lr
    a = next(a for a in mon.alarms if a.layer == "lm_head")
    assert a.step == 1 and a.measured == 1e-3 and a.expected == pytest.approx(1e-3 / 4)
    assert "mt.param_groups" in a.cause


def test_readout_lr_not_scaled_names_the_readout():
    model = build()
    groups = mt.param_groups(model, lr=1e-3, optimizer="adamw")
    for g in groups:
        if any(p is model.lm_head.weight for p in g["params"]):
            g["lr"] = 1e-3
    mon = train(model, torch.optim.AdamW(groups), steps=2, every=5)
    assert [(a.layer, a.what, a.step) for a in mon.alarms] == [("lm_head", "lr", 1)]
    assert mon.alarms[0].expected == pytest.approx(2.5e-4) and "readout lr not scaled" in mon.alarms[0].cause


def test_attention_left_at_inverse_sqrt_d_names_the_attention_module():
    model = build()
    old = model.blocks[1].attn
    new = CausalSelfAttention(128, 4)  # a fresh module after parametrize: SDPA's default 1/√d
    new.qkv, new.proj = old.qkv, old.proj
    model.blocks[1].attn = new
    mon = train(model, mup_adamw(model), steps=1, every=5)
    assert [(a.layer, a.what) for a in mon.alarms] == [("blocks.1.attn", "attention logit scale")]
    assert mon.alarms[0].measured == pytest.approx(32**-0.5) and mon.alarms[0].expected == pytest.approx(8**0.5 / 32)


class OneOverD(CausalSelfAttention):
    """Attention already in µP's form: q·kᵀ × 8^½/d (1/√8 at the base's head dim 8, ∝ 1/d beyond)."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        d = c // self.n_head
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=8**0.5 / d)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def test_attention_false_on_a_model_at_inverse_sqrt_d_alarms_without_a_proxy():
    """parametrize(attention=False) on a model whose attention really runs at 1/√d: the sampled forward shows
    the scale in effect, µP's is α·s₀·d₀/d from the base's measured attention."""
    model = mt.parametrize(_gpt(128), base=_gpt(32), delta=_gpt(64), attention=False)
    mon = train(model, mup_adamw(model), steps=2, every=5)
    alarms = [a for a in mon.alarms if a.what == "attention logit scale"]
    assert {a.layer for a in alarms} == {"blocks.0.attn", "blocks.1.attn"} and alarms[0].step == 1
    assert alarms[0].measured == pytest.approx(32**-0.5) and alarms[0].expected == pytest.approx(8**0.5 / 32)
    assert "attention=False" in alarms[0].cause

    # the same model written in µP's form from the start: attention=False is right, and nothing alarms
    def one_over_d(width):
        m = _gpt(width)
        for block in m.blocks:
            mine = OneOverD(width, 4)
            mine.qkv, mine.proj = block.attn.qkv, block.attn.proj
            block.attn = mine
        return m

    model = mt.parametrize(one_over_d(128), base=one_over_d(32), delta=one_over_d(64), attention=False)
    mon = train(model, mup_adamw(model), steps=2, every=5)
    assert not [a for a in mon.alarms if a.what == "attention logit scale"]


def test_layer_swapped_after_parametrize_names_the_layer():
    model = build()
    model.blocks[0].fc = torch.nn.Linear(128, 512)
    seen = []
    mon = train(model, mup_adamw(model), steps=1, every=5, on_alarm=seen.append)
    assert {a.layer for a in mon.alarms} == {"blocks.0.fc"} and seen == mon.alarms
    assert "swapped after mt.parametrize" in mon.alarms[0].cause


@PLAIN
def test_raise_on_alarm_stops_the_run():
    model = build()
    with pytest.raises(MonitorAlarm, match="lr not in effect") as info:
        train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), steps=1, every=5, raise_on_alarm=True)
    assert "lm_head" in {a.layer for a in info.value.alarms}


@PLAIN
def test_proxy_trajectory_catches_an_lr_not_in_effect_and_passes_the_right_target(tmp_path):
    proxy = build(64)
    path = train(proxy, mup_adamw(proxy), steps=10, every=5).save_trajectory(tmp_path / "proxy.json")
    good = build(128)
    assert train(good, mup_adamw(good), steps=10, every=5).compare(path) == []
    bad = build(128)  # plain AdamW at the base lr: hidden and readout updates 2× the proxy's scaled ones
    mon = train(bad, torch.optim.AdamW(bad.parameters(), lr=3e-3, weight_decay=0.1), steps=10, every=5, proxy=path)
    upd = {a.layer for a in mon.alarms if a.what in ("dw_rms", "dw_spec")}
    assert "blocks.0.fc" in upd and "wte" not in upd


def test_bad_input():
    with pytest.raises(ModelError, match="never parametrized"):
        mt.Monitor(_gpt(64), torch.optim.SGD(_gpt(64).parameters(), lr=0.1))
    model = build(64)
    with pytest.raises(UsageError, match="every"):
        mt.Monitor(model, mup_adamw(model), every=0)
    with pytest.raises(UsageError, match="log="):
        mt.Monitor(model, mup_adamw(model), log="nowhere")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        mt.Monitor(model, object())
    with pytest.raises(UsageError, match="not a monitor trajectory"):
        mt.Monitor(model, mup_adamw(model)).compare({"steps": []})


def test_history_keeps_the_last_samples():
    model = build(64)
    mon = train(model, mup_adamw(model), steps=12, every=3, history=2)
    assert [r["step"] for r in mon.trajectory()["steps"]] == [9, 12]


def test_proxy_band_for_attention_logits_reaches_down_by_the_head_dim_ratio_only():
    from mutransfer.monitor.predictions import proxy_findings

    proxy = {"lr_base": 1e-3, "layers": {"attn": {"attn_logit_rms": 0.4, "head_dim": 16.0}}}

    def found(rms):
        rec = {"lr_base": 1e-3, "layers": {"attn": {"attn_logit_rms": rms, "head_dim": 64.0}}}
        return proxy_findings(rec, proxy, {}, {}, "no_multipliers", 2.0)

    assert found(0.2) == [] and found(0.11) == []  # init: × √(16/64) = 0.2, band down to 0.1
    assert found(0.09) and found(0.81)[0][:2] == ("attn", "attn_logit_rms")  # below the band; growing logits


def test_trend_band_extrapolates_the_finite_width_gap_like_width_to_the_minus_half():
    from mutransfer.monitor.predictions import trend_band

    # 4 at ratio 1, 2 at ratio 2: log e = log e∞ + c·r^-½ through both, at ratio 4 → 1.2251
    low, high, at = trend_band(4.0, 2.0, 1.0, 2.0, 4.0)
    assert at == pytest.approx(1.2251, abs=1e-4) and (low, high) == (at, 4.0)
    assert trend_band(4.0, 2.0, 2.0, 2.0, 4.0) == (2.0, 4.0, 4.0)  # no width between them: no trend


def test_a_wider_proxy_widens_the_band_by_the_measured_trend_only():
    from mutransfer.monitor.predictions import proxy_findings

    def rec(r, act):
        return {"lr_base": 1e-3, "layers": {"blocks.0.fc": {"act_rms": act}}}, {
            "blocks.0.fc": {"param": "blocks.0.fc.weight", "role": "hidden", "m_in": r, "m_out": r}
        }

    (p, pl), (w, wl) = rec(1.0, 8.0), rec(2.0, 4.0)

    def found(act, wider=True):
        t, tl = rec(4.0, act)
        return proxy_findings(t, p, tl, pl, "no_multipliers", 2.0, (w, wl) if wider else None)

    # the trend 8 → 4 extrapolates to 2.45 at ratio 4: band [2.45/2, 8·2]
    assert found(2.2) == [] and found(2.2, wider=False)  # inside the trend's band, below the proxy's alone
    ((layer, what, measured, expected, _),) = found(1.0)
    assert (layer, what, measured) == ("blocks.0.fc", "act_rms", 1.0) and expected == pytest.approx(2.4503, abs=1e-3)
