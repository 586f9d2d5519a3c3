"""A sweep's trials: claiming one, running it on every seed, and recording how it ended.
(About 500 lines: one life cycle — claim, run, record, fail, retry — over the attributes below.)

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
  rerun does not run it again); `retry_failed` (``mutransfer sweep --retry-failed``) queues a new
  trial with the same params and marks the old one `retried=True`; when the new trial finishes,
  the old one's file is removed (its traceback stays in its user attributes).
- FAIL with `interrupted=True` (Ctrl-C) or `retried=True`: not a result, not done;
  a new trial with the same params was queued in its place. A queued replacement carries
  `retry_of` (the number of the trial it reruns).
- FAIL with none of these: a trial whose worker died (heartbeat stale); a retry was queued.
- FAIL with `failed=True` and `stale=True`: its worker died on it `MAX_STALE_RETRIES` + 1 times in a
  row (`studies.Studies.fail_stale`); `error` says "worker died N times", `traceback` is empty.
  Done like any failed trial, and rerun by `retry_failed`.

Every trial that ran records its FLOPs (`flops.FlopCount`, one per seed, sampled over its optimizer steps):
`flops` the sum over the seeds that ran (a pruned or failed trial's: what ran), `flops_per_seed` one
per seed; when counting failed (a bug of the counter's, never the trial's failure) `flops` is None
and `flops_error` says why.

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
import socket
import time
import traceback
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from ..._core.atomic import write_atomically
from ..config.cells import Cell
from ..config.config import TRANSFERRING, SweepConfig
from ..config.space import Choice, Dimension, LogUniform
from ..scale import Objective, Pruned, Reporter, Scale
from .flops import FlopCount, flop_attrs, guarded, next_counter
from .interrupts import interrupts_ignored
from .recording import Recording, trial_attrs
from .storage import (
    Heartbeat,
    cache_trial,
    quiet,
    set_finished_trial_user_attr,
    set_user_attrs,
    study_id,
    trial_counts,
    trial_id,
    waiting_trial_ids,
)

__all__ = [
    "ERROR_CHARS",
    "FAILURES_DIR",
    "TRACEBACK_CHARS",
    "RunContext",
    "claim",
    "failure_path",
    "make_scale",
    "release_claimed",
    "retry_failed",
    "run_trial",
    "sigint_ignored",
    "trial_outcome",
]

FAILURES_DIR = "failures"
ERROR_CHARS, TRACEBACK_CHARS = 500, 4000


def trial_outcome(t: FrozenTrial) -> str | None:
    """How a trial ended, if it is done.

    Args:
        t: a trial of one of the sweep's studies.

    Returns:
        'complete', 'diverged', 'failed' or 'pruned' for a trial that is done; None for one that is
        not (waiting, running, or a FAIL that was interrupted, retried or went stale: each has a
        replacement in the queue). See the module docstring.
    """
    if t.state == TrialState.COMPLETE:
        return "complete"
    if t.state == TrialState.PRUNED:
        return "pruned"
    if t.state != TrialState.FAIL or t.user_attrs.get("interrupted") or t.user_attrs.get("retried"):
        return None
    if t.user_attrs.get("diverged"):
        return "diverged"
    return "failed" if t.user_attrs.get("failed") else None


def make_scale(config: SweepConfig, cell: Cell, seed: int, device: torch.device) -> Scale:
    """The `Scale` a trial of `cell` receives for one seed (the config's base width, depth and precision).

    Args:
        config: the sweep's config.
        cell: where the trial trains; a depth of None keeps the objective's own depth.
        seed: the seed of this run of the trial.
        device: where the trial trains.

    Returns:
        The objective's second argument.
    """
    base_width = config.base_width if config.base_width is not None else min(config.widths)
    return Scale(
        cell.width,
        base_width,
        cell.parametrization,
        seed,
        cell.depth,
        None if cell.depth is None else config.base_depth,
        device=device,
        precision=config.precision,
    )


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What running a trial needs, gathered once per worker: the sweep's config, run directory,
    storage, objective and device.

    Attributes:
        config: the sweep's config.
        run_dir: the run directory (failure reports go in its ``failures`` folder).
        storage: the Optuna storage the trials are recorded in.
        objective: the user's `train(hparams, scale)` (or a built-in recipe).
        device: where this process trains.
    """

    config: SweepConfig
    run_dir: Path
    storage: optuna.storages.RDBStorage
    objective: Objective
    device: torch.device

    def hparams(self, params: dict[str, Any], cell: Cell) -> dict[str, Any]:
        """What the objective receives: [fixed], the swept values, and the cell's batch size and
        horizon (the proxy's unless the cell is one of a further batch size or horizon).

        Args:
            params: the trial's swept values.
            cell: the trial's cell.

        Returns:
            The objective's first argument.
        """
        return {**self.config.fixed, **params, **self.config.proxy_extra, **cell.extra_hparams}


def claim(storage: optuna.storages.RDBStorage, study: optuna.Study, config: SweepConfig) -> optuna.Trial | None:
    """Take a waiting trial of `study` (call under the sweep's `ClaimLock`), or (random/TPE) start a
    new one while trials are due. (The independent sampler's due points are queued before: `Sweep.work`.)

    Args:
        storage: the sweep's storage.
        study: the study of one cell.
        config: the sweep's config (its sampler and n_trials).

    Returns:
        The claimed trial, RUNNING with a first heartbeat; None when the study has none to give.
    """
    for tid in waiting_trial_ids(storage, study_id(study)):
        try:
            # The first heartbeat BEFORE the trial turns RUNNING (two commits): a RUNNING trial with
            # no heartbeat is never found stale, so a worker killed between the two would block the
            # sweep for good (seen once in the soak test); a WAITING trial with a heartbeat is
            # harmless, and a retried trial's old heartbeat is renewed before it can look stale.
            storage.record_heartbeat(tid)
            if storage.set_trial_state_values(tid, TrialState.RUNNING):
                try:
                    # The study's cached storage must know the trial before it can take params; this
                    # one trial is read into it (reading the study would re-read every waiting trial).
                    cache_trial(study, tid)
                    return optuna.Trial(study, tid)
                except BaseException:  # Ctrl-C or SIGTERM right after the claim: queue it again
                    with interrupts_ignored():
                        release_claimed(storage, study, tid, config)
                    raise
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    if config.sampler in ("grid", "independent"):  # every point is queued (independent: `independent.enqueue_due`)
        return None
    counts = trial_counts(storage, study_id(study))  # counted by the database: no trial is read
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    due = sum(counts.get(state, 0) for state in counted)
    failed = 0  # diverged or failed: done, never rerun by itself
    if counts.get(TrialState.FAIL):
        failed = sum(
            1
            for t in storage.get_all_trials(study_id(study), deepcopy=False, states=(TrialState.FAIL,))
            if trial_outcome(t) is not None
        )
    if due + failed >= config.n_trials:
        return None
    with quiet():  # we send the heartbeats ourselves (see Heartbeat)
        trial = study.ask()
    storage.record_heartbeat(trial_id(trial))
    return trial


def _suggest(trial: optuna.Trial, name: str, dim: Dimension) -> Any:
    if isinstance(dim, Choice):
        return trial.suggest_categorical(name, list(dim.values))
    return trial.suggest_float(name, dim.low, dim.high, log=isinstance(dim, LogUniform))


def run_trial(ctx: RunContext, study: optuna.Study, trial: optuna.Trial, cell: Cell) -> str | None:
    """Train one trial on every seed and record it (see the module docstring).

    An exception from the objective marks the trial failed, and so do its `sys.exit()` (argparse's
    parse_args calls it) and a return value that is not a number; Ctrl-C marks it interrupted,
    queues it again and propagates.

    Args:
        ctx: the worker's run context.
        study: the cell's study.
        trial: a trial claimed by `claim`.
        cell: the cell the study belongs to.

    Returns:
        The line to show for a failed trial; None otherwise.
    """
    params: dict[str, Any] = {}
    try:
        params = {name: _suggest(trial, name, dim) for name, dim in ctx.config.space_for(cell.parametrization).items()}
        hparams = ctx.hparams(params, cell)
        where = {
            "worker": f"{socket.gethostname()}:{os.getpid()}",
            "device": str(ctx.device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "precision": ctx.config.precision,
            "threads": torch.get_num_threads(),
            "started": time.time(),
        }
        set_user_attrs(ctx.storage, trial, where)  # one commit, not six
        start, cpu_start = time.perf_counter(), time.process_time()
        losses: list[float] = []
        error: tuple[BaseException, str, int, str | None] | None = None  # (+ message to show)
        reported: list[tuple[int, float]] = []  # the last (step, loss) sent to the pruner
        pruned = False
        recording: Recording | None = None
        counters: list[FlopCount | None] = []  # one per seed that ran (None: its counting failed to start)
        with Heartbeat(ctx.storage, trial_id(trial)):
            for i, seed in enumerate(ctx.config.seeds):
                # Only the first seed reports: the pruner compares one fidelity (same data, same
                # step) across trials; a trial pruned there trains no further seed.
                reporter = _reporter(trial, reported) if i == 0 and ctx.config.pruner != "none" else None
                scale = dataclasses.replace(make_scale(ctx.config, cell, seed, ctx.device), reporter=reporter)
                if i == 0 and cell.parametrization in TRANSFERRING:  # the first seed records its µP/u-µP trajectory
                    noise = _proxy_cell(ctx.config, cell)  # and, at the transferred proxy, may measure the noise scale
                    below = _best_value(ctx.storage, study) if noise else None
                    recording = Recording(hparams.get("steps"), noise=noise, guarded=True, noise_below=below)
                    scale = dataclasses.replace(scale, _recording=recording)
                counter = next_counter(counters, trial.number)
                counters.append(counter)
                try:
                    with guarded(counter):
                        value = ctx.objective(dict(hparams), scale)
                except optuna.TrialPruned:  # scale.report's Pruned (or the objective's own)
                    pruned = True
                    break
                except SystemExit as e:  # the objective's own sys.exit (argparse!): its trial failed
                    error = (e, traceback.format_exc(), seed, _exit_message(e))
                    break
                except Exception as e:
                    error = (e, traceback.format_exc(), seed, None)
                    break
                finally:
                    if recording is not None and i == 0:
                        recording.close()
                loss, problem = _as_loss(value)
                if problem is not None:  # the objective's return value: no traceback to show
                    error = (TypeError(problem), "", seed, problem)
                    break
                losses.append(loss)
        timing = {
            "ended": time.time(),
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start,
            **flop_attrs(counters),
        }
        if error is not None:
            set_user_attrs(ctx.storage, trial, timing)
            line = _record_failure(ctx, study, trial, cell, params, *error)
            _resolved(ctx, study, trial)  # the new failure's file replaces the old one's
            return line
        recorded = trial_attrs(recording, cell.width, cell.depth, cell.parametrization) if recording is not None else {}
        set_user_attrs(
            ctx.storage, trial, {**timing, "losses": [l if math.isfinite(l) else None for l in losses], **recorded}
        )
        if pruned:
            step, last = reported[-1] if reported else (None, None)
            trial.set_user_attr("pruned", True)
            trial.set_user_attr("pruned_step", step)
            trial.set_user_attr("pruned_loss", last)
            study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
        elif all(math.isfinite(l) for l in losses):
            study.tell(trial, sum(losses) / len(losses), skip_if_finished=True)
        else:
            trial.set_user_attr("diverged", True)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        _resolved(ctx, study, trial)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # another worker finished this very trial first (same HPs and seeds: same result)
    except BaseException:  # KeyboardInterrupt (Ctrl-C, SIGTERM), or SystemExit from outside the objective
        with interrupts_ignored():  # a second Ctrl-C or SIGTERM must not cut the bookkeeping short
            release_claimed(ctx.storage, study, trial_id(trial), ctx.config, params)
        raise
    return None


def _proxy_cell(config: Any, cell: Cell) -> bool:
    """Whether `cell` is the transferred parametrization's proxy (`SweepConfig.transferred`: µP, else u-µP; proxy
    width and depth, no further batch size or horizon): its trials measure the gradient noise scale when the
    objective asks (`Scale.noise_scale`)."""
    return (
        cell.parametrization == config.transferred
        and cell.width == config.proxy_width
        and cell.depth == config.proxy_depth
        and not cell.extra
    )


def _best_value(storage: Any, study: optuna.Study) -> float | None:
    """The lowest value of the study's finished trials so far (None when none has finished)."""
    try:
        return float(storage.get_best_trial(study_id(study)).value)
    except ValueError:  # no complete trial yet
        return None


def _reporter(trial: optuna.Trial, reported: list[tuple[int, float]]) -> Reporter:
    """`Scale.report`'s callback: the value goes to the trial; Pruned when the pruner says so."""

    def report(step: int, loss: float) -> None:
        trial.report(loss, step)
        reported[:] = [(step, loss)]
        if trial.should_prune():
            raise Pruned(f"pruned at step {step} (loss {loss:.4g})")

    return report


def failure_path(run_dir: Path, study_name: str, number: int) -> Path:
    """Where the full report of a failed trial is written.

    Args:
        run_dir: the sweep's run directory.
        study_name: the trial's study.
        number: the trial's number in its study.

    Returns:
        ``<run_dir>/failures/<study name, / replaced by _>-trial<number>.txt``.
    """
    return run_dir / FAILURES_DIR / f"{study_name.replace('/', '_')}-trial{number}.txt"


def _resolved(ctx: RunContext, study: optuna.Study, trial: optuna.Trial) -> None:
    """A rerun of a failed trial (`retry_failed`) has finished: the old trial's traceback file
    goes, so that the failures directory lists current failures only (the old trial keeps its
    traceback in its user attributes)."""
    old = trial.user_attrs.get("retry_of")
    for _ in range(1000):  # back through reruns that were interrupted, to the failed trial
        if old is None:
            return
        with contextlib.suppress(OSError):
            failure_path(ctx.run_dir, study.study_name, old).unlink(missing_ok=True)
        try:
            previous = ctx.storage.get_trial(ctx.storage.get_trial_id_from_study_id_trial_number(study_id(study), old))
        except KeyError:
            return
        old = previous.user_attrs.get("retry_of") if previous.user_attrs.get("interrupted") else None


def _record_failure(
    ctx: RunContext,
    study: optuna.Study,
    trial: optuna.Trial,
    cell: Cell,
    params: dict[str, Any],
    error: BaseException,
    text: str,
    seed: int,
    message: str | None = None,
) -> str:
    """Record a trial whose objective raised (or returned no number: `message` says so, `text`
    is empty): FAIL with `failed`, `error`, `traceback`, and the full text in the run's failures
    directory. Returns the line to print."""
    message = message or f"{type(error).__name__}: {error}"
    path = failure_path(ctx.run_dir, study.study_name, trial.number)
    report = "\n".join(
        [
            f"study: {study.study_name}",
            f"trial: {trial.number}",
            f"width: {cell.width}",
            f"depth: {cell.depth}",
            *(f"{axis}: {value}" for axis, value in cell.extra),
            f"parametrization: {cell.parametrization}",
            f"params: {json.dumps(params, default=repr)}",
            f"fixed: {json.dumps(ctx.config.fixed, default=repr)}",
            f"seed: {seed}",
            f"worker: {socket.gethostname()}:{os.getpid()}",
            f"error: {message}",
            "",
            text,
        ]
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, report)
        where = str(path)
    except OSError as e:
        where = f"the trial's user attribute 'traceback' ({path} could not be written: {e.strerror})"
    trial.set_user_attr("failed", True)
    trial.set_user_attr("error", message[:ERROR_CHARS])
    trial.set_user_attr("traceback", text if len(text) <= TRACEBACK_CHARS else "…" + text[-TRACEBACK_CHARS:])
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return (
        f"trial {trial.number} ({cell.label}) failed: {first[:ERROR_CHARS]} — "
        f"{'traceback' if text else 'details'} in {where}"
    )


def release_claimed(
    storage: optuna.storages.RDBStorage,
    study: optuna.Study,
    tid: int,
    config: SweepConfig,
    params: dict[str, Any] | None = None,
) -> None:
    """Mark a claimed trial cut off by Ctrl-C or SIGTERM FAIL `interrupted` and queue its point again,
    so that a rerun takes it at once (not after the heartbeat grace period). A trial already
    finished is left alone.

    Args:
        storage: the sweep's storage.
        study: the trial's study.
        tid: the trial's storage id.
        config: the sweep's config (the swept names).
        params: values suggested so far (random/TPE), if any.
    """
    frozen = storage.get_trial(tid)
    if frozen.state.is_finished():
        return
    params = {**frozen.system_attrs.get("fixed_params", {}), **frozen.params, **(params or {})}
    try:
        storage.set_trial_user_attr(tid, "interrupted", True)
        if not storage.set_trial_state_values(tid, TrialState.FAIL):
            return
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    if set(params) >= set(config.space):  # else (random/TPE) a new trial is drawn in its place
        study.enqueue_trial({name: params[name] for name in config.space}, user_attrs={"retry_of": frozen.number})


def retry_failed(storage: optuna.storages.RDBStorage, studies: list[optuna.Study], config: SweepConfig) -> int:
    """Queue every failed trial (the objective raised; not diverged) once more with the same
    params, marking the old one `retried`. Call it under the sweep's `ClaimLock` (as
    `Sweep.retry_failed` does), so that two processes retry each trial once between them.

    Args:
        storage: the sweep's storage.
        studies: the sweep's studies.
        config: the sweep's config (the swept names).

    Returns:
        How many trials were queued. Studies opened before still show the old trials without
        `retried` (Optuna caches finished trials): open them again.
    """
    n = 0
    for study in studies:
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if trial_outcome(t) != "failed":
                continue
            params = {**t.system_attrs.get("fixed_params", {}), **t.params}
            study.enqueue_trial(
                {name: params[name] for name in config.space if name in params},
                user_attrs={"retry_of": t.number},
            )
            set_finished_trial_user_attr(storage, trial_id(t), "retried", True)
            n += 1
    return n


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


sigint_ignored = interrupts_ignored  # the older name: SIGINT and SIGTERM are ignored
