"""The sweep config's schema, the reference generated from it, the cells, and the narrow `mt.sweep`."""

import dataclasses
import importlib
import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mutransfer.errors import ConfigError
from mutransfer.sweep import Cell, config_from_dict
from mutransfer.sweep.config import config as config_module
from mutransfer.sweep.config import schema
from mutransfer.sweep.config.space import SPACE_KEYS

DOCS = Path(__file__).resolve().parents[2] / "docs"
MINIMAL = {"objective": "recipe:mlp", "widths": [16, 64], "space": {"lr": {"low": 1e-3, "high": 1e-1, "grid": 3}}}


def _hook():
    spec = importlib.util.spec_from_file_location("config_reference_hook", DOCS / "hooks" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_accepted_key_is_in_the_schema_with_its_meaning():
    documented = {k.name for k in schema.TOP_LEVEL}
    assert config_module.KEYS == documented | set(schema.DEPRECATED_KEYS)
    for table in (schema.TOP_LEVEL, schema.SPACE, schema.CLUSTER):
        for key in table:
            assert key.type and len(key.meaning) > 15 and key.meaning.rstrip("`").endswith((".", ")")), key.name
    assert {k.name for k in schema.SPACE} == SPACE_KEYS
    assert {k.name for k in schema.CLUSTER} == {f.name for f in dataclasses.fields(schema.ClusterConfig)}
    assert set(schema.DEPRECATED_KEYS.values()) <= documented
    options = {key for opts in schema.PRUNER_OPTIONS.values() for key in opts}
    assert options == set(schema.PRUNER_OPTION_MEANINGS)


def test_the_config_dataclass_holds_every_key():
    fields = {f.name for f in dataclasses.fields(config_module.SweepConfig)}
    axes = set(config_module.EXTRA_AXES)  # held in `axes`, by the hyperparameter they set
    own_spaces = set(config_module.PARAMETRIZATIONS)  # [mup.space.*], [sp.space.*]: held in `space_overrides`
    assert {k.name for k in schema.TOP_LEVEL} - axes - own_spaces <= fields
    assert fields - {k.name for k in schema.TOP_LEVEL} == {"axes", "raw", "space_overrides"}


def test_the_reference_page_is_generated_from_the_schema():
    page = (DOCS / "config_reference.md").read_text()
    assert _hook().MARKER in page
    rendered = _hook().render(page)
    assert _hook().MARKER not in rendered
    for table in (schema.TOP_LEVEL, schema.SPACE, schema.CLUSTER):
        for key in table:
            assert f"| `{key.name}` | {key.type} | {key.shown_default()} | {key.meaning} |" in rendered
    for options in schema.PRUNER_OPTIONS.values():
        for key in options:
            assert f"| `{key}` |" in rendered
    assert "`steps` → `horizons`" in rendered
    assert "| `seeds` | list of integers in [0, 2**32) | `[0]` |" in rendered
    assert "| `widths` | list of integers ≥ 1 | **required** |" in rendered


def test_a_key_without_documentation_fails_the_reference_test(monkeypatch):
    undocumented = schema.Key("new_key", "integer", 1, "")
    monkeypatch.setattr(schema, "TOP_LEVEL", (*schema.TOP_LEVEL, undocumented))
    with pytest.raises(AssertionError):
        test_every_accepted_key_is_in_the_schema_with_its_meaning()


def test_the_old_steps_key_still_works_with_a_warning():
    with pytest.warns(DeprecationWarning, match="'steps' was renamed 'horizons'"):
        old = config_from_dict({**MINIMAL, "steps": [40, 10]}, "old.toml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = config_from_dict({**MINIMAL, "horizons": [40, 10]})
    assert old.axes == new.axes == {"steps": [10, 40]}
    assert old.all_cells == new.all_cells
    assert old.contents["steps"] == [40, 10]  # the run directory's copy compares as written
    with pytest.raises(ConfigError, match="steps and horizons are the same setting"):
        config_from_dict({**MINIMAL, "steps": [10], "horizons": [10]})


def test_cells_are_named_tuples_with_their_derived_values():
    cfg = config_from_dict({**MINIMAL, "name": "s", "batch_sizes": [8, 32], "depths": [2, 4]})
    assert cfg.proxy_width == 16 and cfg.proxy_depth == 2 and cfg.proxy_extra == {"batch_size": 8}
    assert len(cfg.all_cells) == 2 * 2 * 2 + 2
    last = cfg.all_cells[-1]
    assert last == ("sp", 16, 2, (("batch_size", 32),)) and isinstance(last, Cell)
    parametrization, width, depth, extra = last
    assert (parametrization, width, depth, extra) == ("sp", 16, 2, (("batch_size", 32),))
    assert last.study_name("s") == "s/sp/w16/d2/batch_size32"
    assert last.label == "sp width 16 depth 2 batch_size 32"
    assert last.extra_hparams == {"batch_size": 32}
    assert cfg.proxy_cell("mup") == Cell("mup", 16, 2, ())
    assert len({c.sampler_seed for c in cfg.all_cells}) == len(cfg.all_cells)
    assert cfg.cells[0] == ("mup", 16, 2)  # the width × depth grid keeps its 3-tuples


def test_mt_sweep_is_narrow_and_lazy():
    import mutransfer.sweep as sweep

    assert len(sweep.__all__) <= 15
    for name in sweep.__all__:
        assert getattr(sweep, name).__doc__, name
    code = "import sys, mutransfer.sweep as s; print('optuna' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("old, new", [("objective", "scale"), ("objectives", "recipes")])
def test_old_module_paths_import_with_a_warning(old, new):
    sys.modules.pop(f"mutransfer.sweep.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"mutransfer.sweep.{new}"):
        module = importlib.import_module(f"mutransfer.sweep.{old}")
    current = importlib.import_module(f"mutransfer.sweep.{new}")
    assert all(getattr(module, name) is getattr(current, name) for name in module.__all__)


def test_the_sweeps_page_includes_the_example_objective_and_config():
    page = (DOCS / "sweeps.md").read_text()
    root = DOCS.parent
    for path in ("examples/my_objective.py", "examples/my_sweep.toml"):  # pymdownx.snippets, from the repo root
        assert f'--8<-- "{path}"' in page and (root / path).is_file()
    cfg = config_module.load_config(root / "examples" / "my_sweep.toml")
    assert cfg.objective == "my_objective.py:train" and cfg.config_dir == (root / "examples").resolve()


def test_grid_ends_are_the_range_ends_exactly():
    """2**log2(0.1) is 0.10000000000000005: Optuna warned on every rerun that the top grid point lay
    outside the range it was enqueued under."""
    from mutransfer.sweep.config.space import LogUniform, Uniform

    for dim in (LogUniform(1e-4, 0.1, grid=12), Uniform(0.1, 0.7, grid=7), LogUniform(3e-5, 0.3, grid=5)):
        points = dim.grid_points()
        assert points[0] == dim.low and points[-1] == dim.high and len(points) == dim.grid
        assert all(dim.low <= p <= dim.high for p in points) and points == sorted(points)
