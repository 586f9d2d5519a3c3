"""Where the monitor's numbers go: TensorBoard, W&B, a CSV file or a callable, each under the tag
``mup/<role>/<layer>/<quantity>``. TensorBoard and W&B are imported when first used; without them
the error names the extra (``pip install 'mutransfer[monitor]'``)."""

from __future__ import annotations

import csv
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["Sink", "make_sink", "tag"]

EXTRA = "pip install 'mutransfer[monitor]'"


def tag(role: str, layer: str, quantity: str) -> str:
    """The scalar's name in every sink: ``mup/<role>/<layer>/<quantity>``."""
    return f"mup/{role}/{layer}/{quantity}"


def _require(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"mt.Monitor(log={what!r}) needs {module.split('.')[0]}: {EXTRA}") from e


class Sink:
    """A destination for scalars: `write(step, {tag: value})`, then `close()`. Subclasses: one per kind."""

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Record `scalars` (tag → value) at `step`."""

    def close(self) -> None:
        """Flush and release what the sink holds."""


class _Callable(Sink):
    def __init__(self, fn: Callable[[int, dict[str, float]], Any]):
        self.fn = fn

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.fn(step, scalars)


class _TensorBoard(Sink):
    def __init__(self, logdir: str):
        _require("tensorboard", f"tensorboard:{logdir}")
        writer = _require("torch.utils.tensorboard", f"tensorboard:{logdir}").SummaryWriter
        self.writer = writer(log_dir=logdir)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB(Sink):
    """Logs into the active W&B run (``wandb.init`` by the user), or starts one (project "mutransfer-monitor").
    Steps go to the metric ``mup/step``, so the user's own step counter is left alone."""

    def __init__(self) -> None:
        self.wandb = _require("wandb", "wandb")
        self.own = self.wandb.run is None
        self.run = self.wandb.init(project="mutransfer-monitor") if self.own else self.wandb.run
        self.run.define_metric("mup/step")
        self.run.define_metric("mup/*", step_metric="mup/step")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({"mup/step": step, **scalars})

    def close(self) -> None:
        if self.own:
            self.run.finish()


class _CSV(Sink):
    """Long format, one row per scalar: step, tag, value (appended; the header written once)."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.file = self.path.open("a", newline="")  # append-only log: whole rows, flushed per sample
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(["step", "tag", "value"])

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.writer.writerows([step, k, repr(float(v))] for k, v in scalars.items())
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def make_sink(log: Any) -> Sink | None:
    """The sink `log` names: None, ``"tensorboard:DIR"``, ``"wandb"``, ``"csv:PATH"`` or a callable
    ``fn(step, {tag: value})``.

    Raises:
        UsageError: `log` is none of these.
        ImportError: TensorBoard or W&B is not installed (the message names the extra).
    """
    if log is None:
        return None
    if callable(log):
        return _Callable(log)
    if isinstance(log, str):
        kind, _, where = log.partition(":")
        if kind == "tensorboard" and where:
            return _TensorBoard(where)
        if kind == "csv" and where:
            return _CSV(where)
        if log == "wandb":
            return _WandB()
    raise UsageError(
        f"Monitor log={log!r} is not a destination; use 'tensorboard:DIR', 'wandb', 'csv:PATH' or a callable "
        "fn(step, {tag: value})"
    )
