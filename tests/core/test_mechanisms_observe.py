"""Issue 29, mechanisms 1, 2 and 9: what the probe forward observes (models in tests/mechanisms_observe.py).

Each "before" was observed on main before the fix (2-core CPU, widths 32 → 256, Adam lr 1e-2, 2 seeds):
- embedding × √hidden (float in the parent / buffer in the embedding): the block output (float) or the
  embedding output (buffer) grew with slope +0.49 under µP, and the check failed;
- q × scaling then SDPA(scale=1): the logits were recorded at slope −1.54 at init (true: −0.54), so
  attention left at 1/√d passed the check;
- ALiBi inside baddbmm: the recorded logits held the bias (slope −0.03 at init), correct µP failed;
- an inline ``/ math.sqrt(head_dim)``: parametrize raised, asking to edit the forward.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import mutransfer as mt
from mechanisms_observe import MECHANISMS, OTHERS, batch, gemma
from mutransfer._core.shapes import WidthShapes
from mutransfer.coord.measure import ActivationMeter, mean_abs
from mutransfer.errors import ModelError, MuPWarning

ALL = {**MECHANISMS, **OTHERS}
DATA = [batch(0), batch(1)]


def _mup(name: str, width: int, seed: int = 0, **kwargs):
    make = ALL[name]
    model = make(width, seed)
    mt.parametrize(model, base=make(32), delta=make(64), **kwargs)
    return model


def _check(name: str, **kwargs):
    return mt.coord_check(
        lambda w, seed=0: _mup(name, w, seed, **kwargs),
        widths=[32, 256],
        data=DATA,
        optimizer="adam",
        lr=1e-2,
        steps=2,
        seeds=2,
        progress=False,
    )


def _block_size(model) -> float:
    out = {}

    def hook(module, args, output):
        out["h"] = mean_abs(output)

    handle = model.block.register_forward_hook(hook)
    with torch.no_grad():
        model(DATA[0][0])
    handle.remove()
    return out["h"]


@pytest.mark.parametrize("name", ["embed_sqrt_float", "embed_sqrt_buffer", "embed_sqrt_plus_position"])
def test_width_dependent_embedding_constant_is_compensated(name):
    model = _mup(name, 128)
    spec = model._mutransfer_spec
    kind, c = spec.forward_constants["embed"]
    assert kind == "output ×" and c == pytest.approx(0.5)  # √(32/128): back to √hidden at base width
    assert "pos" not in spec.forward_constants
    # the constant is after the module in the parent's code (float) or inside its forward (buffer)
    assert ("embed" in spec.compensated) == (name != "embed_sqrt_buffer")
    # the residual stream no longer grows like √width (it did ×2.0 from 32 to 128 before)
    assert _block_size(_mup(name, 256)) / _block_size(_mup(name, 32)) == pytest.approx(1.0, abs=0.1)
    assert "embed output ×0.5" in mt.describe(model)


@pytest.mark.slow
def test_hugging_face_gemma_embedding_scale_is_compensated():
    """On main: embed_tokens and both layers grew with slope +0.50 under µP (32 → 256), and the check failed."""
    pytest.importorskip("transformers")

    def make(width, seed=0):
        model = gemma(width, seed)
        mt.parametrize(model, base=gemma(32), delta=gemma(64))
        return model

    ids = batch(0)[0]
    result = mt.coord_check(
        make, widths=[32, 256], data=[({"input_ids": ids, "labels": ids}, ids)], steps=2, seeds=2, progress=False
    )
    assert result.passed, [str(t) for t in result.failures]
    model = make(128)
    assert model._mutransfer_spec.forward_constants["model.embed_tokens"][1] == pytest.approx(0.5)
    with torch.no_grad():
        assert torch.equal(mt.export(model, untie=True)(ids).logits, model(ids).logits)


def test_constant_after_the_readout_is_compensated():
    model = _mup("logits_inv_sqrt", 128)
    assert model._mutransfer_spec.forward_constants == {"lm_head": ("output ×", pytest.approx(2.0))}
    assert _check("logits_inv_sqrt").passed


def test_meta_base_with_a_buffer_constant_is_not_guessed():
    make = ALL["embed_sqrt_buffer"]
    with torch.device("meta"):
        base, delta = make(32), make(64)
    with pytest.warns(MuPWarning, match="meta-device base holding constants in buffers"):
        mt.parametrize(make(128), base=base, delta=delta)


def test_width_independent_constant_is_left_alone():
    spec = _mup("embed_fixed_constant", 128)._mutransfer_spec
    assert spec.forward_constants == {}


def test_constant_on_a_raw_parameter_lookup_is_reported():
    with pytest.warns(MuPWarning, match="does not come from any module's output") as record:
        _mup("raw_table_sqrt", 128)
    assert "'block'" in str(record[0].message)


def test_base_shapes_carry_the_base_constants_and_old_files_warn():
    make = ALL["embed_sqrt_float"]
    shapes = WidthShapes.from_models(make(32), make(64))
    assert shapes.output_scales == {"embed": pytest.approx(32**0.5)}
    data = shapes.to_dict()
    assert WidthShapes.from_dict(data).output_scales == shapes.output_scales
    model = make(128)
    mt.parametrize(model, base_shapes=data)
    assert model._mutransfer_spec.forward_constants["embed"][1] == pytest.approx(0.5)
    del data["output_scales"]  # a file saved before the constants were measured
    with pytest.warns(MuPWarning, match="constants were not measured"):
        mt.parametrize(make(128), base_shapes=data)


def _recorded_logits_and_qk(name: str):
    """The attention logits the check records on model `name` (width 64), and that block's q, k
    (each head's projection, before any constant the forward multiplies onto it)."""
    torch.manual_seed(0)
    model = ALL[name](64)
    attn = model.block.attn
    seen = {}
    attn.register_forward_pre_hook(lambda m, a: seen.setdefault("x", model.block.ln1(a[0])))
    logits = ActivationMeter(model).measure(DATA[0][0])["block.attn [attn logits]"]
    with torch.no_grad():
        x = seen["x"]
        q, k = attn.heads(attn.q_proj(x)), attn.heads(attn.k_proj(x))
    return attn, logits, q, k


def test_sdpa_logits_are_recorded_once():
    """q × scaling, then SDPA(scale=1): the logits the softmax sees are (q·s)·kᵀ, not (q·s)·kᵀ·s."""
    attn, logits, q, k = _recorded_logits_and_qk("prescaled_sdpa")
    expected = (q * attn.scaling @ k.transpose(-2, -1))[..., torch.ones(8, 8, dtype=torch.bool).tril()]
    assert mean_abs(logits) == pytest.approx(mean_abs(expected), rel=1e-5)


def test_alibi_bias_is_left_out_of_the_logits():
    attn, logits, q, k = _recorded_logits_and_qk("alibi_baddbmm")
    qk = (q @ k.transpose(-2, -1) * attn.inv_norm_factor)[..., torch.ones(8, 8, dtype=torch.bool).tril()]
    assert logits.numel() == qk.numel()  # masked entries dropped, as before
    assert mean_abs(logits) == pytest.approx(mean_abs(qk), rel=1e-5)


@pytest.mark.parametrize("name", ["prescaled_sdpa", "prescaled_matmul", "alibi_baddbmm"])
def test_check_sees_attention_left_at_inverse_sqrt_d(name):
    result = _check(name, attention=False)
    assert not result.passed
    assert "block.attn [attn logits]" in result.failing_modules()


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_correct_mup_passes(name):
    result = _check(name)
    assert result.passed, [str(t) for t in result.failures]


def test_inline_sqrt_is_corrected_on_the_query_projection():
    model = _mup("inline_sqrt", 128)
    (a,) = model._mutransfer_spec.attention
    assert a.how == "query output block.attn.q_proj"
    assert a.verified and a.scale == pytest.approx(a.target) and a.target == pytest.approx(4**0.5 / 32)
    assert model.block.attn.q_proj._mutransfer_output_mult == pytest.approx(0.5)
    assert "block.attn.q_proj's output (q) × 0.5" in mt.describe(model)
    ids = DATA[0][0]
    with torch.no_grad():
        assert torch.allclose(mt.export(model)(ids), model(ids), atol=1e-5)


def test_inline_sqrt_without_a_query_module_still_names_the_fix():
    with pytest.raises(ModelError, match="mt.attn_scale"):
        _mup("inline_sqrt_fused", 128)


def test_query_fold_is_undone_when_verification_fails(monkeypatch):
    from mutransfer._core import attention_plan

    def broken(model, inputs, on_attention=None):  # a probe that sees nothing after the change
        from mutransfer._core.observation import Observation

        return Observation()

    make = ALL["inline_sqrt"]
    model, base, delta = make(128), make(32), make(64)
    monkeypatch.setattr(attention_plan, "observe", broken)
    with warnings.catch_warnings(), pytest.raises(ModelError, match="The model is unchanged"):
        warnings.simplefilter("ignore")
        mt.parametrize(model, base=base, delta=delta)
    assert type(model.block.attn.q_proj) is torch.nn.Linear
    assert "_mutransfer_output_mult" not in model.block.attn.q_proj.__dict__
