"""Sweep configuration: a TOML file (or the same dict from Python), validated up front.

```toml
name = "gpt-lr"
objective = "recipe:gpt"        # or "mymodule:train" / "path/to/file.py:train"
widths = [32, 64, 128, 256]     # proxy widths swept
base_width = 32                 # µP base width (default: the smallest width)
target_width = 512              # for `mutransfer transfer` (optional)
depths = [2, 4, 8]              # proxy depths swept (optional; the objective reads scale.depth)
base_depth = 2                  # µP base depth (default: the smallest depth)
target_depth = 32               # for `mutransfer transfer` (optional)
batch_sizes = [16, 32, 64]      # batch sizes swept at the proxy width (optional; hparams["batch_size"])
steps = [100, 200, 400]         # training horizons swept at the proxy width (optional; hparams["steps"])
parametrizations = ["mup", "sp"]
sampler = "grid"                # grid | random | tpe
n_trials = 16                   # random/tpe: trials per (parametrization, width[, depth])
seeds = [0]                     # every trial trains once per seed; the loss is the mean
storage = ""                    # default: sqlite file in the run directory; or postgresql://...

[space.lr]
type = "log"                    # log | uniform | choice
low = "2**-12"
high = "2**-5"
grid = 8

[fixed]                         # passed to the objective unchanged
steps = 200
```

`batch_sizes` and `steps` are axes like width and depth (TP5 finds HPs transfer across batch
size and training horizon empirically): the objective receives them as ``hparams["batch_size"]``
and ``hparams["steps"]``. They are not crossed with everything: every width (and depth) runs at
the first (smallest) batch size and horizon, and each further batch size or horizon runs at the
proxy width and depth only, one study each. The report gives drift and regret along each axis.

Relative paths resolve against the TOML file's directory, not the current directory: a file
objective (``objective = "train.py:train"``), a dotted module (``"mymod:train"`` is imported from
the TOML's directory, or else the current directory) and an SQLite storage
(``storage = "sqlite:///sweep.db"``; ``sqlite:////abs/path.db`` is absolute).

The run directory keeps a copy of the config (``config.toml``) with one line added at the top,
``config_dir = "/absolute/dir/of/the/original/toml"``: the directory relative paths are resolved
against. A resumed run (`Sweep(run_dir)`, ``mutransfer worker RUN``) reads the copy and so
resolves them exactly as the first run did, from whatever the current directory is. A worker on
another machine gets the copy from the storage; where `config_dir` does not exist on that
machine, the objective's relative path or module is looked up from the worker's current
directory instead. Rerunning ``mutransfer sweep CONFIG`` with the TOML moved elsewhere (same
contents) updates `config_dir` in the copy. `config_dir` may be given in a TOML by hand; it
must then be an absolute path.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from .space import Choice, Dimension, dimension_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SAMPLERS = ("grid", "random", "tpe")
PARAMETRIZATIONS = ("mup", "sp")
EXTRA_AXES = {"batch_sizes": "batch_size", "steps": "steps"}  # config key -> the hyperparameter it sets
KEYS = {"name", "objective", "widths", "base_width", "target_width", "depths", "base_depth", "target_depth",
        *EXTRA_AXES,
        "parametrizations", "sampler", "n_trials", "seeds", "storage", "space", "fixed", "config_dir"}
CONFIG_DIR_KEY = "config_dir"


@dataclass
class SweepConfig:
    objective: str
    widths: list[int]
    space: dict[str, Dimension]
    name: str = "sweep"
    base_width: Optional[int] = None
    target_width: Optional[int] = None
    parametrizations: list[str] = field(default_factory=lambda: ["mup", "sp"])
    sampler: str = "grid"
    n_trials: int = 16
    seeds: list[int] = field(default_factory=lambda: [0])
    storage: str = ""
    fixed: dict[str, Any] = field(default_factory=dict)
    depths: Optional[list[int]] = None
    base_depth: Optional[int] = None
    target_depth: Optional[int] = None
    config_dir: Optional[Path] = None  # where relative paths resolve (the TOML's directory); None: cwd
    axes: dict[str, list[int]] = field(default_factory=dict)  # extra axes: HP name -> values, proxy first
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.base_width is None:
            self.base_width = min(self.widths)
        if self.depths is not None and self.base_depth is None:
            self.base_depth = min(self.depths)

    @property
    def cells(self) -> list[tuple[str, int, Optional[int]]]:
        """(parametrization, width, depth) of the width × depth grid; depth is None without `depths`.
        `all_cells` adds the cells of further batch sizes and horizons."""
        depths: list[Optional[int]] = list(self.depths) if self.depths is not None else [None]
        return [(p, w, d) for p in self.parametrizations for w in self.widths for d in depths]

    @property
    def all_cells(self) -> list[tuple[str, int, Optional[int], tuple]]:
        """(parametrization, width, depth, extra), one Optuna study each. `extra` is () for every
        width × depth cell (they run at the proxy batch size and horizon, `proxy_extra`) and
        ((axis, value),) for a further batch size or horizon, which runs at the proxy width and depth."""
        out = [(*cell, ()) for cell in self.cells]
        for axis, values in self.axes.items():
            out += [(p, min(self.widths), self.proxy_depth, ((axis, v),)) for p in self.parametrizations
                    for v in values[1:]]
        return out

    @property
    def proxy_extra(self) -> dict[str, int]:
        """The batch size and horizon every width × depth cell runs at: each extra axis's first value."""
        return {axis: values[0] for axis, values in self.axes.items()}

    @property
    def contents(self) -> dict[str, Any]:
        """The config as written, without `config_dir` (where it lives is not what it says)."""
        return {k: v for k, v in self.raw.items() if k != CONFIG_DIR_KEY}

    @property
    def proxy_depth(self) -> Optional[int]:
        """The smallest swept depth (None without `depths`): where transferred HPs come from."""
        return min(self.depths) if self.depths is not None else None


