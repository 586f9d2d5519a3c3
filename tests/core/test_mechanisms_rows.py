"""Issue 29, mechanism 5 (second half): fused projections whose output rows scale differently (model in
tests/mechanisms_rows.py).

Before (observed on main, 2-core CPU, ToyMamba2 widths 64 → 128 → 256, Adam lr 1e-2, 3 steps, 2 seeds):
the whole in_proj got the hidden role, so the B and C rows (d_state = 8 at every width) were initialised like
hidden rows (× 1/√m): the size of B at init had slope −0.04 and of C −0.02 (flat, where µP's readout-like
rows shrink like 1/√m: slope −½), and nothing in describe or a warning said so.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import mutransfer as mt
from mechanisms_rows import ConcatInput, ToyMamba2
from mutransfer._core.observe import observe_model
from mutransfer._core.shapes import WidthShapes
from mutransfer.errors import MuPWarning


def _mup(width: int, seed: int = 0, **kwargs) -> ToyMamba2:
    torch.manual_seed(seed)
    model = ToyMamba2(width, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MuPWarning)
        mt.parametrize(model, base=ToyMamba2(64, **kwargs), delta=ToyMamba2(128, **kwargs))
    return model


def _rms(t: torch.Tensor) -> float:
    return t.detach().pow(2).mean().sqrt().item()


@pytest.mark.parametrize("split", ["split", "slice"])
def test_probe_records_where_the_in_projection_is_cut(split):
    seen = observe_model(ToyMamba2(64, split=split))
    assert seen.row_cuts["in_proj.weight"] == (0, {0, 128, 256, 264, 272, 280})


def test_fixed_size_rows_get_the_output_role():
    model = _mup(256)
    info = model._mutransfer_spec.params["in_proj.weight"]
    assert info.role == "hidden"
    assert [(r.start, r.stop, r.role) for r in info.row_roles] == [(1024, 1032, "output"), (1032, 1040, "output")]
    assert info.m_out == 4.0  # the growing rows' ratio, not 1072/280
    assert all(r.init_ratio == pytest.approx(0.5) for r in info.row_roles)  # (1/m) / (1/√m) at m = 4


def test_rows_get_the_readouts_init():
    torch.manual_seed(1)
    base = ToyMamba2(64).in_proj.weight.detach()
    w = _mup(256, seed=1).in_proj.weight.detach()
    assert _rms(w[1024:1040]) / _rms(base[256:272]) == pytest.approx(0.25, rel=0.15)  # output: × 1/m
    assert _rms(w[:1024]) / _rms(base[:256]) == pytest.approx(0.5, rel=0.05)  # hidden: × 1/√m


def test_at_base_width_nothing_is_split():
    """At base width µP is the base model: nothing to compare the cuts with and nothing to rescale."""
    model = _mup(64)
    assert model._mutransfer_spec.params["in_proj.weight"].row_roles == ()
    assert "rows of" not in mt.describe(model)


def test_roles_override_keeps_the_weight_whole():
    torch.manual_seed(0)
    model = ToyMamba2(256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MuPWarning)
        mt.parametrize(model, base=ToyMamba2(64), delta=ToyMamba2(128), roles={"in_proj.weight": "hidden"})
    assert model._mutransfer_spec.params["in_proj.weight"].row_roles == ()


def test_describe_shows_the_row_ranges():
    text = mt.describe(_mup(256))
    assert "rows of in_proj.weight (hidden" in text
    assert "rows 1024:1032 output (init × 0.5)" in text and "rows 1032:1040 output" in text


def test_rows_keep_the_weights_group():
    model = _mup(256)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        groups = mt.param_groups(model, 1e-2, "sgd")
    (group,) = [g for g in groups if any(p is model.in_proj.weight for p in g["params"])]
    assert group["lr"] == pytest.approx(1e-2)  # hidden SGD lr × m_out/m_in = 1 with m_out the growing rows' 4


def test_export_round_trip_gives_the_same_outputs():
    model = _mup(128)
    plain = mt.export(model)
    ids = torch.randint(0, 64, (2, 6))
    torch.testing.assert_close(plain(ids), model(ids), rtol=0, atol=0)


def test_base_shapes_file_keeps_the_row_pieces(tmp_path):
    path = tmp_path / "shapes.json"
    mt.save_shapes(ToyMamba2(64), ToyMamba2(128), path)
    assert json.loads(path.read_text())["row_cuts"]["in_proj.weight"] == [0, [0, 128, 256, 264, 272, 280]]
    shapes = WidthShapes.load(path)
    torch.manual_seed(0)
    model = ToyMamba2(256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MuPWarning)
        mt.parametrize(model, base_shapes=shapes)
    assert len(model._mutransfer_spec.params["in_proj.weight"].row_roles) == 2


def test_coord_check_sees_readout_like_rows_and_passes():
    """After: B and C shrink at init like µP's readout (slope −0.54 / −0.52 measured), and correct µP passes."""
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (4, 8), generator=g), torch.randint(0, 64, (4, 8), generator=g)) for _ in range(2)]
    result = mt.coord_check(
        _mup, widths=[64, 256], data=data, optimizer="adam", lr=1e-2, steps=2, seeds=2, progress=False
    )
    assert result.passed, str(result)
    at_init = {t.module: t.slope for t in result.step_trends if t.quantity == "size" and t.step == 0}
    assert at_init["b_tap"] < -0.35 and at_init["c_tap"] < -0.35  # hidden-like init (before): −0.04, −0.02
    assert abs(at_init["in_proj"]) < 0.15


