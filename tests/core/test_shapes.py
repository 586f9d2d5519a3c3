import json

import pytest
import torch

import mutransfer as mt
from mutransfer.recipes import GPT, MLP
from mutransfer._core.shapes import WidthShapes, canonical_name


def test_width_dims_found_from_base_and_delta():
    shapes = WidthShapes.from_models(MLP(64, d_in=32, d_out=10), MLP(128, d_in=32, d_out=10))
    assert shapes.params["input.weight"].width == (True, False)
    assert shapes.params["input.weight"].base == (64, 32)
    assert shapes.params["hidden.0.weight"].width == (True, True)
    assert shapes.params["readout.weight"].width == (False, True)
    assert shapes.params["readout.bias"].width == (False,)
    assert shapes.params["hidden.0.weight"].multipliers((512, 256)) == (8.0, 4.0)


def test_meta_device_models_give_the_same_shapes():
    with torch.device("meta"):
        base, delta = GPT(64), GPT(128)
    meta = WidthShapes.from_models(base, delta)
    real = WidthShapes.from_models(GPT(64), GPT(128))
    assert meta.params == real.params
    assert meta.attention_head_dims == {"blocks.0.attn": 16, "blocks.1.attn": 16}


def test_independent_width_dims_get_their_own_multipliers():
    # d_ffn (the 4·d factor) grows by 4 while d_model grows by 2
    class FF(torch.nn.Module):
        def __init__(self, d, f):
            super().__init__()
            self.up = torch.nn.Linear(d, f)
            self.down = torch.nn.Linear(f, d)

    shapes = WidthShapes.from_models(FF(32, 64), FF(64, 256))
    target = FF(64, 256)
    mt.parametrize(target, base=FF(32, 64), delta=FF(64, 256))
    info = target._mutransfer_spec.params
    assert (info["up.weight"].m_in, info["up.weight"].m_out) == (2.0, 4.0)
    assert (info["down.weight"].m_in, info["down.weight"].m_out) == (4.0, 2.0)
    assert shapes.params["up.bias"].width == (True,)


def test_without_delta_dims_that_differ_from_target_count():
    target = MLP(256)
    mt.parametrize(target, base=MLP(64))
    assert target._mutransfer_spec.params["hidden.0.weight"].m_in == 4.0


def test_json_round_trip(tmp_json):
    saved = mt.save_shapes(GPT(64), GPT(128), tmp_json)
    data = json.loads(tmp_json.read_text())
    assert data["format"] == "mutransfer.width_shapes"
    assert data["params"]["blocks.0.fc.weight"] == {"base": [256, 64], "width": [True, True]}
    loaded = mt.load_shapes(tmp_json)
    assert loaded.params == saved.params
    assert loaded.attention_head_dims == saved.attention_head_dims


def test_parametrize_from_json_matches_parametrize_from_meta_base(tmp_json):
    with torch.device("meta"):
        mt.save_shapes(MLP(64), MLP(128), tmp_json)
        meta_base, meta_delta = MLP(64), MLP(128)
    torch.manual_seed(0)
    a = mt.parametrize(MLP(512), base_shapes=str(tmp_json))
    torch.manual_seed(0)
    b = mt.parametrize(MLP(512), base=meta_base, delta=meta_delta)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    assert [g["lr"] for g in mt.param_groups(a, 1e-3)] == [g["lr"] for g in mt.param_groups(b, 1e-3)]


def test_canonical_name_strips_wrappers():
    assert canonical_name("_orig_mod.blocks.0.fc.weight") == "blocks.0.fc.weight"
    assert canonical_name("module._fsdp_wrapped_module.fc.weight") == "fc.weight"


def test_bad_json_is_a_value_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        mt.load_shapes(bad)
    with pytest.raises(ValueError, match="does not exist"):
        mt.load_shapes(tmp_path / "missing.json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a mutransfer width-shapes file"):
        mt.load_shapes(other)