def _int_list(key: str, value, minimum: int = 0) -> list[int]:
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValueError(f"{key} must be a non-empty list of integers, got {value!r}")
    if any(v < minimum for v in value):
        raise ValueError(f"{key} must hold integers ≥ {minimum}, got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{key} has duplicates: {value!r}")
    return list(value)


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _depth_keys(data: dict[str, Any]) -> tuple[Optional[list[int]], Optional[int], Optional[int]]:
    """`depths`, `base_depth` (default: the smallest depth) and `target_depth`, validated."""
    if "depths" not in data:
        for key in ("base_depth", "target_depth"):
            if key in data:
                raise ValueError(f"{key} needs depths (the depths to sweep), e.g. depths = [2, 4, 8]")
        return None, None, None
    depths = sorted(_int_list("depths", data["depths"], 1))
    base_depth = _positive_int("base_depth", data.get("base_depth", min(depths)))
    target = data.get("target_depth")
    return depths, base_depth, None if target is None else _positive_int("target_depth", target)


def _check_depth_alpha(fixed: dict[str, Any], dims: dict[str, Dimension]) -> None:
    """The reserved `depth_alpha`, fixed or swept, must lie in [0, 1] (0.5 Depth-µP, 1 CompleteP)."""
    if "depth_alpha" in fixed:
        key, values = "fixed.depth_alpha", [fixed["depth_alpha"]]
    elif "depth_alpha" in dims:
        dim = dims["depth_alpha"]
        key, values = "space.depth_alpha", list(dim.values) if isinstance(dim, Choice) else [dim.low, dim.high]
    else:
        return
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"{key} must be a number in [0, 1] (0.5 Depth-µP, 1.0 CompleteP, 0 no depth "
                             f"scaling), got {v!r}")


def resolve_storage(url: str, base_dir: Optional[Path]) -> str:
    """An SQLite URL with a relative path made absolute against `base_dir`; other URLs unchanged."""
    prefix = "sqlite:///"
    if base_dir is None or not url.startswith(prefix) or ":memory:" in url:
        return url
    path = url[len(prefix):]
    if not path or os.path.isabs(path):
        return url
    return prefix + str((Path(base_dir) / path).resolve())


