"""µP attention: logits × α·√d₀/d through SDPA, nn.MultiheadAttention and the helper."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt
from mutransfer._core.attention import MuMultiheadAttention
from mutransfer.recipes import GPT


def _reference_attention(attn_module, x, scale):
    b, t, c = x.shape
    q, k, v = attn_module.qkv(x).split(c, dim=2)
    q, k, v = (z.view(b, t, attn_module.n_head, -1).transpose(1, 2) for z in (q, k, v))
    logits = (q @ k.transpose(-2, -1)) * scale
    logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = logits.softmax(-1) @ v
    return attn_module.proj(y.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("alpha", [1.0, 3.0])
def test_sdpa_modules_get_the_mup_scale(alpha):
    torch.manual_seed(0)
    m = mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64), attn_mult=alpha)
    attn = m.blocks[0].attn  # 4 heads: d = 32, d₀ = 8
    with torch.no_grad():
        attn.qkv.weight.mul_(50)  # logits of order 1, so that the scale shows in the output
    x = torch.randn(2, 10, 128)
    expected = _reference_attention(attn, x, alpha * math.sqrt(8) / 32)
    assert torch.allclose(attn(x), expected, atol=1e-5)
    wrong = _reference_attention(attn, x, 1 / math.sqrt(32))
    assert not torch.allclose(attn(x), wrong, atol=1e-3)


def test_sdpa_outside_mup_modules_is_unchanged():
    mt.parametrize(GPT(128), base=GPT(32), delta=GPT(64))  # installs the wrapper
    q, k, v = torch.randn(3, 2, 4, 5, 16).unbind(0)
    manual = ((q @ k.transpose(-2, -1)) / 4).softmax(-1) @ v
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v), manual, atol=1e-6)


def test_more_heads_at_fixed_head_dim_changes_nothing():
    torch.manual_seed(0)
    m = GPT(128, n_head=8)
    mt.parametrize(m, base=GPT(32, n_head=2), delta=GPT(64, n_head=4))
    # d = d₀ = 16: the modules are left alone, and the scale in effect (measured) is 1/√16
    assert [(a.module, a.how, a.scale) for a in m._mutransfer_spec.attention] == [
        ("blocks.0.attn", "unchanged", 0.25),
        ("blocks.1.attn", "unchanged", 0.25),
    ]
    assert type(m.blocks[0].attn).__name__ == "CausalSelfAttention"


class HandWritten(nn.Module):
    def __init__(self, width, n_head=2):
        super().__init__()
        self.n_head, self.head_dim = n_head, width // n_head
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in self.qkv(x).split(c, -1))
        w = (q @ k.transpose(-2, -1) * mt.attn_scale(self, self.head_dim)).softmax(-1)
        return (w @ v).transpose(1, 2).reshape(b, t, c)


def test_hand_written_attention_through_the_helper():
    plain = HandWritten(64)
    assert mt.attn_scale(plain, 32) == 1 / math.sqrt(32)
    m = mt.parametrize(HandWritten(64), base=HandWritten(16), delta=HandWritten(32), attn_mult=1.5)
    assert [(a.module, a.how, a.d0, a.d) for a in m._mutransfer_spec.attention] == [("", "helper", 8, 32)]
    assert m._mutransfer_spec.attention[0].scale == pytest.approx(1.5 * math.sqrt(8) / 32)  # measured
    assert mt.attn_scale(m, 32) == pytest.approx(1.5 * math.sqrt(8) / 32)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("add_bias_kv", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mu_multihead_attention_matches_torch_at_the_same_scale(batch_first, add_bias_kv, need_weights):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(32, 4, batch_first=batch_first, add_bias_kv=add_bias_kv)
    mu = copy.deepcopy(ref)
    mu.__class__ = MuMultiheadAttention
    mu._mutransfer_attn = (1.0, 8)  # d₀ = d = 8: µP's scale equals 1/√d
    x = torch.randn(3, 5, 32) if batch_first else torch.randn(5, 3, 32)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, -2:] = True
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    out_ref, w_ref = ref(x, x, x, key_padding_mask=kpm, attn_mask=causal, need_weights=need_weights)
    out_mu, w_mu = mu(x, x, x, key_padding_mask=kpm, attn_mask=causal, need_weights=need_weights)
    assert torch.allclose(out_ref, out_mu, atol=1e-6)
    if need_weights:
        assert torch.allclose(w_ref, w_mu, atol=1e-6)


def test_mha_in_a_mup_model_uses_one_over_d():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.attn = nn.MultiheadAttention(w, 2, batch_first=True, bias=False)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    m = mt.parametrize(Net(64), base=Net(16), delta=Net(32))
    x = torch.randn(2, 6, 64)
    w_q, w_k, w_v = m.attn.in_proj_weight.chunk(3)
    q, k, v = ((x @ w.T).view(2, 6, 2, 32).transpose(1, 2) for w in (w_q, w_k, w_v))
    y = ((q @ k.transpose(-2, -1)) * math.sqrt(8) / 32).softmax(-1) @ v
    expected = m.attn.out_proj(y.transpose(1, 2).reshape(2, 6, 64))
    assert torch.allclose(m(x), expected, atol=1e-5)
