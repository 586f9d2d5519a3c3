"""The sweep config's schema as data: every key, its type, default and meaning, in one place.

`config` validates against it (the accepted keys are these), and the documentation's config
reference is rendered from it (`reference_markdown`, called by the site's mkdocs hook), so a key
cannot be added without its documentation. This module imports nothing heavy (no torch, no Optuna).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AUTO",
    "CLUSTER",
    "DEPRECATED_KEYS",
    "PRUNER_OPTIONS",
    "PRUNER_OPTION_MEANINGS",
    "REQUIRED",
    "SPACE",
    "TOP_LEVEL",
    "ClusterConfig",
    "Key",
    "reference_markdown",
]

AUTO = "auto"
REQUIRED = object()  # the default of a key that must be given


@dataclass(frozen=True)
class Key:
    """One key of the config.

    Attributes:
        name: the key as written in the TOML (or the dict given to `config_from_dict`).
        type: its TOML type, as the reference shows it ("list of integers", "table", ...).
        default: its value when absent: a value, `REQUIRED`, or a sentence for a default computed
            from other keys (`default_text`).
        meaning: what it does, one or two sentences (Markdown).
        default_text: the default as the reference shows it, when it is not a plain value.
    """

    name: str
    type: str
    default: Any
    meaning: str
    default_text: str | None = None

    @property
    def required(self) -> bool:
        """Must the key be given?"""
        return self.default is REQUIRED

    def shown_default(self) -> str:
        """The default as the reference shows it: `required`, the sentence, or the value in TOML."""
        if self.required:
            return "**required**"
        if self.default_text is not None:
            return self.default_text
        return "—" if self.default is None else f"`{_toml(self.default)}`"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


TOP_LEVEL: tuple[Key, ...] = (
    Key(
        "name",
        "string",
        "sweep",
        "The sweep's name: 1 to 100 of the characters `A-Z a-z 0-9 . _ -`, not starting with a dot. Its Optuna studies "
        "are stored as `NAME/mup/w32`, …; a worker on another machine joins by it (looked up exactly).",
    ),
    Key(
        "objective",
        "string",
        REQUIRED,
        'What trains one trial: `"recipe:gpt"`, `"recipe:mlp"`, `"recipe:resmlp"` (built in), `"module:function"` or '
        '`"path/to/file.py:function"` (relative to the TOML file). It is called as `train(hparams, scale)` and returns the training loss.',
    ),
    Key(
        "widths",
        "list of integers ≥ 1",
        REQUIRED,
        "The proxy widths swept. The smallest is the proxy the hyperparameters transfer from.",
    ),
    Key(
        "base_width",
        "integer ≥ 1",
        None,
        "µP's base width: at this width the µP model equals the plain one.",
        "the smallest of `widths`",
    ),
    Key(
        "target_width",
        "integer",
        None,
        "The width `mutransfer transfer` trains at; at least the smallest of `widths`.",
        "the largest of `widths`",
    ),
    Key(
        "depths",
        "list of integers ≥ 1",
        None,
        "Proxy depths swept (residual blocks; the objective reads `scale.depth`). Absent: no depth axis.",
    ),
    Key("base_depth", "integer ≥ 1", None, "µP's base depth (needs `depths`).", "the smallest of `depths`"),
    Key(
        "target_depth",
        "integer",
        None,
        "The depth `mutransfer transfer` trains at (needs `depths`); at least the smallest of `depths`.",
    ),
    Key(
        "batch_sizes",
        "list of integers ≥ 1",
        None,
        'Batch sizes swept at the proxy width and depth, one study each (the objective reads `hparams["batch_size"]`). '
        "Every width and depth runs at the smallest.",
    ),
    Key(
        "horizons",
        "list of integers ≥ 1",
        None,
        'Training horizons (step counts) swept at the proxy width and depth, one study each (the objective reads `hparams["steps"]`). '
        "Every width and depth runs at the smallest. Was called `steps` (still read, with a warning).",
    ),
    Key(
        "parametrizations",
        "list of strings",
        ["mup", "sp"],
        '`"mup"`, `"u-mup"` (unit-scaled µP, docs/u-mup.md: each u-µP cell parametrizes with '
        '`parametrization="u-mup"`; reports label it u-µP) and/or `"sp"` (standard parametrization, the plain '
        'model). With `"u-mup"` listed, `[fixed] parametrization` is refused (each cell says its own).',
    ),
    Key(
        "sampler",
        "string",
        "grid",
        '`"grid"` (every grid point of `[space]` once), `"random"`, `"tpe"` (Optuna\'s TPE) or `"independent"` '
        "(the lr's grid first, then each other hyperparameter's grid alone at the best lr, the rest at their "
        "`default`; u-µP's search).",
    ),
    Key("n_trials", "integer ≥ 1", 16, "Trials per study with the random and TPE samplers (a grid runs its points)."),
    Key("seeds", "list of integers in [0, 2**32)", [0], "Every trial trains once per seed; its loss is the mean."),
    Key(
        "storage",
        "string",
        "",
        'Where trials are recorded: empty for an SQLite file in the run directory, `"sqlite:///path.db"` (relative to the TOML file), '
        'or `"postgresql://user@host/db"` for workers on several machines.',
    ),
    Key("space", "table of tables", REQUIRED, "The hyperparameters swept, one table each: `[space.lr]` (keys below)."),
    Key(
        "mup",
        "table",
        {},
        "µP's own search ranges: `[mup.space.lr]` with any of the keys of `[space.lr]` replaces them for µP's "
        "studies only (same hyperparameters, same type).",
    ),
    Key(
        "u-mup",
        "table",
        {},
        "u-µP's own search ranges, as `[mup.space.*]` (`[u-mup.space.lr]`): u-µP's lr optimum is not µP's.",
    ),
    Key(
        "sp",
        "table",
        {},
        "SP's own search ranges, as `[mup.space.*]`: e.g. a wider lr range, since SP's optimum moves with width "
        "while µP's stays put.",
    ),
    Key(
        "fixed",
        "table",
        {},
        "Hyperparameters passed to the objective unchanged (the swept ones override nothing: a name is either swept or fixed).",
    ),
    Key(
        "pruner",
        "string",
        "none",
        '`"none"`, `"median"` (recommended), `"successive_halving"` or `"hyperband"`: stop trials early that report worse losses.',
    ),
    Key("pruner_options", "table", {}, "The pruner's own settings (keys below); needs a `pruner`."),
    Key(
        "devices",
        "string or list of integers",
        None,
        '`"auto"` (the visible GPUs, else the CPU), `"cpu"`, or GPU ids such as `[0, 1]`.',
        '`"auto"`',
    ),
    Key(
        "trials_per_device",
        "integer ≥ 1",
        None,
        "Worker processes per GPU (several small proxies may share one).",
        "`1`",
    ),
    Key("threads", "integer ≥ 1", None, "Torch threads per worker.", "the cores split between the workers"),
    Key(
        "precision",
        "string",
        "fp32",
        '`"fp32"`, `"bf16"` (autocast) or `"fp8"` (a simulation of FP8 matmuls: E4M3 operands, E5M2 gradients; '
        "numerics, not speed); the objective reads `scale.precision`.",
    ),
    Key("cluster", "table", None, "Run the workers as a Slurm job array (keys below). Absent: this machine only."),
    Key(
        "config_dir",
        "string (absolute path)",
        None,
        "The directory relative paths resolve against. mutransfer writes it at the top of the run directory's copy of the config.",
        "the TOML file's directory",
    ),
)

# old key → new key; the old one is read with a DeprecationWarning for one release
DEPRECATED_KEYS: dict[str, str] = {"steps": "horizons"}

SPACE: tuple[Key, ...] = (
    Key("type", "string", "log", '`"log"` (log-uniform), `"uniform"` or `"choice"`.'),
    Key(
        "low",
        "number or string",
        REQUIRED,
        'The range\'s low end (log, uniform); `"2**-10"` and `"1e-3"` are read as numbers. Finite (no `inf`, `nan`, `"1e400"`).',
    ),
    Key("high", "number or string", REQUIRED, "The range's high end (log, uniform)."),
    Key(
        "grid",
        "integer in [1, 1000000]",
        8,
        "Grid points on the range (log: evenly spaced in log2); a grid sweep's points per study (the product over `[space]`) are at most 1,000,000.",
    ),
    Key("values", "list", REQUIRED, "The choices (choice only), each once.", "**required** for a choice"),
    Key(
        "default",
        "number or string (a choice: one of its values)",
        None,
        'Where the `"independent"` sampler holds this hyperparameter while it sweeps the others (u-µP\'s '
        "α: `1`); in the range. Other samplers ignore it.",
        "the grid point nearest the range's centre (log2 for log); a choice's first value",
    ),
)

CLUSTER: tuple[Key, ...] = (
    Key(
        "backend",
        "string",
        "slurm",
        '`"slurm"` (a job array through submitit) or `"local"` (submitit\'s local processes).',
    ),
    Key("jobs", "integer ≥ 1", 1, "Array tasks, each one node's worth of workers."),
    Key("gpus_per_job", "integer ≥ 0", 0, "GPUs per task (`--gres=gpu:N`); 0: CPU workers."),
    Key("trials_per_device", "integer ≥ 1", 1, "Workers per GPU (per task on the CPU)."),
    Key("partition", "string", None, "The Slurm partition to submit to (`--partition`)."),
    Key(
        "time_min",
        "integer ≥ 1",
        60,
        "Minutes per task; at the limit the task is requeued and its trials rerun elsewhere.",
    ),
    Key("mem_gb", "finite number > 0", None, "Memory per task in GB."),
    Key("cpus_per_task", "integer ≥ 1", None, "CPUs per task; the workers split them."),
    Key("account", "string", None, "The Slurm account to charge (`--account`)."),
    Key("qos", "string", None, "The Slurm quality of service (`--qos`)."),
    Key("setup", "list of strings", [], 'Shell lines run before each worker, e.g. `["module load cuda"]`.'),
    Key("slurm", "table", {}, "Anything else, verbatim to submitit's SlurmExecutor (`slurm_` prefix optional)."),
)

# Every option of each pruner with its default.
PRUNER_OPTIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "median": {"n_startup_trials": 2, "n_warmup_steps": 0, "interval_steps": 1},
    "successive_halving": {"min_resource": AUTO, "reduction_factor": 4, "min_early_stopping_rate": 0},
    "hyperband": {"min_resource": 1, "max_resource": AUTO, "reduction_factor": 3},
}
# What each pruner option means, and (minimum, allows "auto") for its validation.
PRUNER_OPTION_MEANINGS: dict[str, tuple[str, int, bool]] = {
    "n_startup_trials": ("Trials that finish in a study before it prunes.", 0, False),
    "n_warmup_steps": ("No pruning before this step.", 0, False),
    "interval_steps": ("Prune-checks every this many steps.", 1, False),
    "min_resource": ('The first rung, in steps (`"auto"`: Optuna estimates it).', 1, True),
    "max_resource": ('The objective\'s step count (`"auto"`: the largest reported).', 1, True),
    "reduction_factor": ("Keep the best 1/this of the trials at each rung.", 2, False),
    "min_early_stopping_rate": ("Skip this many first rungs.", 0, False),
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


def _table(keys: tuple[Key, ...]) -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{k.name}` | {k.type} | {k.shown_default()} | {k.meaning} |" for k in keys]
    return rows


def reference_markdown() -> str:
    """The config reference as Markdown tables, rendered from this module's schema.

    Returns:
        The text that replaces ``<!-- config-reference -->`` in docs/config_reference.md.
    """
    lines = ["## Top-level keys", "", *_table(TOP_LEVEL), ""]
    lines += [
        "Renamed keys, still read for one release with a `DeprecationWarning`: "
        + ", ".join(f"`{old}` → `{new}`" for old, new in DEPRECATED_KEYS.items())
        + ".",
        "",
    ]
    lines += ["## `[space.NAME]`", "", *_table(SPACE), ""]
    lines += ["## `[pruner_options]`", "", "| pruner | key | default | meaning |", "|---|---|---|---|"]
    for pruner, options in PRUNER_OPTIONS.items():
        for key, default in options.items():
            meaning, minimum, auto = PRUNER_OPTION_MEANINGS[key]
            allowed = f"integer ≥ {minimum}" + (' or `"auto"`' if auto else "")
            lines.append(f"| `{pruner}` | `{key}` | `{_toml(default)}` | {meaning} ({allowed}) |")
    lines += ["", "## `[cluster]`", "", *_table(CLUSTER), ""]
    return "\n".join(lines)
