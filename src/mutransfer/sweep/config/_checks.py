"""Validation of the sweep config's values, key by key: each function checks one key or one table
and raises `ConfigError` naming the key and the fix. `config.config_from_dict` calls them."""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

from ..._core.devices import known_precision
from ...errors import ConfigError, MuPWarning
from ...rules import check_depth_alpha
from .placement import parse_devices
from .schema import AUTO, CLUSTER, PRUNER_OPTION_MEANINGS, PRUNER_OPTIONS, ClusterConfig
from .space import MAX_GRID, Choice, Dimension

BACKENDS = ("slurm", "local")
PRUNERS = tuple(PRUNER_OPTIONS)
# [cluster] keys with their defaults (see `cluster`); `slurm` is a table passed to submitit as slurm_*.
CLUSTER_KEYS: dict[str, Any] = {key.name: key.default for key in CLUSTER}


def int_list(key: str, value, minimum: int = 0) -> list[int]:
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ConfigError(f"{key} must be a non-empty list of integers, got {value!r}")
    if any(v < minimum for v in value):
        raise ConfigError(f"{key} must hold integers ≥ {minimum}, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{key} has duplicates: {value!r}")
    return list(value)


MAX_SEED = 2**32 - 1  # numpy's limit, and what most seeders take
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
NAME_RULE = "1 to 100 of the characters A-Z a-z 0-9 . _ - and not starting with a dot"


def sweep_name(value: Any) -> str:
    """The config's `name`, checked: it becomes the prefix of every study name, a directory name
    (`mutransfer worker NAME`) and part of every message, so a bounded, path-free character set."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        shown = (
            repr(value)
            if not isinstance(value, str) or len(value) <= 40
            else f"{value[:37]!r}... ({len(value):,} characters)"
        )
        raise ConfigError(f'name must be {NAME_RULE} (e.g. "gpt-lr"), got {shown}')
    return value


def seeds(value: Any) -> list[int]:
    """`seeds`: distinct integers in [0, 2**32)."""
    out = int_list("seeds", value)
    if any(v > MAX_SEED for v in out):
        raise ConfigError(f"seeds must hold integers from 0 to 2**32 - 1 ({MAX_SEED}), got {max(out)}")
    return out


def grid_size(dims: dict[str, Dimension]) -> None:
    """A grid sweep enqueues every point of every study up front: at most `MAX_GRID` per study."""
    size = math.prod(len(d.values) if isinstance(d, Choice) else d.grid for d in dims.values())
    if size > MAX_GRID:
        raise ConfigError(
            f"space: the grid has {size:,} points per study (the product of every [space] grid), more than "
            f'{MAX_GRID:,}; lower space.*.grid or use sampler = "random" with n_trials'
        )


def finite_fixed(fixed: dict[str, Any]) -> None:
    """No NaN in [fixed]: NaN equals nothing, not even itself, so a rerun of the same config would
    count as a different one."""
    for key, value in fixed.items():
        if isinstance(value, float) and math.isnan(value):
            raise ConfigError(f"fixed.{key} is nan, which equals no value (not even itself); give a number")


def base_width_warnings(base_width: int, widths: list[int], target: int | None) -> None:
    """µP is defined at any width relative to its base, so a base above the swept widths or the
    target is allowed; but it is rarely meant (the base is usually the proxy), so say so."""
    above = [f"widths {widths}"] if base_width > max(widths) else []
    if target is not None and base_width > target:
        above.append(f"target_width {target}")
    if above:
        warnings.warn(
            f"base_width {base_width} is above {' and '.join(above)}: µP then shrinks every model relative to a "
            "wider base (allowed, rarely meant); the base is usually the proxy, the smallest width. Set base_width "
            "to at most the smallest width, or remove it",
            MuPWarning,
            stacklevel=4,
        )


def positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def at_least_the_proxy(key: str, value: int, swept_key: str, swept: list[int]) -> None:
    """A target is where the proxy's HPs transfer to: not below the smallest swept value (the proxy)."""
    if value < min(swept):
        raise ConfigError(
            f"{key} ({value}) is below the smallest of {swept_key} ({min(swept)}), the proxy the "
            f"hyperparameters transfer from; set {key} to at least {min(swept)} (usually larger than "
            f"every one of {swept_key}), or remove it"
        )


def depth_keys(data: dict[str, Any]) -> tuple[list[int] | None, int | None, int | None]:
    """`depths`, `base_depth` (default: the smallest depth) and `target_depth`, validated."""
    if "depths" not in data:
        for key in ("base_depth", "target_depth"):
            if key in data:
                raise ConfigError(f"{key} needs depths (the depths to sweep), e.g. depths = [2, 4, 8]")
        return None, None, None
    depths = sorted(int_list("depths", data["depths"], 1))
    base_depth = positive_int("base_depth", data.get("base_depth", min(depths)))
    target = data.get("target_depth")
    return depths, base_depth, None if target is None else positive_int("target_depth", target)


def depth_alpha_in_range(fixed: dict[str, Any], dims: dict[str, Dimension]) -> None:
    """The reserved `depth_alpha`, fixed or swept, must lie in [0, 1] (0.5 Depth-µP, 1 CompleteP)."""
    if "depth_alpha" in fixed:
        key, values = "fixed.depth_alpha", [fixed["depth_alpha"]]
    elif "depth_alpha" in dims:
        dim = dims["depth_alpha"]
        key, values = "space.depth_alpha", list(dim.values) if isinstance(dim, Choice) else [dim.low, dim.high]
    else:
        return
    for v in values:
        try:
            check_depth_alpha(v, key)
        except TypeError as e:  # a config error, whatever its kind
            raise ConfigError(str(e)) from None


