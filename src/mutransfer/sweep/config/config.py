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
horizons = [100, 200, 400]      # training step counts swept at the proxy width (optional; hparams["steps"])
parametrizations = ["mup", "sp"]   # and/or "u-mup" (unit-scaled µP, its cells labelled u-µP)
sampler = "grid"                # grid | random | tpe | independent (lr, then each other HP alone)
n_trials = 16                   # random/tpe: trials per (parametrization, width[, depth])
seeds = [0]                     # every trial trains once per seed; the loss is the mean
storage = ""                    # default: sqlite file in the run directory; or postgresql://...
pruner = "none"                 # none | median | successive_halving | hyperband (see Pruning)
devices = "auto"                # auto | cpu | [0, 1, 2, 3]: GPUs the trials run on (see `placement`)
trials_per_device = 1           # worker processes per GPU (several small proxies may share one)
threads = 2                     # torch threads per worker (default: the cores split between workers)
precision = "fp32"              # fp32 | bf16 (autocast; the objective reads scale.precision)

[cluster]                       # optional: run the workers as a Slurm job array (see `cluster`)
backend = "slurm"               # slurm | local
jobs = 4
gpus_per_job = 8

[space.lr]
type = "log"                    # log | uniform | choice
low = "2**-12"
high = "2**-5"
grid = 8

[sp.space.lr]                   # optional: SP's own range (its optimum moves with width)
low = "2**-14"

