"""The documentation site cannot rot: its examples run, every public name is on an API page.

- Every fenced ```python block preceded (on the line directly before it) by ``<!-- test: run -->``
  runs: all marked blocks of a page in order, in one fresh namespace, in a temporary working
  directory, after ``torch.manual_seed(0)``. One test per page that has such blocks.
- Every public name (``__all__`` of the package and of its public modules) lies in the scope of a
  ``::: module`` (or ``::: module.name``) directive on some page, so mkdocstrings renders it.
- Every public callable (and every public method of a public class) has a docstring.
- Every exception and warning class of ``mutransfer.errors`` is explained on the troubleshooting page.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import linecache
import re
import traceback
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
RUN_MARK = "<!-- test: run -->"

# The modules whose `__all__` is the public API, and so must be documented on the site.
PUBLIC_MODULES = (
    "mutransfer",
    "mutransfer.errors",
    "mutransfer.rules",
    "mutransfer.optim",
    "mutransfer.optimizers",
    "mutransfer.sweep",
    "mutransfer.limits",
)

# Public callables without a docstring when this test was written (src/ is another helper's area).
# Entries that are gone or documented are ignored; a NEW undocumented name fails. Empty it.
_KNOWN_UNDOCUMENTED = {
    "mutransfer.load_shapes",
    "mutransfer.rules.formulation_rules",
    "mutransfer.rules.TunableMultipliers.init_mult",
    "mutransfer.rules.TunableMultipliers.lr_mult",
    "mutransfer.CoordCheckResult.to_csv",
    "mutransfer.CoordCheckResult.to_dict",
    "mutransfer.CoordCheckResult.to_json",
    "mutransfer.MuSpec.rule",
    "mutransfer.MuSpec.depth_rule",
    "mutransfer.WidthShapes.to_dict",
    "mutransfer.WidthShapes.save",
    "mutransfer.sweep.Sweep.study",
    "mutransfer.sweep.Sweep.total_trials",
    "mutransfer.limits.OneHiddenLayer.preactivations",
    "mutransfer.CoordCheckResult.passed",
    "mutransfer.WidthShapes.from_dict",
    "mutransfer.WidthShapes.load",
    "mutransfer.optim.MuonWithAdamW.state",
    "mutransfer.optimizers.MuonWithAdamW.state",
    "mutransfer.rules.DepthRule",
    "mutransfer.rules.Rule",
    "mutransfer.sweep.Scale.mup",
    "mutransfer.sweep.Sweep.objective",
    "mutransfer.sweep.SweepConfig",
}


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block whose previous line is the run mark."""
    lines = text.splitlines()
    blocks: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("```python") and i > 0 and lines[i - 1].strip() == RUN_MARK:
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"unclosed ```python block at line {i + 1}")
            blocks.append((start + 1, "\n".join(lines[start:j]) + "\n"))
            i = j
        i += 1
    return blocks


def _runnable_pages() -> list[Path]:
    return [p for p in _pages() if runnable_blocks(p.read_text(encoding="utf-8"))]


def test_the_block_collector_reads_only_marked_python_blocks():
    text = "\n".join(
        [
            "intro",
            RUN_MARK,
            "```python",
            "x = 1",
            "```",
            "```python",
            "not run",
            "```",
            RUN_MARK,
            "",
            "```python",
            "not run either: a blank line after the mark",
            "```",
            RUN_MARK,
            "```python",
            "y = x + 1",
            "```",
        ]
    )
    assert runnable_blocks(text) == [(4, "x = 1\n"), (16, "y = x + 1\n")]


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    blocks = runnable_blocks(page.read_text(encoding="utf-8"))
    for number, (line, code) in enumerate(blocks, 1):
        filename = f"<docs/{page.relative_to(DOCS)} block {number}>"
        # like a user's file: `inspect.getsource` (which parametrize uses on forwards) can read it
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            exec(compile(code, filename, "exec"), namespace)
        except Exception:
            pytest.fail(
                f"docs/{page.relative_to(DOCS)}: block {number} of {len(blocks)} (line {line}) raised:\n"
                f"{traceback.format_exc()}",
                pytrace=False,
            )


_DIRECTIVE = re.compile(r"^:::\s*([\w.]+)\s*$")