def _whole_hidden(width: int, seed: int = 0) -> ToyMamba2:
    """The behaviour before: the whole in_proj hidden (what roles= can still ask for)."""
    return _mup_roles(width, seed, roles={"in_proj.weight": "hidden"})


def _mup_roles(width: int, seed: int = 0, **kwargs) -> ToyMamba2:
    torch.manual_seed(seed)
    model = ToyMamba2(width)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MuPWarning)
        mt.parametrize(model, base=ToyMamba2(64), delta=ToyMamba2(128), **kwargs)
    return model


@pytest.mark.slow
def test_sgd_check_fails_the_whole_hidden_weight_and_passes_the_rows():
    """SGD: B and C grew with slope +0.35 with the whole in_proj hidden (their Θ(1) init pulls the embedding's
    update along them); with the rows' own init they stay Θ(1)."""
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (8, 12), generator=g), torch.randint(0, 64, (8, 12), generator=g)) for _ in range(4)]

    def check(make):
        return mt.coord_check(
            make, widths=[64, 512], data=data, optimizer="sgd", lr=0.3, steps=4, seeds=2, progress=False
        )

    before, after = check(_whole_hidden), check(_mup)
    change = {
        (t.module, which): t.slope
        for which, r in (("before", before), ("after", after))
        for t in r.step_trends
        if t.quantity == "change" and t.step == 4
    }
    assert not before.passed and {"b_tap", "c_tap"} & set(before.failing_modules())
    assert change["b_tap", "before"] > 0.2 and change["c_tap", "before"] > 0.2
    assert after.passed, str(after)
    assert abs(change["b_tap", "after"]) < 0.25 and abs(change["c_tap", "after"]) < 0.25


def test_reverse_fusion_is_named_not_silent():
    """Before: the concatenated input's fixed-size columns silently took the hidden role with the rest."""
    with pytest.warns(MuPWarning, match=r"input of 'mix.weight' is concatenated .* columns 256:272 are input-like"):
        mt.parametrize(ConcatInput(256), base=ConcatInput(64), delta=ConcatInput(128))
    with warnings.catch_warnings():
        warnings.simplefilter("error", MuPWarning)
        mt.parametrize(ConcatInput(256), base=ConcatInput(64), delta=ConcatInput(128), roles={"mix.weight": "hidden"})


@pytest.mark.slow
def test_hugging_face_mamba2_rows_are_followed_through_the_depthwise_conv():
    pytest.importorskip("transformers")
    from mechanisms_rows import hf_mamba2

    model = hf_mamba2(256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mt.parametrize(model, base=hf_mamba2(64), delta=hf_mamba2(128))
    info = model._mutransfer_spec.params["backbone.layers.0.mixer.in_proj.weight"]
    assert [(r.start, r.stop, r.role) for r in info.row_roles] == [(1024, 1032, "output"), (1032, 1040, "output")]