def config_from_dict(data: dict[str, Any], source: str = "config",
                     base_dir: Optional[Union[str, os.PathLike]] = None) -> SweepConfig:
    """Validate a config dict; every error names the key and `source`. Relative paths (objective
    file or module, SQLite storage) resolve against the `config_dir` key, else `base_dir`, else
    the current directory."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a sweep config must be a table")
    unknown = set(data) - KEYS
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(KEYS))}")
    try:
        for key in ("objective", "widths", "space"):
            if key not in data:
                raise ValueError(f"'{key}' is missing")
        objective = data["objective"]
        if not isinstance(objective, str) or ":" not in objective:
            raise ValueError(f"objective must be 'recipe:NAME' or 'module:function', got {objective!r}")
        widths = sorted(_int_list("widths", data["widths"], 1))
        space = data["space"]
        if not isinstance(space, dict) or not space:
            raise ValueError("space must be a table with at least one hyperparameter, e.g. [space.lr]")
        dims = {name: dimension_from_dict(name, spec) for name, spec in space.items()}
        parametrizations = data.get("parametrizations", ["mup", "sp"])
        if (not isinstance(parametrizations, list) or not parametrizations
                or any(p not in PARAMETRIZATIONS for p in parametrizations)):
            raise ValueError(f"parametrizations must be a list from {PARAMETRIZATIONS}, got {parametrizations!r}")
        sampler = data.get("sampler", "grid")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        n_trials = data.get("n_trials", 16)
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise ValueError(f"n_trials must be a positive integer, got {n_trials!r}")
        seeds = _int_list("seeds", data.get("seeds", [0]))
        base_width = _positive_int("base_width", data.get("base_width", min(widths)))
        target = data.get("target_width")
        if target is not None:
            _positive_int("target_width", target)
        depths, base_depth, target_depth = _depth_keys(data)
        axes = {hp: sorted(_int_list(key, data[key], 1)) for key, hp in EXTRA_AXES.items() if key in data}
        storage = data.get("storage", "")
        if not isinstance(storage, str):
            raise ValueError("storage must be a URL string (sqlite:///path or postgresql://...)")
        fixed = data.get("fixed", {})
        if not isinstance(fixed, dict):
            raise ValueError("fixed must be a table of hyperparameters")
        overlap = set(fixed) & set(dims)
        if overlap:
            raise ValueError(f"{', '.join(sorted(overlap))} is both swept ([space]) and fixed ([fixed])")
        _check_depth_alpha(fixed, dims)
        for key, hp in EXTRA_AXES.items():
            if hp in axes and (hp in fixed or hp in dims):
                raise ValueError(f"{hp} is swept by the top-level {key} list; remove {hp} from "
                                 f"{'[fixed]' if hp in fixed else '[space]'}")
        name = data.get("name", "sweep")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        config_dir = Path(base_dir).resolve() if base_dir is not None else None
        if CONFIG_DIR_KEY in data:
            given = data[CONFIG_DIR_KEY]
            if not isinstance(given, str) or not os.path.isabs(given):
                raise ValueError(f"config_dir must be an absolute path (the directory relative paths resolve "
                                 f"against; default: the TOML file's directory), got {given!r}")
            config_dir = Path(given)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    return SweepConfig(objective=objective, widths=widths, space=dims, name=name, base_width=base_width,
                       target_width=target, parametrizations=list(parametrizations), sampler=sampler,
                       n_trials=n_trials, seeds=seeds, storage=resolve_storage(storage, config_dir),
                       fixed=dict(fixed), depths=depths, base_depth=base_depth, target_depth=target_depth, axes=axes,
                       config_dir=config_dir, raw=dict(data))


def load_config(path: Union[str, os.PathLike]) -> SweepConfig:
    """Read and validate a TOML config; relative paths in it resolve against its directory."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the config ({e})") from None
    return config_from_dict(data, str(path), base_dir=path.parent)


def pinned_text(path: Union[str, os.PathLike], config: SweepConfig) -> str:
    """The text of the TOML at `path` as the run directory keeps it: with `config_dir` recorded at
    the top (unless the file sets it), so that the copy resolves relative paths as the original."""
    text = Path(path).read_text()
    if CONFIG_DIR_KEY in config.raw or config.config_dir is None:
        return text
    quoted = json.dumps(str(config.config_dir)).replace("\x7f", "\\u007f")  # a TOML basic string
    return (f"{CONFIG_DIR_KEY} = {quoted}  "
            "# added by mutransfer: relative paths below resolve here\n" + text)
