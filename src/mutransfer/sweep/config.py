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

[fixed]                         # passed to the objective unchanged
seq_len = 64                    # (not steps or batch_size here: the lists above sweep them)
```

`batch_sizes` and `steps` are axes like width and depth (TP5 finds HPs transfer across batch
size and training horizon empirically): the objective receives them as ``hparams["batch_size"]``
and ``hparams["steps"]``. They are not crossed with everything: every width (and depth) runs at
the first (smallest) batch size and horizon, and each further batch size or horizon runs at the
proxy width and depth only, one study each. The report gives drift and regret along each axis.
Pruning (multi-fidelity): with a `pruner`, a trial whose objective calls
``scale.report(step, loss)`` during training (the built-in recipes do, every tenth of their
steps) is stopped early when its loss so far is worse than the trials already finished in its
study (one per parametrization × width [× depth]) at the same step. A pruned trial counts as
finished and as worse than every completed one (like a diverged one); it is never retried.
Only the first seed's run reports (see `objective`), so a pruned trial trains no further seed.
The pruner's knobs go in an optional ``[pruner_options]`` table (steps are the objective's own
training steps, as passed to `scale.report`):

- ``"median"`` (recommended; Optuna's MedianPruner): prune when the loss at a step is worse than
  the median of the finished trials' losses at that step. ``n_startup_trials = 2`` (trials that
  finish in a study before it prunes: with the centre-out grid, the two middle points),
  ``n_warmup_steps = 0`` (no pruning before this step), ``interval_steps = 1``. Measured on the
  demo's GPT sweep (benchmarks/sweep_pruning.py, 2 seeds, 2 workers): 2.2× less CPU time than no
  pruner, the same best grid lr in all 8 cells (3 startup trials: 1.8×, also the same). A
  trial that is slower early but best at the end (a low lr) can be pruned when it is not one of
  the startup trials: raise ``n_warmup_steps`` (e.g. to half the steps) if the optimum may lie
  far below the middle of the range.
- ``"successive_halving"`` (SuccessiveHalvingPruner): at rungs of ``min_resource`` ×
  ``reduction_factor``^k steps, keep the best 1/``reduction_factor`` trials. ``min_resource =
  "auto"`` (or a step count ≥ 1), ``reduction_factor = 4`` (≥ 2), ``min_early_stopping_rate = 0``.
- ``"hyperband"`` (HyperbandPruner): successive halving in several brackets. ``min_resource =
  1``, ``max_resource = "auto"`` (or the objective's step count), ``reduction_factor = 3``.

With a pruner, each study's grid is enqueued centre first, then outwards (points sorted by their
distance from the middle of the grid, in grid steps, the lower side first on ties): a pruner
compares a trial with those already finished, and the middle of a well-chosen range is the
likeliest place for good references, so the clearly bad ends come last and are pruned early.
Without a pruner the grid runs in ascending order, as always.

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
from typing import TYPE_CHECKING, Any

from .._core.devices import known_precision
from ..errors import ConfigError
from ..rules import check_depth_alpha
from .placement import parse_devices

if TYPE_CHECKING:
    import optuna
from .space import Choice, Dimension, dimension_from_dict

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
    "ClusterConfig",
    "SweepConfig",
    "cluster_config",
    "config_from_dict",
    "load_config",
    "pinned_text",
    "resolve_storage",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SAMPLERS = ("grid", "random", "tpe")
PARAMETRIZATIONS = ("mup", "sp")
PRUNERS = ("none", "median", "successive_halving", "hyperband")
AUTO = "auto"
# Every option of each pruner with its default; (minimum, allows "auto") validates it.
PRUNER_OPTIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "median": {"n_startup_trials": 2, "n_warmup_steps": 0, "interval_steps": 1},
    "successive_halving": {"min_resource": AUTO, "reduction_factor": 4, "min_early_stopping_rate": 0},
    "hyperband": {"min_resource": 1, "max_resource": AUTO, "reduction_factor": 3},
}
_OPTION_RULES = {
    "n_startup_trials": (0, False),
    "n_warmup_steps": (0, False),
    "interval_steps": (1, False),
    "min_resource": (1, True),
    "max_resource": (1, True),
    "reduction_factor": (2, False),
    "min_early_stopping_rate": (0, False),
}
EXTRA_AXES = {"batch_sizes": "batch_size", "steps": "steps"}  # config key -> the hyperparameter it sets
KEYS = {
    *EXTRA_AXES,
    "name",
    "objective",
    "widths",
    "base_width",
    "target_width",
    "depths",
    "base_depth",
    "target_depth",
    "parametrizations",
    "sampler",
    "n_trials",
    "seeds",
    "storage",
    "space",
    "fixed",
    "config_dir",
    "pruner",
    "pruner_options",
    "devices",
    "trials_per_device",
    "threads",
    "precision",
    "cluster",
}
CONFIG_DIR_KEY = "config_dir"
BACKENDS = ("slurm", "local")
# [cluster] keys with their defaults (see `cluster`); `slurm` is a table passed to submitit as slurm_*.
CLUSTER_KEYS: dict[str, Any] = {
    "backend": "slurm",
    "jobs": 1,
    "gpus_per_job": 0,
    "trials_per_device": 1,
    "partition": None,
    "time_min": 60,
    "mem_gb": None,
    "cpus_per_task": None,
    "account": None,
    "qos": None,
    "setup": [],
    "slurm": {},
}


@dataclass(frozen=True)
class ClusterConfig:
    """The ``[cluster]`` table: workers submitted as a job array through submitit (see `cluster`)."""

    backend: str = "slurm"
    jobs: int = 1
    gpus_per_job: int = 0
    trials_per_device: int = 1
    partition: str | None = None
    time_min: int = 60
    mem_gb: float | None = None
    cpus_per_task: int | None = None
    account: str | None = None
    qos: str | None = None
    setup: tuple[str, ...] = ()
    slurm: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepConfig:
    objective: str
    widths: list[int]
    space: dict[str, Dimension]
    name: str = "sweep"
    base_width: int | None = None
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

    def __post_init__(self) -> None:
        if self.base_width is None:
            self.base_width = min(self.widths)
        if self.depths is not None and self.base_depth is None:
            self.base_depth = min(self.depths)

    @property
    def cells(self) -> list[tuple[str, int, int | None]]:
        """(parametrization, width, depth) of the width × depth grid; depth is None without `depths`.
        `all_cells` adds the cells of further batch sizes and horizons."""
        depths: list[int | None] = list(self.depths) if self.depths is not None else [None]
        return [(p, w, d) for p in self.parametrizations for w in self.widths for d in depths]

    @property
    def all_cells(self) -> list[tuple[str, int, int | None, tuple]]:
        """(parametrization, width, depth, extra), one Optuna study each. `extra` is () for every
        width × depth cell (they run at the proxy batch size and horizon, `proxy_extra`) and
        ((axis, value),) for a further batch size or horizon, which runs at the proxy width and depth."""
        out = [(*cell, ()) for cell in self.cells]
        for axis, values in self.axes.items():
            out += [
                (p, min(self.widths), self.proxy_depth, ((axis, v),)) for p in self.parametrizations for v in values[1:]
            ]
        return out

    @property
    def proxy_extra(self) -> dict[str, int]:
        """The batch size and horizon every width × depth cell runs at: each extra axis's first value."""
        return {axis: values[0] for axis, values in self.axes.items()}

    @property
    def contents(self) -> dict[str, Any]:
        """The config as written, without `config_dir` (where it lives is not what it says)."""
        return {k: v for k, v in self.raw.items() if k != CONFIG_DIR_KEY}

    def optuna_pruner(self) -> optuna.pruners.BasePruner | None:
        """The Optuna pruner each study gets (None for ``pruner = "none"``)."""
        if self.pruner == "none":
            return None
        import optuna

        kw = {**PRUNER_OPTIONS[self.pruner], **self.pruner_options}
        if self.pruner == "median":
            return optuna.pruners.MedianPruner(**kw)
        if self.pruner == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(**kw)
        return optuna.pruners.HyperbandPruner(**kw)

    @property
    def proxy_depth(self) -> int | None:
        """The smallest swept depth (None without `depths`): where transferred HPs come from."""
        return min(self.depths) if self.depths is not None else None


def _int_list(key: str, value, minimum: int = 0) -> list[int]:
    if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ConfigError(f"{key} must be a non-empty list of integers, got {value!r}")
    if any(v < minimum for v in value):
        raise ConfigError(f"{key} must hold integers ≥ {minimum}, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{key} has duplicates: {value!r}")
    return list(value)


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def _at_least_the_proxy(key: str, value: int, swept_key: str, swept: list[int]) -> None:
    """A target is where the proxy's HPs transfer to: not below the smallest swept value (the proxy)."""
    if value < min(swept):
        raise ConfigError(
            f"{key} ({value}) is below the smallest of {swept_key} ({min(swept)}), the proxy the "
            f"hyperparameters transfer from; set {key} to at least {min(swept)} (usually larger than "
            f"every one of {swept_key}), or remove it"
        )


def _depth_keys(data: dict[str, Any]) -> tuple[list[int] | None, int | None, int | None]:
    """`depths`, `base_depth` (default: the smallest depth) and `target_depth`, validated."""
    if "depths" not in data:
        for key in ("base_depth", "target_depth"):
            if key in data:
                raise ConfigError(f"{key} needs depths (the depths to sweep), e.g. depths = [2, 4, 8]")
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
        try:
            check_depth_alpha(v, key)
        except TypeError as e:  # a config error, whatever its kind
            raise ConfigError(str(e)) from None


def _pruner_keys(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
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
        minimum, auto = _OPTION_RULES[key]
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


def _placement_keys(data: dict[str, Any]) -> tuple[Any, int | None, int | None, str]:
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
            _positive_int(key, value)
        counts.append(value)
    precision = data.get("precision", "fp32")
    known_precision(precision)
    return devices, counts[0], counts[1], precision


def _cluster_keys(data: dict[str, Any]) -> ClusterConfig | None:
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
        _positive_int(f"cluster.{key}", got[key])
    for key in ("gpus_per_job",):
        if isinstance(got[key], bool) or not isinstance(got[key], int) or got[key] < 0:
            raise ConfigError(f"cluster.{key} must be an integer ≥ 0, got {got[key]!r}")
    if got["cpus_per_task"] is not None:
        _positive_int("cluster.cpus_per_task", got["cpus_per_task"])
    mem = got["mem_gb"]
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0):
        raise ConfigError(f"cluster.mem_gb must be a positive number, got {mem!r}")
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
    """Validate a config dict; every error names the key and `source`. Relative paths (objective
    file or module, SQLite storage) resolve against the `config_dir` key, else `base_dir`, else
    the current directory."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a sweep config must be a table")
    unknown = set(data) - KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(KEYS))}")
    try:
        for key in ("objective", "widths", "space"):
            if key not in data:
                raise ConfigError(f"'{key}' is missing")
        objective = data["objective"]
        if not isinstance(objective, str) or ":" not in objective:
            raise ConfigError(f"objective must be 'recipe:NAME' or 'module:function', got {objective!r}")
        widths = sorted(_int_list("widths", data["widths"], 1))
        space = data["space"]
        if not isinstance(space, dict) or not space:
            raise ConfigError("space must be a table with at least one hyperparameter, e.g. [space.lr]")
        dims = {name: dimension_from_dict(name, spec) for name, spec in space.items()}
        parametrizations = data.get("parametrizations", ["mup", "sp"])
        if (
            not isinstance(parametrizations, list)
            or not parametrizations
            or any(p not in PARAMETRIZATIONS for p in parametrizations)
        ):
            raise ConfigError(f"parametrizations must be a list from {PARAMETRIZATIONS}, got {parametrizations!r}")
        sampler = data.get("sampler", "grid")
        if sampler not in SAMPLERS:
            raise ConfigError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        n_trials = data.get("n_trials", 16)
        if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
            raise ConfigError(f"n_trials must be a positive integer, got {n_trials!r}")
        seeds = _int_list("seeds", data.get("seeds", [0]))
        base_width = _positive_int("base_width", data.get("base_width", min(widths)))
        target = data.get("target_width")
        if target is not None:
            _at_least_the_proxy("target_width", _positive_int("target_width", target), "widths", widths)
        depths, base_depth, target_depth = _depth_keys(data)
        if target_depth is not None:
            _at_least_the_proxy("target_depth", target_depth, "depths", depths)
        axes = {hp: sorted(_int_list(key, data[key], 1)) for key, hp in EXTRA_AXES.items() if key in data}
        storage = data.get("storage", "")
        if not isinstance(storage, str):
            raise ConfigError("storage must be a URL string (sqlite:///path or postgresql://...)")
        fixed = data.get("fixed", {})
        if not isinstance(fixed, dict):
            raise ConfigError("fixed must be a table of hyperparameters")
        overlap = set(fixed) & set(dims)
        if overlap:
            raise ConfigError(f"{', '.join(sorted(overlap))} is both swept ([space]) and fixed ([fixed])")
        _check_depth_alpha(fixed, dims)
        for key, hp in EXTRA_AXES.items():
            if hp in axes and (hp in fixed or hp in dims):
                raise ConfigError(
                    f"{hp} is swept by the top-level {key} list; remove {hp} from "
                    f"{'[fixed]' if hp in fixed else '[space]'}"
                )
        pruner, pruner_options = _pruner_keys(data)
        devices, trials_per_device, threads, precision = _placement_keys(data)
        cluster = _cluster_keys(data)
        name = data.get("name", "sweep")
        if not isinstance(name, str) or not name:
            raise ConfigError("name must be a non-empty string")
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
        seeds=seeds,
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
        raw=dict(data),
    )


def load_config(path: str | os.PathLike) -> SweepConfig:
    """Read and validate a TOML config; relative paths in it resolve against its directory."""
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
    the top (unless the file sets it), so that the copy resolves relative paths as the original."""
    text = Path(path).read_text()
    if CONFIG_DIR_KEY in config.raw or config.config_dir is None:
        return text
    quoted = json.dumps(str(config.config_dir)).replace("\x7f", "\\u007f")  # a TOML basic string
    return f"{CONFIG_DIR_KEY} = {quoted}  # added by mutransfer: relative paths below resolve here\n" + text