def directives() -> dict[str, set[str] | None]:
    """Every `::: path` on the site → the members it lists under `options: members:` (None: all)."""
    found: dict[str, set[str] | None] = {}
    for page in _pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = _DIRECTIVE.match(line.strip())
            if not match:
                continue
            members: set[str] | None = None
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) and lines[j].strip()):
                item = lines[j].strip()
                if item.startswith("members:"):
                    rest = item[len("members:") :].strip()
                    if rest.startswith("["):
                        members = {m.strip(" '\"") for m in rest.strip("[]").split(",") if m.strip()}
                    elif rest in ("false", "False"):
                        members = set()
                    else:
                        members = set()
                        k = j + 1
                        while k < len(lines) and lines[k].strip().startswith("- "):
                            members.add(lines[k].strip()[2:].strip(" '\""))
                            k += 1
                j += 1
            path = match.group(1)
            previous = found.get(path, set())
            found[path] = None if members is None or previous is None else previous | members
    return found


def _documented(module: str, name: str, scopes: dict[str, set[str] | None]) -> bool:
    if f"{module}.{name}" in scopes:
        return True
    members = scopes.get(module, set())
    if members is None:  # the whole module: mkdocstrings renders its __all__
        return True
    if name in members:
        return True
    # a submodule rendered on its own page (`mt.sweep` → `::: mutransfer.sweep`)
    return module == "mutransfer" and f"mutransfer.{name}" in scopes


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_is_on_an_api_page(module: str):
    scopes = directives()
    names = [n for n in importlib.import_module(module).__all__ if not n.startswith("__")]
    missing = [n for n in names if not _documented(module, n, scopes)]
    assert not missing, (
        f"public names of {module} on no API page (add `::: {module}` or list them under its "
        f"`options: members:` on a page in docs/reference/): {', '.join(missing)}"
    )


def _public_callables() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or name.startswith("_") or not callable(obj):
                continue
            if not getattr(obj, "__module__", "").startswith("mutransfer"):
                continue  # a type alias or a re-exported torch class
            found.setdefault(f"{module}.{name}", obj)
            if inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if isinstance(value, property):
                        found.setdefault(f"{module}.{name}.{attr}", value)
                    elif inspect.isfunction(value):  # an override inherits its base's docstring
                        found.setdefault(f"{module}.{name}.{attr}", getattr(obj, attr))
    return found


def _docstring(obj: Any) -> str:
    if inspect.isclass(obj):  # a class's own: not its base's, not the signature dataclasses write
        doc = (obj.__doc__ or "").strip()
        return "" if doc.startswith(f"{obj.__name__}(") else doc
    return (inspect.getdoc(obj) or "").strip()


def test_every_public_callable_has_a_docstring():
    missing = sorted(
        path for path, obj in _public_callables().items() if not _docstring(obj) and path not in _KNOWN_UNDOCUMENTED
    )
    assert not missing, f"public callables without a docstring (Google style, Args/Returns/Raises): {missing}"


def test_troubleshooting_explains_every_error_class():
    import mutransfer.errors as errors

    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    missing = [name for name in errors.__all__ if not re.search(rf"\b{name}\b", page)]
    assert not missing, f"docs/troubleshooting.md does not mention: {', '.join(missing)}"


def test_pages_reference_only_existing_images():
    broken = []
    for page in _pages():
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(DOCS)} → {target}")
    assert not broken, f"images that do not exist: {broken}"


def _rules_hook():
    spec = importlib.util.spec_from_file_location("rules_tables", DOCS / "hooks" / "rules_tables.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rules_page_tables_come_from_the_rules_data():
    from mutransfer import rules

    hook = _rules_hook()
    assert hook.width_factor((-1.0, 1.0)) == "×m_out/m_in"
    assert hook.width_factor((-0.5, 0.0)) == "×1/√m_in"
    assert hook.width_factor((0.0, 0.0)) == "×1"
    assert hook.depth_exponent((-1.0, 2.0)) == "×m_L^(2α−1)"
    assert hook.depth_exponent((0.0, -1.0)) == "×m_L^-α"
    assert hook.depth_exponent((-1.0, 0.0)) == "×m_L^-1"
    page = hook.render((DOCS / "rules.md").read_text(encoding="utf-8"))
    assert "<!-- rules-tables" not in page
    hidden = next(line for line in page.splitlines() if line.startswith("| `hidden` |"))
    assert hidden.split(" | ")[1:5] == [
        hook.width_factor(rules.TABLE3["hidden"].init),
        hook.width_factor(rules.TABLE3["hidden"].forward),
        hook.width_factor(rules.TABLE3["hidden"].sgd_lr),
        hook.width_factor(rules.TABLE3["hidden"].adam_lr),
    ]
    for name in rules.OPTIMIZERS:
        assert f"| `{name}` |" in page
    for where in rules.DEPTH_RULES:
        assert f"| `{where}` |" in page
