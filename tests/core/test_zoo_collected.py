"""The zoo's optional packages: only an absent package may skip a zoo model (issue 48).

An installed timm that fails to import (the torchvision shim of tests/zoo.py broken, torchvision's
pure-Python folder missing) must make the timm models' tests fail and name the cause, not report the
models "not available" and drop them. In CI (``CI`` set: .ci/run) every zoo entry must be installed, and
every test parametrized over zoo entries must collect all of them. These tests are fast (no model is
trained): they run in ``make test-fast`` too.
"""

import importlib.util
import os
from types import SimpleNamespace

import pytest

import zoo
from zoo import ZOO

TIMM = [n for n, e in ZOO.items() if e.requires == "timm"]


def _broken_shim(error: Exception):
    def prepare():
        raise error

    return prepare


def test_a_broken_torchvision_shim_fails_the_timm_models_instead_of_skipping_them(monkeypatch):
    """The real install: timm is installed, the shim raises. Before issue 48 the entries then read
    "not available" (their tests skipped, and the export test dropped them at collection)."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed (the only case in which the timm models may skip)")
    monkeypatch.setattr(zoo, "_prepare_torchvision", _broken_shim(RuntimeError("operator torchvision::nms")))
    assert all(ZOO[n].available() for n in TIMM), "an installed timm must count as available"
    assert set(TIMM) <= set(zoo.available())
    for name in TIMM:
        with pytest.raises(RuntimeError, match=r"timm is installed but importing it failed: RuntimeError: operator"):
            ZOO[name].make(32)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("operator torchvision::nms does not exist"),
        ModuleNotFoundError("No module named 'torchvision'", name="torchvision"),  # an ImportError, but of
        # a dependency of an installed package: a broken install, not an absent package
        ImportError("cannot import name 'FrozenBatchNorm2d' from 'torchvision.ops.misc'"),
    ],
    ids=["runtime-error", "torchvision-missing", "import-error"],
)
def test_an_installed_package_that_fails_to_import_raises_naming_the_cause_and_the_fix(monkeypatch, error):
    monkeypatch.setattr(zoo, "_installed", lambda package: True)
    monkeypatch.setattr(zoo, "_prepare_torchvision", _broken_shim(error))
    assert zoo.missing() == {}
    assert [n for n in zoo.available() if n in TIMM] == TIMM
    with pytest.raises(RuntimeError) as info:
        ZOO["timm_vit"].make(32)
    message = str(info.value)
    assert f"{type(error).__name__}: {error}" in message
    assert "torchvision-pyonly" in message and "tests/zoo.py" in message
    assert info.value.__cause__ is error


def test_only_an_absent_package_makes_an_entry_unavailable_and_its_tests_skip(monkeypatch):
    monkeypatch.setattr(zoo, "_installed", lambda package: package != "timm")
    assert zoo.missing() == dict.fromkeys(TIMM, "timm")
    assert not set(TIMM) & set(zoo.available())
    collected = {p.values[0]: p.marks for p in zoo.params()}
    assert list(collected) == list(ZOO), "params() must collect every entry, installed or not"
    for name, marks in collected.items():
        (mark,) = marks
        assert mark.name == "skipif"
        assert mark.args == ((name in TIMM),)
        assert mark.kwargs["reason"] == f"{ZOO[name].requires} is not installed"


def _item(module, function, name):
    return SimpleNamespace(
        module=module, nodeid=f"tests/core/{function}[{name}]", callspec=SimpleNamespace(params={"name": name})
    )


def test_uncollected_lists_the_zoo_entries_a_test_function_dropped():
    """The pre-issue-48 export test with a broken shim: its parametrize list left the timm entries out."""
    module = SimpleNamespace(ZOO=ZOO)
    items = [_item(module, "test_export.py::test_exports", n) for n in ZOO if n not in TIMM]
    items += [_item(module, "test_zoo.py::test_parametrize", n) for n in ZOO]
    items += [_item(SimpleNamespace(), "test_other.py::test_names", "llama")]  # not a zoo module
    assert zoo.uncollected(items) == {"tests/core/test_export.py::test_exports": TIMM}
    assert zoo.uncollected(items[len(ZOO) - len(TIMM) :]) == {}


def test_every_zoo_test_collects_every_zoo_entry(zoo_uncollected):
    """Recorded at collection (tests/conftest.py), before -m/-k deselect: a test parametrized over zoo
    entries that filters its list (as the export test did by "available") drops models silently."""
    if zoo_uncollected is None:
        pytest.skip("this run selected single tests (node ids, --lf or --sw): the zoo tests' coverage is unknown")
    assert zoo_uncollected == {}, (
        "these tests are parametrized over a subset of tests/zoo.py's ZOO: "
        + "; ".join(f"{fn} lacks {', '.join(names)}" for fn, names in zoo_uncollected.items())
        + ". Parametrize over every entry (zoo.params(), or sorted(ZOO) and skip where not entry.available())."
    )


def test_ci_has_every_zoo_model():
    """CI installs the test extras (the Makefile's test install): there, an entry whose package is missing
    would skip its tests, and "every zoo model" in the docs would be false."""
    if not os.environ.get("CI"):
        pytest.skip("CI is not set: an absent optional package may skip its zoo models here")
    missing = zoo.missing()
    assert not missing, (
        "CI must test every zoo model, but these need a package that is not installed: "
        + ", ".join(f"{n} ({p})" for n, p in missing.items())
        + ". Install the test extras as the Makefile's test target does (make test)."
    )