def pruner_keys(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`pruner` and `pruner_options`, validated: a known pruner, and only its own options."""
    pruner = data.get("pruner", "none")
    if pruner not in PRUNERS:
        raise ConfigError(
            f'pruner must be one of {", ".join(repr(p) for p in PRUNERS)} ("median" is the '
            f"recommended one), got {pruner!r}"
        )
    options = data.get("pruner_options", {})
    if not isinstance(options, dict):
        raise ConfigError(
            f"pruner_options must be a table of the pruner's settings, e.g. [pruner_options] "
            f"n_startup_trials = 3; got {options!r}"
        )
    if options and pruner == "none":
        raise ConfigError(
            'pruner_options needs a pruner: set pruner = "median" (or "successive_halving", '
            '"hyperband"), or remove pruner_options'
        )
    allowed = PRUNER_OPTIONS[pruner]
    unknown = set(options) - set(allowed)
    if unknown:
        raise ConfigError(
            f"pruner_options: unknown key(s) {', '.join(sorted(unknown))} for pruner {pruner!r}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    for key, value in options.items():
        _, minimum, auto = PRUNER_OPTION_MEANINGS[key]
        if auto and value == AUTO:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"pruner_options.{key} must be an integer ≥ {minimum}"
                + (' or "auto"' if auto else "")
                + f", got {value!r}"
            )
    if pruner == "hyperband":
        if options.get("min_resource") == AUTO:
            raise ConfigError(
                'pruner_options.min_resource must be an integer ≥ 1 for hyperband ("auto" is for successive_halving)'
            )
        lo, hi = options.get("min_resource", allowed["min_resource"]), options.get("max_resource", AUTO)
        if hi != AUTO and lo != AUTO and hi < lo:
            raise ConfigError(f"pruner_options.max_resource ({hi}) must be at least min_resource ({lo})")
    return pruner, dict(options)


def placement_keys(data: dict[str, Any]) -> tuple[Any, int | None, int | None, str]:
    """`devices`, `trials_per_device`, `threads` and `precision`, validated (the ids are checked
    against the GPUs when the sweep starts, on the machine that runs it)."""
    devices = data.get("devices")
    if devices is not None:
        if isinstance(devices, str) and devices not in ("auto", "cpu"):
            raise ConfigError(f'devices must be "auto", "cpu" or a list of GPU ids like [0, 1], got {devices!r}')
        parse_devices(devices, "devices")
    counts = []
    for key in ("trials_per_device", "threads"):
        value = data.get(key)
        if value is not None:
            positive_int(key, value)
        counts.append(value)
    precision = data.get("precision", "fp32")
    known_precision(precision)
    return devices, counts[0], counts[1], precision


def cluster_keys(data: dict[str, Any]) -> ClusterConfig | None:
    """The ``[cluster]`` table, validated; None without one."""
    table = data.get("cluster")
    return None if table is None else cluster_config(table)


def cluster_config(table: Any) -> ClusterConfig:
    """A ``[cluster]`` table (a dict, defaults in `CLUSTER_KEYS`) validated into a `ClusterConfig`;
    a ValueError naming the key otherwise."""
    if not isinstance(table, dict):
        raise ConfigError('cluster must be a table, e.g. [cluster] backend = "slurm"')
    unknown = set(table) - set(CLUSTER_KEYS)
    if unknown:
        raise ConfigError(
            f"cluster: unknown key(s) {', '.join(sorted(unknown))}; allowed: "
            f"{', '.join(sorted(CLUSTER_KEYS))} (anything else for sbatch goes in [cluster.slurm])"
        )
    got = {**CLUSTER_KEYS, **table}
    if got["backend"] not in BACKENDS:
        raise ConfigError(
            f"cluster.backend must be one of {', '.join(repr(b) for b in BACKENDS)}, got {got['backend']!r}"
        )
    for key in ("jobs", "trials_per_device", "time_min"):
        positive_int(f"cluster.{key}", got[key])
    for key in ("gpus_per_job",):
        if isinstance(got[key], bool) or not isinstance(got[key], int) or got[key] < 0:
            raise ConfigError(f"cluster.{key} must be an integer ≥ 0, got {got[key]!r}")
    if got["cpus_per_task"] is not None:
        positive_int("cluster.cpus_per_task", got["cpus_per_task"])
    mem = got["mem_gb"]
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float)) or not (0 < mem < math.inf)):
        raise ConfigError(f"cluster.mem_gb must be a finite positive number, got {mem!r}")
    for key in ("partition", "account", "qos"):
        if got[key] is not None and (not isinstance(got[key], str) or not got[key]):
            raise ConfigError(f"cluster.{key} must be a non-empty string, got {got[key]!r}")
    setup = got["setup"]
    if not isinstance(setup, list) or any(not isinstance(line, str) for line in setup):
        raise ConfigError(
            f"cluster.setup must be a list of shell lines (run before each worker, e.g. "
            f'["module load cuda"]), got {setup!r}'
        )
    slurm = got["slurm"]
    if not isinstance(slurm, dict):
        raise ConfigError(f"cluster.slurm must be a table of submitit slurm_* parameters, got {slurm!r}")
    return ClusterConfig(
        got["backend"],
        got["jobs"],
        got["gpus_per_job"],
        got["trials_per_device"],
        got["partition"],
        got["time_min"],
        None if mem is None else float(mem),
        got["cpus_per_task"],
        got["account"],
        got["qos"],
        tuple(setup),
        dict(slurm),
    )
