"""Run a sweep: one Optuna study per (parametrization, width[, depth]), workers claiming trials.

A run directory holds ``config.toml`` (the sweep's config, copied at creation) and, with the
default storage, ``sweep.db``. Any number of workers — local processes or other machines —
run `work()` on the same storage; each claims a trial atomically (grid points are enqueued once,
up front), trains it and records the loss. Diverged trials (NaN/inf loss) are recorded and the
sweep goes on. A trial whose worker died is retried (see `storage`).

How a finished trial reads (the user attributes are the contract with `analysis` and `report`):

- COMPLETE: a result; `losses` (one per seed), `seconds` (wall), `cpu_seconds` (process CPU time).

- FAIL with `diverged=True`: a NaN/inf loss; counts as done.
- PRUNED with `pruned=True` (a sweep with a `pruner`): the pruner stopped the trial after
  `scale.report`; `pruned_step` and `pruned_loss` hold the last reported step and loss (None if
  none was reported), `losses` the seeds finished before (none: only the first seed reports),
  plus `seconds` and `cpu_seconds`. Counts as done, never as a failure, and is never rerun.
- FAIL with `failed=True` (and not `retried`): the objective raised, called `sys.exit()` or
  returned something other than a number. `error` holds "TypeName: message" (or what was wrong:
  "the objective returned None; …", "the objective called sys.exit(2) …"; ≤ 500 characters),
  `traceback` the traceback's last ~4000 characters (empty for a bad return value);
  the full text, with width, depth, parametrization, params and seed, is saved as
  ``<run_dir>/failures/<study name, / replaced by _>-trial<number>.txt``. Counts as done (a
  rerun does not run it again); `Sweep.retry_failed` (``mutransfer sweep --retry-failed``)
  queues a new trial with the same params and marks the old one `retried=True`; when the new
  trial finishes, the old one's file is removed (its traceback stays in its user attributes).
- FAIL with `interrupted=True` (Ctrl-C) or `retried=True`: not a result, not done;
  a new trial with the same params was queued in its place. A queued replacement carries
  `retry_of` (the number of the trial it reruns).
- FAIL with none of these: a trial whose worker died (heartbeat stale); Optuna queued a retry.

Every trial that ran also records where and when: `device` ("cpu" or "cuda:0"), `cuda_visible_devices`
(the worker's ``CUDA_VISIBLE_DEVICES``, None when unset), `precision` ("fp32"/"bf16"), `threads` (torch's
CPU threads), `started` and `ended` (Unix times) and `worker` (host:pid).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from .._core.devices import check_precision, resolve_device
from .._core.progress import Progress
from ..errors import SweepInterrupted
from .config import SweepConfig, load_config, pinned_text
from .objective import Objective, Pruned, Scale
from .objectives import load_objective
from .space import Choice, Dimension, LogUniform
from .storage import (
    ClaimLock,
    Heartbeat,
    default_url,
    open_storage,
    optuna_logs_quiet,
    quiet,
    set_finished_trial_user_attr,
    study_id,
    trial_id,
)

__all__ = [
    "CONFIG_FILE",
    "COUNT_SECONDS",
    "EXIT_INTERRUPTED",
    "FAILURES_DIR",
    "FIRST_WAIT_SECONDS",
    "POLL_SECONDS",
    "STALE_CHECK_SECONDS",
    "STORAGE_ENV",
    "WATCH_SECONDS",
    "Sweep",
    "SweepInterrupted",
    "cell_label",
    "sigint_ignored",
    "study_name",
    "trial_outcome",
]

CONFIG_FILE = "config.toml"
STORAGE_ENV = "MUTRANSFER_STORAGE"
POLL_SECONDS = 1.0
# Waiting for other workers' running trials: the first look comes soon (a local worker's last
# trial ends within a trial's time; a 1 s sleep was a 1 s tail on every 2-worker sweep), then
# each wait is longer, up to POLL_SECONDS.
FIRST_WAIT_SECONDS = 0.05
STALE_CHECK_SECONDS = 2.0  # how often a worker looks for trials whose worker died (grace period: 8 s)
WATCH_SECONDS = 2.0  # how often a watching (GPU sweep) process recounts the trials
COUNT_SECONDS = 5.0  # how often the progress bar recounts every worker's finished trials
FAILURES_DIR = "failures"
ERROR_CHARS, TRACEBACK_CHARS = 500, 4000
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def trial_outcome(t: FrozenTrial) -> str | None:
    """'complete', 'diverged', 'failed' or 'pruned' for a trial that is done; None for one that is
    not (waiting, running, or a FAIL that was interrupted, retried or went stale: each has a
    replacement in the queue). See the module docstring."""
    if t.state == TrialState.COMPLETE:
        return "complete"
    if t.state == TrialState.PRUNED:
        return "pruned"
    if t.state != TrialState.FAIL or t.user_attrs.get("interrupted") or t.user_attrs.get("retried"):
        return None
    if t.user_attrs.get("diverged"):
        return "diverged"
    return "failed" if t.user_attrs.get("failed") else None


def study_name(
    config: SweepConfig, parametrization: str, width: int, depth: int | None = None, extra: tuple = ()
) -> str:
    """`{name}/{parametrization}/w{width}`, plus `/d{depth}` in a sweep over depths and
    `/batch_size{b}` or `/steps{s}` for a further batch size or horizon."""
    name = f"{config.name}/{parametrization}/w{width}" + ("" if depth is None else f"/d{depth}")
    return name + "".join(f"/{axis}{value}" for axis, value in extra)


def cell_label(parametrization: str, width: int, depth: int | None = None, extra: tuple = ()) -> str:
    """'mup width 32', 'mup width 32 depth 4' or 'mup width 32 batch_size 64', for progress lines."""
    return (
        f"{parametrization} width {width}"
        + ("" if depth is None else f" depth {depth}")
        + "".join(f" {axis} {value}" for axis, value in extra)
    )


class Sweep:
    """A sweep's run directory, config, storage and studies."""

    def __init__(self, run_dir: str | os.PathLike, storage: str | None = None, wait: float = 0.0):
        """Open a run. `wait`: seconds to wait for a sweep that another process is still creating."""
        self.run_dir = Path(run_dir)
        path = self.run_dir / CONFIG_FILE
        storage = storage or os.environ.get(STORAGE_ENV)
        deadline = time.monotonic() + wait
        while not path.is_file():
            if storage:
                _fetch_config(open_storage(storage), self.run_dir.name, path)  # a worker on another machine
            if path.is_file() or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        if not path.is_file():
            raise ValueError(
                f"{self.run_dir} is not a sweep run directory (no {CONFIG_FILE}); start one with "
                "`mutransfer sweep CONFIG --run DIR`, or pass the sweep's name and --storage"
            )
        self.config = load_config(path)
        self.url = storage or self.config.storage or default_url(self.run_dir)
        self.storage = open_storage(self.url)
        self.device = torch.device("cpu")  # where this process trains trials (`work`); see `use_device`
        self._objective: Objective | None = None
        self._studies: dict[tuple[str, int, int | None], optuna.Study] = {}

    @classmethod
    def create(cls, config_path: str | os.PathLike, run_dir: str | os.PathLike, storage: str | None = None) -> Sweep:
        """Make (or reopen) the run directory for `config_path`; a rerun must use the same config.

        The config is validated, the objective loaded and an explicitly given storage opened
        before anything is written: a sweep refused for any of them leaves no run directory
        behind, so the corrected command starts afresh."""
        config = load_config(config_path)
        objective = load_objective(config.objective, config.config_dir)
        url = storage or os.environ.get(STORAGE_ENV) or config.storage
        if url:
            open_storage(url).engine.dispose()
        run_dir = Path(run_dir)
        target = run_dir / CONFIG_FILE
        text = pinned_text(config_path, config)
        if target.is_file():
            existing = load_config(target)
            if existing.contents != config.contents:
                changes = _differences(existing.contents, config.contents) or ["values differ in type only"]
                shown = "; ".join(changes[:10]) + (f"; and {len(changes) - 10} more" if len(changes) > 10 else "")
                raise ValueError(
                    f"{run_dir} already holds a sweep with a different config ({target} → "
                    f"{config_path}: {shown}). To run this config, pass a new --run directory "
                    f"(e.g. --run {_free_sibling(run_dir)}); to resume that sweep, rerun it with "
                    "its own config"
                )
            if existing.config_dir != config.config_dir:  # the same TOML, moved: its paths resolve there now
                _write_atomically(target, text)
        else:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"run directory {run_dir}: cannot create it ({e.strerror})") from None
            _write_atomically(target, text)
        sweep = cls(run_dir, storage)
        sweep._objective = objective
        return sweep

    @property
    def objective(self) -> Objective:
        if self._objective is None:
            base = self.config.config_dir
            if base is not None and not base.is_dir():
                base = None  # a worker on another machine: relative to its current directory
            self._objective = load_objective(self.config.objective, base)
        return self._objective

    def study(self, parametrization: str, width: int, depth: int | None = None, extra: tuple = ()) -> optuna.Study:
        key = (parametrization, width, depth, tuple(extra))
        if key not in self._studies:
            self._studies[key] = self._create_study(*key)
        return self._studies[key]

    @optuna_logs_quiet()  # on creation only: study() runs in the work loop, and a log-level change clears logging's caches
    def _create_study(self, parametrization: str, width: int, depth: int | None, extra: tuple) -> optuna.Study:
        seed = (
            1000 * width + (parametrization == "sp") + 7919 * (depth or 0) + sum(104729 * v for _, v in extra)
        ) % 2**32
        sampler = (
            optuna.samplers.TPESampler(seed=seed)
            if self.config.sampler == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        )
        return optuna.create_study(
            storage=self.storage,
            sampler=sampler,
            direction="minimize",
            pruner=self.config.optuna_pruner() or optuna.pruners.NopPruner(),
            study_name=study_name(self.config, parametrization, width, depth, extra),
            load_if_exists=True,
        )

    # ------------------------------------------------------------------ preparing

    def grid(self) -> list[dict]:
        """Every grid point, in the order they are enqueued: ascending, or centre first then outwards
        with a pruner (see `config`: good references first)."""
        names = list(self.config.space)
        axes = [d.grid_points() for d in self.config.space.values()]
        points = list(product(*(range(len(a)) for a in axes)))
        if self.config.pruner != "none":
            points = sorted(points, key=lambda ix: _centre_distance(ix, [len(a) for a in axes]))
        return [{n: a[i] for n, a, i in zip(names, axes, ix)} for ix in points]

    @optuna_logs_quiet()
    def prepare(self) -> None:
        """Create the studies; for a grid sweep, enqueue every grid point once."""
        for cell in self.config.all_cells:
            study = self.study(*cell)
            if "config_toml" not in study.user_attrs:  # lets workers elsewhere join by name
                study.set_user_attr("config_toml", (self.run_dir / CONFIG_FILE).read_text())
            if self.config.sampler == "grid" and not study.user_attrs.get("enqueued"):
                for params in self.grid():
                    study.enqueue_trial(params, skip_if_exists=True)
                study.set_user_attr("enqueued", True)

    def prepared(self) -> bool:
        """Has `prepare` run (every study exists and, for a grid, is enqueued)?"""
        names = {s.study_name: s for s in optuna.study.get_all_study_summaries(self.storage, include_best_trial=False)}
        for cell in self.config.all_cells:
            summary = names.get(study_name(self.config, *cell))
            if summary is None or (self.config.sampler == "grid" and not summary.user_attrs.get("enqueued")):
                return False
        return True

    def wait_prepared(self, timeout: float) -> None:
        """Block until the sweep's own process has prepared the studies (a worker may start first)."""
        deadline = time.monotonic() + timeout
        while not self.prepared():
            if time.monotonic() > deadline:
                raise ValueError(
                    f"sweep {self.config.name} was not prepared within {timeout:.0f} s; "
                    "start it with `mutransfer sweep CONFIG` first"
                )
            time.sleep(POLL_SECONDS)

    def trials_per_cell(self) -> int:
        """Trials each study runs: its grid points, or `n_trials` (random/TPE)."""
        return len(self.grid()) if self.config.sampler == "grid" else self.config.n_trials

    def total_trials(self) -> int:
        return self.trials_per_cell() * len(self.config.all_cells)

    # ------------------------------------------------------------------ working

    def _claim(self, study: optuna.Study) -> optuna.Trial | None:
        """Atomically take a waiting trial, or (random/TPE) start a new one while trials are due."""
        for frozen in self.storage.get_all_trials(study_id(study), deepcopy=False, states=(TrialState.WAITING,)):
            try:
                if self.storage.set_trial_state_values(trial_id(frozen), TrialState.RUNNING):
                    # A first heartbeat at once: a trial with none is never found stale, so a worker
                    # dying before its heartbeat thread starts would block the sweep for good.
                    self.storage.record_heartbeat(trial_id(frozen))
                    # The study's cached storage must know the trial before it can take params:
                    # a trial queued by another process (a retry, an interrupted run) is not in it
                    # yet, so read the study's trials once (incremental in Optuna's cache).
                    study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    return optuna.Trial(study, trial_id(frozen))
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        if self.config.sampler == "grid":
            return None
        counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
        due = len(study.get_trials(deepcopy=False, states=counted))
        failed = sum(
            1 for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if trial_outcome(t) is not None
        )  # diverged or failed: done, never rerun by itself
        if due + failed >= self.config.n_trials:
            return None
        with quiet():  # we send the heartbeats ourselves (see Heartbeat)
            trial = study.ask()
        self.storage.record_heartbeat(trial_id(trial))
        return trial

    def _suggest(self, trial: optuna.Trial, name: str, dim: Dimension):
        if isinstance(dim, Choice):
            return trial.suggest_categorical(name, list(dim.values))
        return trial.suggest_float(name, dim.low, dim.high, log=isinstance(dim, LogUniform))

    def use_device(self, device: str | torch.device = "auto", what: str = "device") -> torch.device:
        """Train this process's trials on `device` ("auto": CUDA when visible, else the CPU), in the
        config's precision; a ValueError naming `what` when the device cannot (bf16 on an old GPU)."""
        resolved = resolve_device(device, what)
        check_precision(self.config.precision, resolved, "precision")
        self.device = resolved
        return resolved

    def scale(
        self, parametrization: str, width: int, depth: int | None, seed: int, device: torch.device | None = None
    ) -> Scale:
        """Where a trial of this sweep runs; depth None keeps the objective's own depth. `device`:
        default this process's (`use_device`); the precision is the config's."""
        return Scale(
            width,
            self.config.base_width,
            parametrization,
            seed,
            depth,
            None if depth is None else self.config.base_depth,
            device=self.device if device is None else device,
            precision=self.config.precision,
        )

    def hparams(self, params: dict[str, Any], extra: tuple = ()) -> dict[str, Any]:
        """What the objective receives: [fixed], the swept values, and the cell's batch size and
        horizon (the proxy's unless the cell is one of a further batch size or horizon)."""
        return {**self.config.fixed, **params, **self.config.proxy_extra, **dict(extra)}

    def _run(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        parametrization: str,
        width: int,
        depth: int | None = None,
        extra: tuple = (),
    ) -> str | None:
        """Train one trial on every seed and record it. An exception from the objective marks the
        trial failed (returns the line to show), and so do its `sys.exit()` (argparse's parse_args
        calls it) and a return value that is not a number; Ctrl-C marks it interrupted, queues it
        again and propagates."""
        params: dict[str, Any] = {}
        try:
            params = {name: self._suggest(trial, name, dim) for name, dim in self.config.space.items()}
            hparams = self.hparams(params, extra)
            trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
            trial.set_user_attr("device", str(self.device))
            trial.set_user_attr("cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES"))
            trial.set_user_attr("precision", self.config.precision)
            trial.set_user_attr("threads", torch.get_num_threads())
            trial.set_user_attr("started", time.time())
            start, cpu_start = time.perf_counter(), time.process_time()
            losses: list[float] = []
            error: tuple[BaseException, str, int, str | None] | None = None  # (+ message to show)
            reported: list[tuple[int, float]] = []  # the last (step, loss) sent to the pruner
            pruned = False
            with Heartbeat(self.storage, trial_id(trial)):
                for i, seed in enumerate(self.config.seeds):
                    # Only the first seed reports: the pruner compares one fidelity (same data, same
                    # step) across trials; a trial pruned there trains no further seed.
                    reporter = self._reporter(trial, reported) if i == 0 and self.config.pruner != "none" else None
                    scale = dataclasses.replace(self.scale(parametrization, width, depth, seed), reporter=reporter)
                    try:
                        value = self.objective(dict(hparams), scale)
                    except optuna.TrialPruned:  # scale.report's Pruned (or the objective's own)
                        pruned = True
                        break
                    except SystemExit as e:  # the objective's own sys.exit (argparse!): its trial failed
                        error = (e, traceback.format_exc(), seed, _exit_message(e))
                        break
                    except Exception as e:
                        error = (e, traceback.format_exc(), seed, None)
                        break
                    loss, problem = _as_loss(value)
                    if problem is not None:  # the objective's return value: no traceback to show
                        error = (TypeError(problem), "", seed, problem)
                        break
                    losses.append(loss)
            trial.set_user_attr("ended", time.time())
            trial.set_user_attr("seconds", time.perf_counter() - start)
            trial.set_user_attr("cpu_seconds", time.process_time() - cpu_start)
            if error is not None:
                line = self._failed(study, trial, (parametrization, width, depth, extra), params, *error)
                self._resolved(study, trial)  # the new failure's file replaces the old one's
                return line
            trial.set_user_attr("losses", [l if math.isfinite(l) else None for l in losses])
            if pruned:
                step, loss = reported[-1] if reported else (None, None)
                trial.set_user_attr("pruned", True)
                trial.set_user_attr("pruned_step", step)
                trial.set_user_attr("pruned_loss", loss)
                study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            elif all(math.isfinite(l) for l in losses):
                study.tell(trial, sum(losses) / len(losses), skip_if_finished=True)
            else:
                trial.set_user_attr("diverged", True)
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            self._resolved(study, trial)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker finished this very trial first (same HPs and seeds: same result)
        except BaseException:  # KeyboardInterrupt (Ctrl-C), or SystemExit from outside the objective
            with sigint_ignored():  # a second Ctrl-C must not cut the bookkeeping short
                self._interrupted(study, trial, params)
            raise
        return None

    @staticmethod
    def _reporter(trial: optuna.Trial, reported: list[tuple[int, float]]):
        """`Scale.report`'s callback: the value goes to the trial; Pruned when the pruner says so."""

        def report(step: int, loss: float) -> None:
            trial.report(loss, step)
            reported[:] = [(step, loss)]
            if trial.should_prune():
                raise Pruned(f"pruned at step {step} (loss {loss:.4g})")

        return report

    def _failure_path(self, study: optuna.Study, number: int) -> Path:
        return self.run_dir / FAILURES_DIR / f"{study.study_name.replace('/', '_')}-trial{number}.txt"

    def _resolved(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """A rerun of a failed trial (`retry_failed`) has finished: the old trial's traceback file
        goes, so that the failures directory lists current failures only (the old trial keeps its
        traceback in its user attributes)."""
        old = trial.user_attrs.get("retry_of")
        for _ in range(1000):  # back through reruns that were interrupted, to the failed trial
            if old is None:
                return
            with contextlib.suppress(OSError):
                self._failure_path(study, old).unlink(missing_ok=True)
            try:
                previous = self.storage.get_trial(
                    self.storage.get_trial_id_from_study_id_trial_number(study_id(study), old)
                )
            except KeyError:
                return
            old = previous.user_attrs.get("retry_of") if previous.user_attrs.get("interrupted") else None

    def _failed(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        cell: tuple[str, int, int | None, tuple],
        params: dict[str, Any],
        error: BaseException,
        text: str,
        seed: int,
        message: str | None = None,
    ) -> str:
        """Record a trial whose objective raised (or returned no number: `message` says so, `text`
        is empty): FAIL with `failed`, `error`, `traceback`, and the full text in the run's failures
        directory. Returns the line to print."""
        parametrization, width, depth, extra = cell
        message = message or f"{type(error).__name__}: {error}"
        path = self._failure_path(study, trial.number)
        report = "\n".join(
            [
                f"study: {study.study_name}",
                f"trial: {trial.number}",
                f"width: {width}",
                f"depth: {depth}",
                *(f"{axis}: {value}" for axis, value in extra),
                f"parametrization: {parametrization}",
                f"params: {json.dumps(params, default=repr)}",
                f"fixed: {json.dumps(self.config.fixed, default=repr)}",
                f"seed: {seed}",
                f"worker: {socket.gethostname()}:{os.getpid()}",
                f"error: {message}",
                "",
                text,
            ]
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(report)
            where = str(path)
        except OSError as e:
            where = f"the trial's user attribute 'traceback' ({path} could not be written: {e.strerror})"
        trial.set_user_attr("failed", True)
        trial.set_user_attr("error", message[:ERROR_CHARS])
        trial.set_user_attr("traceback", text if len(text) <= TRACEBACK_CHARS else "…" + text[-TRACEBACK_CHARS:])
        try:
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
        first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
        return (
            f"trial {trial.number} ({cell_label(*cell)}) failed: {first[:ERROR_CHARS]} — "
            f"{'traceback' if text else 'details'} in {where}"
        )

    def _interrupted(self, study: optuna.Study, trial: optuna.Trial, params: dict[str, Any]) -> None:
        """Mark a trial cut off by Ctrl-C as FAIL `interrupted` and queue its params again, so that
        a rerun takes it at once (not after the heartbeat grace period)."""
        frozen = self.storage.get_trial(trial_id(trial))
        if frozen.state.is_finished():
            return
        params = {**frozen.system_attrs.get("fixed_params", {}), **frozen.params, **params}
        trial.set_user_attr("interrupted", True)
        try:
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            return
        if set(params) >= set(self.config.space):  # else (random/TPE) a new trial is drawn in its place
            study.enqueue_trial(
                {name: params[name] for name in self.config.space}, user_attrs={"retry_of": trial.number}
            )

    def retry_failed(self) -> int:
        """Queue every failed trial (the objective raised; not diverged) once more with the same
        params, marking the old one `retried`. Returns how many were queued."""
        n = 0
        with ClaimLock(self.url):
            for cell in self.config.all_cells:
                study = self.study(*cell)
                for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
                    if trial_outcome(t) != "failed":
                        continue
                    params = {**t.system_attrs.get("fixed_params", {}), **t.params}
                    study.enqueue_trial(
                        {name: params[name] for name in self.config.space if name in params},
                        user_attrs={"retry_of": t.number},
                    )
                    set_finished_trial_user_attr(self.storage, trial_id(t), "retried", True)
                    n += 1
        self._studies.clear()  # their caches still hold the old trials without `retried`
        return n

    def _outcomes(self) -> list[str | None]:
        return [
            trial_outcome(t)
            for cell in self.config.all_cells
            for t in self.study(*cell).get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
            )
        ]

    def finished(self) -> int:
        """Trials done: completed, diverged, pruned or failed (not retried)."""
        return sum(o is not None for o in self._outcomes())

    def completed(self) -> int:
        """Trials with a result (COMPLETE): not diverged, pruned or failed."""
        return sum(o == "complete" for o in self._outcomes())

    def failed(self) -> int:
        """Failed trials (the objective raised) not yet retried."""
        return sum(o == "failed" for o in self._outcomes())

    def pruned(self) -> int:
        """Trials stopped early by the pruner (done; not failures)."""
        return sum(o == "pruned" for o in self._outcomes())

    @optuna_logs_quiet()
    def work(self, progress: bool = True, max_trials: int | None = None, wait_for_others: bool = True) -> int:
        """Claim and run trials until none is left; then, with `wait_for_others`, wait for other
        workers' running trials to finish or go stale (a dead worker's trial is retried here).
        Returns the number of trials run here."""
        cells = self.config.all_cells
        bar = Progress(self.total_trials(), f"sweep {self.config.name}", enabled=progress)
        bar.done = self.finished()
        counted = stale_checked = time.monotonic()
        ran = 0
        wait = FIRST_WAIT_SECONDS
        try:
            while max_trials is None or ran < max_trials:
                claimed = None
                # Bookkeeping reads every trial of every cell, so it runs on a clock, not per trial:
                # per trial it cost 0.1-0.3 s of database reads, serialized across workers.
                if time.monotonic() >= stale_checked:
                    with quiet():
                        for cell in cells:
                            optuna.storages.fail_stale_trials(self.study(*cell))
                    stale_checked = time.monotonic() + STALE_CHECK_SECONDS
                # Cells in turn (each worker from its own offset), so all progress evenly; the
                # claim lock is held for the claim alone.
                start = (os.getpid() + ran) % len(cells)
                with ClaimLock(self.url):
                    for cell in cells[start:] + cells[:start]:
                        trial = self._claim(self.study(*cell))
                        if trial is not None:
                            claimed = (cell, trial)
                            break
                if claimed is None:
                    if not wait_for_others:
                        break
                    running = sum(
                        len(self.study(*c).get_trials(deepcopy=False, states=(TrialState.RUNNING,))) for c in cells
                    )
                    if not running:
                        break
                    stale_checked = time.monotonic()  # while waiting, look for dead workers' trials at once
                    bar.update(f"waiting for {running} running trial(s) of other workers")
                    time.sleep(wait)
                    wait = min(2 * wait, POLL_SECONDS)
                    continue
                wait = FIRST_WAIT_SECONDS
                cell, trial = claimed
                bar.update(f"{cell_label(*cell)} trial {trial.number}")
                failure = self._run(self.study(*cell), trial, *cell)
                if failure is not None:
                    _print_over(bar, failure)
                ran += 1
                if time.monotonic() >= counted:  # other workers' trials too, now and then
                    bar.done = self.finished()
                    counted = time.monotonic() + COUNT_SECONDS
                    bar.advance(0)
                else:
                    bar.advance(1)
        finally:
            bar.close()
        return ran

    def watch(self, procs: list[subprocess.Popen], progress: bool = True) -> None:
        """Show the sweep's progress until every worker in `procs` has left (a GPU sweep: this
        process runs no trial and never touches CUDA; the workers retry each other's dead trials)."""
        bar = Progress(self.total_trials(), f"sweep {self.config.name}", enabled=progress)
        try:
            counted = 0.0
            while any(p.poll() is None for p in procs):
                if time.monotonic() >= counted:
                    running = sum(
                        len(self.study(*c).get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
                        for c in self.config.all_cells
                    )
                    bar.done = self.finished()
                    alive = sum(p.poll() is None for p in procs)
                    bar.update(f"{running} trial(s) running on {alive} worker(s)")
                    bar.advance(0)
                    counted = time.monotonic() + WATCH_SECONDS
                time.sleep(0.1)
            bar.done = self.finished()
        finally:
            bar.close()


def _as_loss(value: Any) -> tuple[float, str | None]:
    """The objective's return value as a float, or (nan, what is wrong with it). Numbers only:
    int, float, a NumPy scalar or a one-element tensor/array (`.item()`); not bool, not a string."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            item = value.item()
        except (ValueError, RuntimeError, TypeError):  # more than one element
            shape = tuple(getattr(value, "shape", ()))
            return math.nan, (
                f"the objective returned a {type(value).__name__} of shape {shape}; it must return "
                "the training loss as a float (a single number)"
            )
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            return float(item), None
        value = item
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), None
    if value is None:
        return math.nan, (
            "the objective returned None; it must return the training loss as a float (a missing return statement?)"
        )
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return math.nan, (
        f"the objective returned {shown} ({type(value).__name__}); it must return the training loss as a float"
    )


def _exit_message(e: SystemExit) -> str:
    """The failure message of an objective that called sys.exit."""
    code = "" if e.code is None else repr(e.code)
    return (
        f"the objective called sys.exit({code}) (argparse's parse_args does this on arguments it does not "
        "know, e.g. the sweep's command line: pass it its own list, parse_args([])): raise an exception "
        "instead to fail a trial"
    )


def _centre_distance(index: tuple, sizes: list[int]) -> tuple:
    """Sort key of a grid point (indices per HP): its distance from the grid's middle in grid
    steps, then the lower side first."""
    offsets = tuple(i - (n - 1) / 2 for i, n in zip(index, sizes))
    return (sum(o * o for o in offsets), offsets)


def _print_over(bar: Progress, line: str) -> None:
    """A line on stderr, above the progress bar when it is drawn on a terminal."""
    if bar.enabled and bar.tty:
        sys.stderr.write("\r" + " " * 150 + "\r")
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT (in the main thread) for the duration: bookkeeping after a Ctrl-C must finish."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _differences(old: Any, new: Any, key: str = "") -> list[str]:
    """'space.lr.low: "2**-10" → "2**-12"' for every key whose value differs (tables compared key by key)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in list(old) + [k for k in new if k not in old]:
            out += _differences(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{key}.{k}" if key else str(k))
        return out
    if old == new and type(old) is type(new):
        return []
    return [f"{key}: {_shown(old)} → {_shown(new)}"]


_ABSENT = object()


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(not set)"
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _free_sibling(run_dir: Path) -> Path:
    """`run_dir` with the first suffix -2, -3, … that names no existing path."""
    for i in range(2, 1000):
        candidate = run_dir.with_name(f"{run_dir.name}-{i}")
        if not candidate.exists():
            return candidate
    return run_dir.with_name(f"{run_dir.name}-new")


def _write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that a concurrent reader sees the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fetch_config(storage, name: str, path: Path) -> None:
    """Write the config of the sweep called `name` from its studies in `storage` to `path`."""
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name.startswith(f"{name}/") and "config_toml" in summary.user_attrs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(summary.user_attrs["config_toml"])
            return