[fixed]                         # passed to the objective unchanged
seq_len = 64                    # (not steps or batch_size here: horizons and batch_sizes sweep them)
```

The keys, their types, defaults and meanings are data in `schema` (rendered as the docs' config
reference); what each setting does in a sweep is told in docs/sweeps.md. Relative paths resolve
against the TOML file's directory, recorded as ``config_dir`` at the top of the run directory's
copy of the config (`pinned_text`), so that a resumed run resolves them as the first did.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...rules import parametrization_name
from ._checks import (
    BACKENDS,
    CLUSTER_KEYS,
    PRUNERS,
    at_least_the_proxy,
    base_width_warnings,
    cluster_config,
    cluster_keys,
    depth_alpha_in_range,
    depth_keys,
    finite_fixed,
    grid_size,
    int_list,
    placement_keys,
    positive_int,
    pruner_keys,
    seeds,
    sweep_name,
)
from .cells import Cell
from .schema import AUTO, DEPRECATED_KEYS, PRUNER_OPTIONS, TOP_LEVEL, ClusterConfig
from .space import Dimension, dimension_from_dict
from .urls import PASSWORD_ENV, without_password

if TYPE_CHECKING:
    from collections.abc import Iterable

    import optuna

__all__ = [
    "AUTO",
    "BACKENDS",
    "CLUSTER_KEYS",
    "CONFIG_DIR_KEY",
    "EXTRA_AXES",
    "KEYS",
    "PARAMETRIZATIONS",
    "PRUNERS",
    "PRUNER_OPTIONS",
    "SAMPLERS",
    "TRANSFERRING",
    "ClusterConfig",
    "SweepConfig",
    "cluster_config",
    "config_from_dict",
    "load_config",
    "pinned_text",
    "resolve_storage",
    "short_label",
    "transferred_parametrization",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SAMPLERS = ("grid", "random", "tpe", "independent")
PARAMETRIZATIONS = ("mup", "u-mup", "sp")
# The width-transferring parametrizations, in precedence order: the first one a sweep runs is *the transferred
# parametrization* (`transferred_parametrization`), whose proxy optimum the sweep records (its monitor trajectory,
# RUN/proxy_trajectory.json, the noise scale), forecasts and costs, and whose target `mutransfer transfer` watches.
TRANSFERRING = ("mup", "u-mup")
SHORT_LABELS = {"mup": "µP", "u-mup": "u-µP", "sp": "SP"}
# config key -> the hyperparameter it sets
EXTRA_AXES = {"batch_sizes": "batch_size", "horizons": "steps"}
KEYS = {key.name for key in TOP_LEVEL} | set(DEPRECATED_KEYS)
CONFIG_DIR_KEY = "config_dir"


@dataclass
class SweepConfig:
    """A validated sweep config (see `schema` for every key); made by `load_config` or `config_from_dict`.

    The derived values the engine, the report and the transfer read are properties computed once:
    `proxy_width`, `proxy_depth`, `proxy_extra`, `cells` and `all_cells` (the studies, as `Cell`).
    Treat a config as read-only once made.
    """

    objective: str
    widths: list[int]
    space: dict[str, Dimension]
    name: str = "sweep"
    base_width: int | None = None  # None: the smallest width (set in __post_init__)
    target_width: int | None = None
    parametrizations: list[str] = field(default_factory=lambda: ["mup", "sp"])
    sampler: str = "grid"
    n_trials: int = 16
    seeds: list[int] = field(default_factory=lambda: [0])
    storage: str = ""
    fixed: dict[str, Any] = field(default_factory=dict)
    depths: list[int] | None = None
    base_depth: int | None = None
    target_depth: int | None = None
    config_dir: Path | None = None  # where relative paths resolve (the TOML's directory); None: cwd
    axes: dict[str, list[int]] = field(default_factory=dict)  # extra axes: HP name -> values, proxy first
    pruner: str = "none"
    pruner_options: dict[str, Any] = field(default_factory=dict)  # given ones; defaults in PRUNER_OPTIONS
    devices: Any = None  # "auto" | "cpu" | list of GPU ids; None: not set (auto, but --workers alone means CPU)
    trials_per_device: int | None = None
    threads: int | None = None
    precision: str = "fp32"
    cluster: ClusterConfig | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    space_overrides: dict[str, dict[str, Dimension]] = field(default_factory=dict)  # [mup.space.*], [sp.space.*]

    def __post_init__(self) -> None:
        if self.base_width is None:
            self.base_width = min(self.widths)
        if self.depths is not None and self.base_depth is None:
            self.base_depth = min(self.depths)

    def space_for(self, parametrization: str) -> dict[str, Dimension]:
        """The search space of `parametrization`'s studies: `space` with its own ``[mup.space.*]`` or
        ``[sp.space.*]`` ranges in place (the same hyperparameters, in the same order).

        Args:
            parametrization: "mup", "u-mup" or "sp".

        Returns:
            Hyperparameter name -> `Dimension`.
        """
        own = self.space_overrides.get(parametrization, {})
        return {name: own.get(name, dim) for name, dim in self.space.items()}

    @cached_property
    def transferred(self) -> str | None:
        """The parametrization whose proxy optimum transfers (`transferred_parametrization`): "mup", else "u-mup",
        else None."""
        return transferred_parametrization(self.parametrizations)

    @cached_property
    def proxy_width(self) -> int:
        """The smallest swept width: the proxy whose best hyperparameters transfer."""
        return min(self.widths)

    @cached_property
    def proxy_depth(self) -> int | None:
        """The smallest swept depth (None without `depths`): where transferred HPs come from."""
        return min(self.depths) if self.depths is not None else None

    @cached_property
    def cells(self) -> list[tuple[str, int, int | None]]:
        """(parametrization, width, depth) of the width × depth grid; depth is None without `depths`.
        `all_cells` adds the cells of further batch sizes and horizons."""
        depths: list[int | None] = list(self.depths) if self.depths is not None else [None]
        return [(p, w, d) for p in self.parametrizations for w in self.widths for d in depths]

    @cached_property
    def all_cells(self) -> list[Cell]:
        """Every study of the sweep, as `Cell` (parametrization, width, depth, extra). `extra` is ()
        for every width × depth cell (they run at the proxy batch size and horizon, `proxy_extra`)
        and ((axis, value),) for a further batch size or horizon, which runs at the proxy width and depth."""
        out = [Cell(*cell) for cell in self.cells]
        for axis, values in self.axes.items():
            out += [
                Cell(p, self.proxy_width, self.proxy_depth, ((axis, v),))
                for p in self.parametrizations
                for v in values[1:]
            ]
        return out

    @cached_property
    def proxy_extra(self) -> dict[str, int]:
        """The batch size and horizon every width × depth cell runs at: each extra axis's first value."""
        return {axis: values[0] for axis, values in self.axes.items()}

    def proxy_cell(self, parametrization: str, extra: tuple[tuple[str, int], ...] = ()) -> Cell:
        """The cell at the proxy width and depth.

        Args:
            parametrization: "mup", "u-mup" or "sp".
            extra: ``()``, or ``((axis, value),)`` for a further batch size or horizon.

        Returns:
            The `Cell` whose study the transferred hyperparameters come from.
        """
        return Cell(parametrization, self.proxy_width, self.proxy_depth, tuple(extra))

    @property
    def contents(self) -> dict[str, Any]:
        """The config as written, without `config_dir` (where it lives is not what it says) and
        without the storage URL's password (the run directory never keeps it: `pinned_text`)."""
        out = {k: v for k, v in self.raw.items() if k != CONFIG_DIR_KEY}
        if isinstance(out.get("storage"), str):
            out["storage"] = without_password(out["storage"])
        return out

    def optuna_pruner(self) -> optuna.pruners.BasePruner | None:
        """The Optuna pruner each study gets.

        Returns:
            A MedianPruner, SuccessiveHalvingPruner or HyperbandPruner with the config's options;
            None for ``pruner = "none"``.
        """
        if self.pruner == "none":
            return None
        import optuna

        kw = {**PRUNER_OPTIONS[self.pruner], **self.pruner_options}
        if self.pruner == "median":
            return optuna.pruners.MedianPruner(**kw)
        if self.pruner == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(**kw)
        return optuna.pruners.HyperbandPruner(**kw)


def transferred_parametrization(parametrizations: Iterable[str]) -> str | None:
    """The parametrization whose proxy optimum a sweep transfers: "mup" when swept, else "u-mup" when swept, else
    None (an SP-only sweep transfers nothing). The one rule every "the µP proxy" of the sweep engine reads.

    Args:
        parametrizations: a config's `parametrizations` (or any collection of names: a transfer.json's keys).

    Returns:
        The first of `TRANSFERRING` among them, or None.
    """
    names = set(parametrizations)
    return next((p for p in TRANSFERRING if p in names), None)


def short_label(parametrization: str) -> str:
    """ "µP", "u-µP" or "SP": a parametrization's name in a sentence (the name itself when unknown)."""
    return SHORT_LABELS.get(parametrization, parametrization)


def resolve_storage(url: str, base_dir: Path | None) -> str:
    """An SQLite URL with a relative path made absolute against `base_dir`; other URLs unchanged."""
    prefix = "sqlite:///"
    if base_dir is None or not url.startswith(prefix) or ":memory:" in url:
        return url
    path = url[len(prefix) :]
    if not path or os.path.isabs(path):
        return url
    return prefix + str((Path(base_dir) / path).resolve())


def config_from_dict(
    data: dict[str, Any], source: str = "config", base_dir: str | os.PathLike | None = None
) -> SweepConfig:
    """Validate a config dict (the keys of `schema.TOP_LEVEL`).

    Args:
        data: the config, as a TOML file would give it.
        source: what to name in error messages (the file's path for `load_config`).
        base_dir: where relative paths (objective file or module, SQLite storage) resolve when
            `data` has no ``config_dir``; default the current directory.

    Returns:
        The validated config.

    Raises:
        ConfigError: (a ValueError) naming `source`, the key at fault and the fix.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a sweep config must be a table")
    unknown = set(data) - KEYS
    if unknown:
        allowed = ", ".join(sorted(KEYS - set(DEPRECATED_KEYS)))
        raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {allowed}")
    raw = dict(data)
    data = _renamed_keys(data, source)
    try:
        for key in ("objective", "widths", "space"):
            if key not in data:
                raise ConfigError(f"'{key}' is missing")
        objective = data["objective"]
        if not isinstance(objective, str) or ":" not in objective:
            raise ConfigError(f"objective must be 'recipe:NAME' or 'module:function', got {objective!r}")
        widths = sorted(int_list("widths", data["widths"], 1))
        space = data["space"]
        if not isinstance(space, dict) or not space:
            raise ConfigError("space must be a table with at least one hyperparameter, e.g. [space.lr]")
        dims = {name: dimension_from_dict(name, spec) for name, spec in space.items()}
        parametrizations = _parametrizations(data.get("parametrizations", ["mup", "sp"]))
        overrides = _space_overrides(data, space, dims, parametrizations)
        if data.get("sampler", "grid") == "grid":
            grid_size(dims)
            for own in overrides.values():
                grid_size({**dims, **own})
        sampler = data.get("sampler", "grid")
        if sampler not in SAMPLERS:
            raise ConfigError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        if sampler == "independent" and "lr" not in dims:
            raise ConfigError(
                f'sampler "independent" sweeps lr first, then each other hyperparameter: add a [space.lr] table '
                f"(swept now: {', '.join(dims)}), or use another sampler"
            )
        n_trials = data.get("n_trials", 16)
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise ConfigError(f"n_trials must be a positive integer, got {n_trials!r}")
        seed_list = seeds(data.get("seeds", [0]))
        base_width = positive_int("base_width", data.get("base_width", min(widths)))
        target = data.get("target_width")
        if target is not None:
            at_least_the_proxy("target_width", positive_int("target_width", target), "widths", widths)
        base_width_warnings(base_width, widths, target)
        depths, base_depth, target_depth = depth_keys(data)
        if target_depth is not None and depths is not None:
            at_least_the_proxy("target_depth", target_depth, "depths", depths)
        axes = {hp: sorted(int_list(key, data[key], 1)) for key, hp in EXTRA_AXES.items() if key in data}
        storage = data.get("storage", "")
        if not isinstance(storage, str):
            raise ConfigError("storage must be a URL string (sqlite:///path or postgresql://...)")
        fixed = data.get("fixed", {})
        if not isinstance(fixed, dict):
            raise ConfigError("fixed must be a table of hyperparameters")
        finite_fixed(fixed)
        overlap = set(fixed) & set(dims)
        if overlap:
            raise ConfigError(f"{', '.join(sorted(overlap))} is both swept ([space]) and fixed ([fixed])")
        depth_alpha_in_range(fixed, dims)
        if "parametrization" in fixed and "u-mup" in parametrizations:
            raise ConfigError(
                f"[fixed] parametrization = {fixed['parametrization']!r} and parametrizations holding 'u-mup' both say "
                "which parametrization a cell trains; remove [fixed] parametrization (each cell's comes from "
                "parametrizations)"
            )
        for key, hp in EXTRA_AXES.items():
            if hp in axes and (hp in fixed or hp in dims):
                raise ConfigError(
                    f"{hp} is swept by the top-level {key} list; remove {hp} from "
                    f"{'[fixed]' if hp in fixed else '[space]'}"
                )
        pruner, pruner_options = pruner_keys(data)
        devices, trials_per_device, threads, precision = placement_keys(data)
        cluster = cluster_keys(data)
        name = sweep_name(data.get("name", "sweep"))
        config_dir = Path(base_dir).resolve() if base_dir is not None else None
        if CONFIG_DIR_KEY in data:
            given = data[CONFIG_DIR_KEY]
            if not isinstance(given, str) or not os.path.isabs(given):
                raise ConfigError(
                    f"config_dir must be an absolute path (the directory relative paths resolve "
                    f"against; default: the TOML file's directory), got {given!r}"
                )
            config_dir = Path(given)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    return SweepConfig(
        objective=objective,
        widths=widths,
        space=dims,
        name=name,
        base_width=base_width,
        target_width=target,
        parametrizations=list(parametrizations),
        sampler=sampler,
        n_trials=n_trials,
        seeds=seed_list,
        storage=resolve_storage(storage, config_dir),
        fixed=dict(fixed),
        depths=depths,
        base_depth=base_depth,
        target_depth=target_depth,
        axes=axes,
        config_dir=config_dir,
        pruner=pruner,
        pruner_options=pruner_options,
        devices=devices,
        trials_per_device=trials_per_device,
        threads=threads,
        precision=precision,
        cluster=cluster,
        raw=raw,
        space_overrides=overrides,
    )


def _parametrizations(value: Any) -> list[str]:
    """The config's ``parametrizations``, checked: a non-empty list from `PARAMETRIZATIONS`, u-µP's aliases
    ("umup", "u-µP", "u_mup") read as "u-mup", no name twice."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"parametrizations must be a non-empty list from {PARAMETRIZATIONS}, got {value!r}")
    out: list[str] = []
    for p in value:
        name = p
        if isinstance(p, str) and p not in PARAMETRIZATIONS:
            try:
                name = parametrization_name(p)
            except ValueError:
                name = p
        if name not in PARAMETRIZATIONS:
            raise ConfigError(
                f"parametrizations: unknown {p!r}; use names from {PARAMETRIZATIONS} ('mup': µP, 'u-mup': unit-scaled "
                "µP, 'sp': the plain model)"
            )
        if name in out:
            raise ConfigError(f"parametrizations lists {name!r} twice; give each once")
        out.append(name)
    return out


def _space_overrides(
    data: dict[str, Any], space: dict[str, Any], dims: dict[str, Dimension], parametrizations: list[str]
) -> dict[str, dict[str, Dimension]]:
    """The ``[mup.space.*]`` / ``[sp.space.*]`` tables: per parametrization, the dimensions whose keys
    they replace (each merged over its ``[space.*]`` table, of the same type)."""
    out: dict[str, dict[str, Dimension]] = {}
    for p in PARAMETRIZATIONS:
        if p not in data:
            continue
        table = data[p]
        if not isinstance(table, dict) or set(table) != {"space"} or not isinstance(table["space"], dict):
            raise ConfigError(f"[{p}] holds only a [{p}.space] table of ranges, e.g. [{p}.space.lr] with low = ...")
        if p not in parametrizations:
            raise ConfigError(f"[{p}.space] is given but parametrizations has no {p!r}; remove it or add {p!r}")
        own: dict[str, Dimension] = {}
        for name, spec in table["space"].items():
            if name not in dims:
                raise ConfigError(
                    f"{p}.space.{name}: {name} is not swept in [space]; a [{p}.space] table changes the range "
                    f"of a swept hyperparameter ({', '.join(dims)}), it adds none"
                )
            if not isinstance(spec, dict):
                raise ConfigError(f"{p}.space.{name} must be a table of [space.{name}]'s keys (low, high, grid, ...)")
            if space[name].get("type") == "choice":
                raise ConfigError(
                    f"{p}.space.{name}: {name} is a choice, whose values are the same for every parametrization; "
                    f"remove [{p}.space.{name}]"
                )
            if spec.get("type", space[name].get("type", "log")) != space[name].get("type", "log"):
                raise ConfigError(f"{p}.space.{name}.type must be [space.{name}]'s type; give only its range")
            try:
                own[name] = dimension_from_dict(name, {**space[name], **spec})
            except ConfigError as e:
                raise ConfigError(f"[{p}.space.{name}] merged over [space.{name}]: {e}") from None
        out[p] = own
    return out


def _renamed_keys(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` with each renamed key (`schema.DEPRECATED_KEYS`) under its new name, warning once per key."""
    out = dict(data)
    for old, new in DEPRECATED_KEYS.items():
        if old not in data:
            continue
        if new in data:
            raise ConfigError(f"{source}: {old} and {new} are the same setting ({old} is its old name); keep {new}")
        warnings.warn(
            f"{source}: the config key {old!r} was renamed {new!r}; {old!r} will stop working in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        out[new] = out.pop(old)
    return out


def load_config(path: str | os.PathLike) -> SweepConfig:
    """Read and validate a TOML config; relative paths in it resolve against its directory.

    Args:
        path: the TOML file.

    Returns:
        The validated config.

    Raises:
        ConfigError: (a ValueError) for a missing or unreadable file, bad TOML, or a bad key
            (see `config_from_dict`).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config ({e})") from None
    return config_from_dict(data, str(path), base_dir=path.parent)


