"""The package's layers, read from its source: imports point one way, no module reaches into
another's private names. (See docs/ARCHITECTURE.md.)"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "mutransfer"

# Each layer may import the layers after it in this list, never one before it.
LAYERS = ["cli", "sweep", "monitor", "coord", "core"]
STANDALONE = ("limits", "recipes")  # import nothing of the package but themselves (and `errors`)
LEAF = "mutransfer.errors"  # imports nothing: anything may raise its classes
# The one edge from a standalone package into the package's public face, and why: `FeatureLimit` is
# defined as the limit of what `mt.parametrize` and `mt.param_groups` produce, so it reads their
# constants off them (at call time) instead of restating the rules.
STANDALONE_USES_ROOT = {"mutransfer.limits._feature.scaling"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(path: Path, type_checking: bool = False):
    """(target module, names, alias → module) of every import outside `if TYPE_CHECKING:` (with
    `type_checking`, those inside it too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _type_checking(node) and not type_checking
        for child in node.body
        for n in ast.walk(child)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if (SRC / Path(*sub.split("."))).with_suffix(".py").is_file() or (
                        SRC / Path(*sub.split(".")) / "__init__.py"
                    ).is_file():
                        found.append((sub, [], {alias.asname or alias.name: sub}))
                    else:
                        found.append((target, [alias.name], {}))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.append((alias.name, [], {alias.asname or alias.name: alias.name}))
    return tree, found


def graph(type_checking: bool = False):
    edges, trees = {}, {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        mod = module_name(path)
        tree, found = imports(path, type_checking)
        trees[mod] = (tree, found)
        edges[mod] = {t for t, _, _ in found if t != mod}
    return edges, trees


def layer(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "top"
    head = parts[1]
    if head in ("cli", "sweep", "monitor", "coord") or head in STANDALONE:
        return head
    return "core"


def _circles(edges: dict) -> list:
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if t == PACKAGE:  # `from .. import optim` resolves to the submodule; the root itself is not a layer
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return cycles


def test_limits_reads_bottom_up_type_imports_included():
    """Issue 49: inside `limits/` no module imports one above it, not even for an annotation (the op rules
    are typed against `_program.context.Pass`, not `run.Run`; `_traced` and `_kernels` share `_arrays`)."""
    edges, _ = graph(type_checking=True)
    inside = {m: {t for t in ts if t.startswith(f"{PACKAGE}.limits")} for m, ts in edges.items()}
    inside = {m: ts for m, ts in inside.items() if m.startswith(f"{PACKAGE}.limits")}
    cycles = _circles(inside)
    assert not cycles, "import circles in limits/: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_circle():
    edges, _ = graph()
    # the package's own __init__ re-exports: an edge into it is an edge into what it lists (`_circles` skips it)
    cycles = _circles(edges)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_point_one_way():
    edges, _ = graph()
    wrong = []
    for mod, targets in edges.items():
        src = layer(mod)
        for t in targets:
            if t == PACKAGE and src in STANDALONE and mod not in STANDALONE_USES_ROOT:
                wrong.append(f"{mod} -> {t} ({src} stands alone: the public face imports everything)")
            if t == PACKAGE or src == "top" or t == LEAF:
                continue
            dst = layer(t)
            if src in STANDALONE or dst in STANDALONE:
                if src != dst and src in STANDALONE:
                    wrong.append(f"{mod} -> {t} ({src} stands alone)")
                continue
            if dst == "cli" and src != "cli":
                wrong.append(f"{mod} -> {t} (nothing imports the CLI)")
            elif src in LAYERS and dst in LAYERS and LAYERS.index(dst) < LAYERS.index(src):
                wrong.append(f"{mod} -> {t} ({src} is below {dst})")
    assert not wrong, "imports against the layers: " + "; ".join(sorted(wrong))


def test_no_module_uses_another_modules_private_names():
    _, trees = graph()
    wrong = []
    for mod, (tree, found) in trees.items():
        aliases = {}
        for target, names, bound in found:
            aliases.update(bound)
            for n in names:
                if n.startswith("_") and not n.startswith("__") and target != mod:
                    wrong.append(f"{mod}: from {target} import {n}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != mod
            ):
                wrong.append(f"{mod}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    assert not wrong, "private names used across modules: " + "; ".join(sorted(set(wrong)))


def test_every_public_module_declares_its_names():
    missing = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        mod = module_name(path)
        if any(p.startswith("_") and p != "__init__" for p in path.relative_to(SRC).with_suffix("").parts):
            continue  # internal modules
        tree = ast.parse(path.read_text())
        if not any(
            (isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets))
            or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "__all__")
            for n in tree.body
        ):
            missing.append(mod)
    assert not missing, "public modules without __all__: " + ", ".join(missing)


@pytest.mark.parametrize("mod", ["mutransfer.cli"])
def test_the_cli_is_a_leaf(mod):
    edges, _ = graph()
    assert not [m for m, t in edges.items() if mod in t and m != mod]


def test_errors_is_a_leaf():
    edges, _ = graph()
    assert not edges[LEAF], f"mutransfer.errors imports {sorted(edges[LEAF])}"


def test_every_public_exception_and_warning_lives_in_errors():
    """Exception and warning classes users can meet are defined in `mutransfer.errors` only
    (private control-flow exceptions, named with `_`, may live beside their code)."""
    elsewhere = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        mod = module_name(path)
        if mod == LEAF:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Warning", "Interrupt")) for b in bases):
                    elsewhere.append(f"{mod}.{node.name}")
    assert not elsewhere, "exception classes outside mutransfer.errors: " + ", ".join(elsewhere)


def test_import_is_lazy():
    """`import mutransfer` and the CLI's parser load no torch: `mutransfer --help` answers at once."""
    import subprocess
    import sys

    code = (
        "import sys, mutransfer, mutransfer.cli\n"
        "heavy = [m for m in ('torch', 'numpy', 'optuna', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_test_imports_helpers_from_a_conftest():
    """`from conftest import build` bound whichever conftest pytest had imported first (tests/limits has
    its own): `pytest tests/test_scripts.py tests/core/test_metadata.py tests/limits/...` failed to
    collect test_metadata. Shared helpers live in conftest-free modules (tests/model_helpers.py, …)."""
    tests = Path(__file__).resolve().parent
    offenders = [
        str(p.relative_to(tests))
        for p in tests.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if (isinstance(node, ast.ImportFrom) and node.module == "conftest")
        or (isinstance(node, ast.Import) and any(a.name == "conftest" for a in node.names))
    ]
    assert offenders == []


# Inside `sweep/` (issue 51): each subpackage may import the ones before it in this list, never one
# after it. `scale` and `recipes` stay at the top of `sweep/` (what an objective imports: the
# documented `mutransfer.sweep.recipes:train_gpt`); they import no subpackage. `__init__` is the face.
SWEEP = f"{PACKAGE}.sweep"
SWEEP_LAYERS = ["objective", "config", "engine", "analysis", "report", "launch", "transfer"]
SWEEP_FACE_OF_OBJECTIVES = ("scale", "recipes")


def sweep_layer(mod: str) -> str | None:
    """The sweep layer of a module (None: the package's face, or not in `sweep/`)."""
    if not mod.startswith(SWEEP + "."):
        return None
    head = mod[len(SWEEP) + 1 :].split(".")[0]
    if head in SWEEP_FACE_OF_OBJECTIVES:
        return "objective"
    assert head in SWEEP_LAYERS, f"{mod}: a module of sweep/ outside its subpackages {SWEEP_LAYERS}"
    return head


def test_sweep_modules_live_in_their_subpackages():
    loose = sorted(
        p.stem for p in (SRC / PACKAGE / "sweep").glob("*.py") if p.stem not in ("__init__", *SWEEP_FACE_OF_OBJECTIVES)
    )
    assert loose == [], f"modules loose in sweep/ (put each in one of {SWEEP_LAYERS[1:]}): {loose}"
    subpackages = sorted(p.name for p in (SRC / PACKAGE / "sweep").iterdir() if (p / "__init__.py").is_file())
    assert subpackages == sorted(SWEEP_LAYERS[1:])


@pytest.mark.parametrize("type_checking", [False, True])
def test_sweep_subpackages_import_one_way(type_checking):
    """config < engine < analysis < report < launch < transfer: no import from a later subpackage, not
    even for an annotation, and none into the lazy face `mutransfer.sweep` from inside it."""
    edges, _ = graph(type_checking=type_checking)
    wrong = []
    for mod, targets in edges.items():
        src = sweep_layer(mod)
        if src is None:
            continue
        for t in targets:
            if t == SWEEP:
                wrong.append(f"{mod} -> {t} (the lazy face; import the module that defines the name)")
                continue
            dst = sweep_layer(t)
            if dst is not None and SWEEP_LAYERS.index(dst) > SWEEP_LAYERS.index(src):
                wrong.append(f"{mod} -> {t} ({src} is below {dst})")
    assert not wrong, "imports against the sweep layers: " + "; ".join(sorted(wrong))
    inside = {m: {t for t in ts if t.startswith(SWEEP + ".")} for m, ts in edges.items() if m.startswith(SWEEP + ".")}
    cycles = _circles(inside)
    assert not cycles, "import circles in sweep/: " + "; ".join(" -> ".join(c) for c in cycles)
