"""Load a user's function from 'module:function' or 'path/to/file.py:function'.

A leaf module (standard library only) shared by the CLI and the library: errors are ValueError
naming the spec, the file and what went wrong — including any exception raised while the
module is imported (a missing setting, a syntax error), so that callers never show a traceback
for a bad spec.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

PathLike = str | os.PathLike


def is_file_spec(spec: str) -> bool:
    """Does `spec`'s module part name a file (ends with .py or holds a path separator)?"""
    module_part = spec.rsplit(":", 1)[0]
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def resolve_file(spec: str, base_dir: PathLike | None = None) -> Path:
    """The file of a 'path.py:function' spec; a relative path is taken from `base_dir` (default: cwd)."""
    path = Path(spec.rsplit(":", 1)[0]).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def load_module(spec: str, what: str, base_dir: PathLike | None = None) -> ModuleType:
    """Import `spec`'s module part: a .py file (relative to `base_dir`, default the current
    directory) or a dotted module name, importable from `base_dir` as well as the current directory."""
    module_part = spec.rsplit(":", 1)[0]
    if is_file_spec(spec):
        path = resolve_file(spec, base_dir)
        if not path.is_file():
            where = f" (relative paths are taken from {base_dir})" if base_dir is not None else ""
            raise ValueError(f"{what} '{spec}': file {path} not found{where}")
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"{what} '{spec}': {path} is not a Python file")
        module = importlib.util.module_from_spec(mod_spec)
        with _on_path([path.parent.resolve()]):
            try:
                mod_spec.loader.exec_module(module)
            except Exception as e:
                raise ValueError(f"{what} '{spec}': importing {path} raised {_describe(e)}") from None
        return module
    dirs = ([Path(base_dir).resolve()] if base_dir is not None else []) + [Path.cwd()]
    with _on_path(dirs):
        try:
            return importlib.import_module(module_part)
        except ImportError as e:
            where = " or ".join(str(d) for d in dict.fromkeys(dirs))
            raise ValueError(
                f"{what} '{spec}': cannot import {module_part} ({e}); looked in {where} and sys.path"
            ) from None
        except Exception as e:
            origin = _origin(module_part) or module_part
            raise ValueError(f"{what} '{spec}': importing {origin} raised {_describe(e)}") from None


def load_callable(spec: str, what: str, base_dir: PathLike | None = None) -> Callable:
    """The function named by 'module:function' or 'path/to/file.py:function' (see `load_module`)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{what} must look like module:function or path/to/file.py:function, got {spec!r}")
    module = load_module(spec, what, base_dir)
    name = spec.rsplit(":", 1)[1]
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(
            f"{what} '{spec}': {getattr(module, '__file__', None) or module.__name__} has no function '{name}'"
        )
    return fn


def _describe(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    return f"{type(e).__name__}: {e}"


def _origin(module_part: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module_part)
    except Exception:
        return None
    return spec.origin if spec is not None else None


class _on_path:
    """Put directories first on sys.path for the duration of an import."""

    def __init__(self, dirs: list[Path]):
        self.dirs = [str(d) for d in dict.fromkeys(dirs)]

    def __enter__(self) -> None:
        sys.path[:0] = self.dirs

    def __exit__(self, *exc) -> None:
        for d in self.dirs:
            try:
                sys.path.remove(d)
            except ValueError:
                pass