def pinned_text(path: str | os.PathLike, config: SweepConfig) -> str:
    """The text of the TOML at `path` as the run directory keeps it: with `config_dir` recorded at
    the top (unless the file sets it), so that the copy resolves relative paths as the original,
    and without the storage URL's password (read at run time from the environment or ~/.pgpass)."""
    text = _without_storage_password(Path(path).read_text(), config, str(path))
    if CONFIG_DIR_KEY in config.raw or config.config_dir is None:
        return text
    quoted = json.dumps(str(config.config_dir)).replace("\x7f", "\\u007f")  # a TOML basic string
    return f"{CONFIG_DIR_KEY} = {quoted}  # added by mutransfer: relative paths below resolve here\n" + text


def _without_storage_password(text: str, config: SweepConfig, source: str) -> str:
    """`text` with the `storage` string's password removed, as written (a basic or literal string)."""
    storage = config.raw.get("storage")
    if not isinstance(storage, str) or without_password(storage) == storage:
        return text
    bare = json.dumps(without_password(storage), ensure_ascii=False).replace("\x7f", "\\u007f")  # TOML basic
    for written in (json.dumps(storage, ensure_ascii=False).replace("\x7f", "\\u007f"), f"'{storage}'"):
        if written in text:
            return text.replace(written, bare)
    raise ConfigError(
        f"{source}: storage holds a password written in a way mutransfer cannot remove from its copy of the "
        f"config; write the URL without the password and set {PASSWORD_ENV} (or PGPASSWORD, or ~/.pgpass)"
    )
