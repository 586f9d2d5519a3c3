"""Run a sweep: the `Sweep` facade over its run directory, config, storage, studies and trials.

A run directory holds ``config.toml`` (the sweep's config, copied at creation) and, with the
default storage, ``sweep.db``. Any number of workers — local processes or other machines —
run `Sweep.work` on the same storage; each claims a trial atomically (grid points are enqueued
once, up front), trains it and records the loss. Diverged trials (NaN/inf loss) are recorded and
the sweep goes on. A trial whose worker died is retried (see `storage`).

The rooms behind the facade: `studies` (one Optuna study per `Cell`, the grid, preparing),
`trials` (claiming, running one trial, outcomes, failures and retries: how a finished trial reads
is told there), `workers` (the worker processes and `run_sweep`).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import optuna
import torch

from ..._core.atomic import write_atomically
from ..._core.devices import check_precision, resolve_device
from ..._core.progress import Progress
from ...errors import SweepInterrupted
from ..config.cells import Cell
from ..config.config import SweepConfig, load_config, pinned_text
from ..recipes import load_objective
from ..scale import Objective, Scale
from .independent import enqueue_due
from .rundir import differences, fetch_config, free_sibling
from .storage import STORAGE_ENV, ClaimLock, default_url, open_storage, optuna_logs_quiet, trial_id
from .studies import POLL_SECONDS, Studies, Tally
from .trials import (
    FAILURES_DIR,
    RunContext,
    claim,
    make_scale,
    release_claimed,
    retry_failed,
    run_trial,
    sigint_ignored,
    trial_outcome,
)

__all__ = [
    "CONFIG_FILE",
    "COUNT_SECONDS",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
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
# Waiting for other workers' running trials: the first look comes soon (a local worker's last
# trial ends within a trial's time; a 1 s sleep was a 1 s tail on every 2-worker sweep), then
# each wait is longer, up to POLL_SECONDS.
FIRST_WAIT_SECONDS = 0.05
STALE_CHECK_SECONDS = 2.0  # how often a worker looks for trials whose worker died (grace period: 8 s)
WATCH_SECONDS = 2.0  # how often a watching (GPU sweep) process recounts the trials
COUNT_SECONDS = 5.0  # how often the progress bar recounts every worker's finished trials
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


def study_name(
    config: SweepConfig, parametrization: str, width: int, depth: int | None = None, extra: tuple = ()
) -> str:
    """The name of a cell's study (kept for callers of the tuple form; see `Cell.study_name`).

    Args:
        config: the sweep's config (its name).
        parametrization: "mup", "u-mup" or "sp".
        width: the cell's width.
        depth: the cell's depth, or None.
        extra: the cell's further batch size or horizon, or ().

    Returns:
        `{name}/{parametrization}/w{width}`, plus `/d{depth}` and `/batch_size{b}` or `/steps{s}`.
    """
    return Cell(parametrization, width, depth, tuple(extra)).study_name(config.name)


def cell_label(parametrization: str, width: int, depth: int | None = None, extra: tuple = ()) -> str:
    """A cell as progress lines show it (see `Cell.label`).

    Args:
        parametrization: "mup", "u-mup" or "sp".
        width: the cell's width.
        depth: the cell's depth, or None.
        extra: the cell's further batch size or horizon, or ().

    Returns:
        'mup width 32', 'mup width 32 depth 4' or 'mup width 32 batch_size 64'.
    """
    return Cell(parametrization, width, depth, tuple(extra)).label


class Sweep:
    """A sweep's run directory, config, storage and studies: what `run_sweep`, the workers, the
    report and the transfer work on.

    Args:
        run_dir: the run directory (it holds ``config.toml``).
        storage: the storage URL; default ``MUTRANSFER_STORAGE``, the config's ``storage``, else
            the SQLite file in the run directory.
        wait: seconds to wait for a sweep that another process is still creating.
        patient: a worker: ride out a storage that is down (restarting) for `storage.patience()` s.

    Raises:
        ValueError: `run_dir` holds no sweep (and none of that name is in `storage`), or the
            storage is unreachable.
    """

    def __init__(
        self, run_dir: str | os.PathLike, storage: str | None = None, wait: float = 0.0, patient: bool = False
    ):
        run_dir = Path(run_dir)
        path = run_dir / CONFIG_FILE
        storage = storage or os.environ.get(STORAGE_ENV)
        deadline = time.monotonic() + wait
        while not path.is_file():
            if storage:
                fetch_config(open_storage(storage, patient), run_dir.name, path)  # a worker on another machine
            if path.is_file() or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        if not path.is_file():
            raise ValueError(
                f"{run_dir} is not a sweep run directory (no {CONFIG_FILE}); start one with "
                "`mutransfer sweep CONFIG --run DIR`, or pass the sweep's name and --storage"
            )
        config = load_config(path)
        url = storage or config.storage or default_url(run_dir)
        self._open(run_dir, config, url, open_storage(url, patient))

    def _open(self, run_dir: Path, config: SweepConfig, url: str, storage: optuna.storages.RDBStorage) -> None:
        self.run_dir = run_dir
        self.config = config
        self.url = url
        self.storage = storage
        self.studies = Studies(config, storage)
        self.device = torch.device("cpu")  # where this process trains trials (`work`); see `use_device`
        self._objective: Objective | None = None
        self._source: str | None = None  # the config file a `create` came from

    @classmethod
    def create(
        cls,
        config_path: str | os.PathLike,
        run_dir: str | os.PathLike,
        storage: str | None = None,
        config: SweepConfig | None = None,
    ) -> Sweep:
        """Make (or reopen) the run directory for `config_path`; a rerun must use the same config.

        The config is validated, the objective loaded and an explicitly given storage opened
        before anything is written: a sweep refused for any of them leaves no run directory
        behind, so the corrected command starts afresh.

        Args:
            config_path: the sweep's TOML file.
            run_dir: the run directory (created if missing).
            storage: the storage URL (default: ``MUTRANSFER_STORAGE``, the config's, else the
                SQLite file in the run directory).
            config: `config_path` already loaded by the caller (read once, not twice).

        Returns:
            The opened sweep, its objective loaded.

        Raises:
            ValueError: a bad config or objective, an unreachable storage, a run directory that
                cannot be made, or one holding a sweep with a different config.
        """
        config = config if config is not None else load_config(config_path)
        objective = load_objective(config.objective, config.config_dir)
        url = storage or os.environ.get(STORAGE_ENV) or config.storage
        opened = open_storage(url) if url else None
        run_dir = Path(run_dir)
        target = run_dir / CONFIG_FILE
        text = pinned_text(config_path, config)
        if target.is_file():
            existing = load_config(target)
            if existing.contents != config.contents:
                changes = differences(existing.contents, config.contents) or ["values differ in type only"]
                shown = "; ".join(changes[:10]) + (f"; and {len(changes) - 10} more" if len(changes) > 10 else "")
                raise ValueError(
                    f"{run_dir} already holds a sweep with a different config ({target} → "
                    f"{config_path}: {shown}). To run this config, pass a new --run directory "
                    f"(e.g. --run {free_sibling(run_dir)}); to resume that sweep, rerun it with "
                    "its own config"
                )
            if existing.config_dir != config.config_dir:  # the same TOML, moved: its paths resolve there now
                write_atomically(target, text)
        else:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"run directory {run_dir}: cannot create it ({e.strerror})") from None
            write_atomically(target, text)
        url = url or default_url(run_dir)
        sweep = cls.__new__(cls)
        sweep._open(run_dir, config, url, opened or open_storage(url))
        sweep._objective = objective
        sweep._source = f"{Path(config_path).resolve()} (run directory {run_dir})"
        return sweep

    @property
    def objective(self) -> Objective:
        """The sweep's objective, loaded on first use (relative paths from the config's directory,
        or from the current one on a machine where that directory does not exist)."""
        if self._objective is None:
            base = self.config.config_dir
            if base is not None and not base.is_dir():
                base = None  # a worker on another machine: relative to its current directory
            self._objective = load_objective(self.config.objective, base)
        return self._objective

    # ------------------------------------------------------------------ the studies

    def study(self, parametrization: str, width: int, depth: int | None = None, extra: tuple = ()) -> optuna.Study:
        """The Optuna study of one cell (``sweep.study(*cell)``), created on first use.

        Args:
            parametrization: "mup", "u-mup" or "sp".
            width: the cell's width.
            depth: the cell's depth (None without `depths`).
            extra: the cell's further batch size or horizon, or ().

        Returns:
            The study, opened once per process.
        """
        return self.studies[Cell(parametrization, width, depth, tuple(extra))]

    def grid(self, parametrization: str | None = None) -> list[dict]:
        """Every grid point of `parametrization`'s studies (None: the first parametrization's), in the
        order they are enqueued (see `studies.grid`)."""
        return list(self.studies.grid(parametrization))

    def prepare(self) -> None:
        """Create the studies; for a grid sweep, enqueue every grid point once."""
        self.studies.prepare((self.run_dir / CONFIG_FILE).read_text(), self.url, self._source or str(self.run_dir))

    def prepared(self) -> bool:
        """Has `prepare` run (every study exists and, for a grid, is enqueued)?"""
        return self.studies.prepared()

    def wait_prepared(self, timeout: float) -> None:
        """Block until the sweep's own process has prepared the studies (see `Studies.wait_prepared`).

        Args:
            timeout: seconds to wait.

        Raises:
            ValueError: the sweep was not prepared in time.
        """
        self.studies.wait_prepared(timeout)

    def trials_per_cell(self, parametrization: str | None = None) -> int:
        """Trials each of `parametrization`'s studies runs (None: the first parametrization's): its
        grid points, or `n_trials` (random/TPE)."""
        return self.studies.trials_per_cell(parametrization)

    def total_trials(self) -> int:
        """Trials the whole sweep runs."""
        return self.studies.total

    # ------------------------------------------------------------------ counting

    def tally(self) -> Tally:
        """Every trial counted by outcome in one pass (finished, complete, failed, pruned, ...)."""
        return self.studies.tally()

    def finished(self) -> int:
        """Trials done: completed, diverged, pruned or failed (not retried)."""
        return self.tally().finished

    def completed(self) -> int:
        """Trials with a result (COMPLETE): not diverged, pruned or failed."""
        return self.tally().complete

    def failed(self) -> int:
        """Failed trials (the objective raised) not yet retried."""
        return self.tally().failed

    def pruned(self) -> int:
        """Trials stopped early by the pruner (done; not failures)."""
        return self.tally().pruned

    def retry_failed(self) -> int:
        """Queue every failed trial (the objective raised; not diverged) once more with the same
        params, marking the old one `retried`.

        Returns:
            How many were queued.
        """
        with ClaimLock(self.url):  # two processes retrying at once queue each trial once
            n = retry_failed(self.storage, self.studies.all(), self.config)
        self.studies.forget()  # their caches still hold the old trials without `retried`
        return n

    # ------------------------------------------------------------------ working

    def use_device(self, device: str | torch.device = "auto", what: str = "device") -> torch.device:
        """Train this process's trials on `device`, in the config's precision.

        Args:
            device: "auto" (CUDA when visible, else the CPU), "cpu", "cuda", "cuda:N" or a torch.device.
            what: the setting's name in error messages.

        Returns:
            The resolved device.

        Raises:
            ValueError: naming `what`, when the device cannot train in the precision (bf16 on an old GPU).
        """
        resolved = resolve_device(device, what)
        check_precision(self.config.precision, resolved, "precision")
        self.device = resolved
        return resolved

    def scale(
        self, parametrization: str, width: int, depth: int | None, seed: int, device: torch.device | None = None
    ) -> Scale:
        """Where a trial of this sweep runs.

        Args:
            parametrization: "mup", "u-mup" or "sp".
            width: the model's width.
            depth: the model's depth; None keeps the objective's own depth.
            seed: the run's seed.
            device: default this process's (`use_device`); the precision is the config's.

        Returns:
            The `Scale` the objective receives.
        """
        return make_scale(
            self.config, Cell(parametrization, width, depth), seed, self.device if device is None else device
        )

    def hparams(self, params: dict[str, Any], extra: tuple = ()) -> dict[str, Any]:
        """What the objective receives: [fixed], the swept values, and the cell's batch size and
        horizon (the proxy's unless the cell is one of a further batch size or horizon).

        Args:
            params: the trial's swept values.
            extra: the cell's further batch size or horizon, or ().

        Returns:
            The objective's first argument.
        """
        return {**self.config.fixed, **params, **self.config.proxy_extra, **dict(extra)}

    def context(self) -> RunContext:
        """What this process's trials run with: the config, run directory, storage, objective and device."""
        return RunContext(self.config, self.run_dir, self.storage, self.objective, self.device)

    @optuna_logs_quiet()
    def work(self, progress: bool = True, max_trials: int | None = None, wait_for_others: bool = True) -> int:
        """Claim and run trials until none is left.

        Args:
            progress: show a progress bar on stderr.
            max_trials: stop after running this many here.
            wait_for_others: once none is left to claim, wait for other workers' running trials to
                finish or go stale (a dead worker's trial is retried here).

        Returns:
            The number of trials run here.
        """
        cells = self.config.all_cells
        ctx = self.context()
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
                    # Under the claim lock: SQLite ignores SELECT … FOR UPDATE, so two processes
                    # failing one stale trial at once both queued its retry (a duplicate in the soak).
                    with ClaimLock(self.url):
                        self.studies.fail_stale()
                    stale_checked = time.monotonic() + STALE_CHECK_SECONDS
                # Cells in turn (each worker from its own offset), so all progress evenly; the
                # claim lock is held for the claim alone.
                start = (os.getpid() + ran) % len(cells)
                with ClaimLock(self.url):
                    for cell in cells[start:] + cells[:start]:
                        if self.config.sampler == "independent":  # queue the stage that is due, if any
                            enqueue_due(self.storage, self.studies[cell], self.config.space_for(cell.parametrization))
                        trial = claim(self.storage, self.studies[cell], self.config)
                        if trial is not None:
                            claimed = (cell, trial)
                            break
                if claimed is None:
                    if not wait_for_others:
                        break
                    running = self.studies.running()
                    if not running:
                        break
                    stale_checked = time.monotonic()  # while waiting, look for dead workers' trials at once
                    bar.update(f"waiting for {running} running trial(s) of other workers")
                    time.sleep(wait)
                    wait = min(2 * wait, POLL_SECONDS)
                    continue
                wait = FIRST_WAIT_SECONDS
                cell, trial = claimed
                try:
                    bar.update(f"{cell.label} trial {trial.number}")
                    failure = run_trial(ctx, self.studies[cell], trial, cell)
                except (KeyboardInterrupt, SystemExit):  # cut off before run_trial took charge: not left RUNNING
                    with sigint_ignored():  # SIGINT and SIGTERM
                        release_claimed(self.storage, self.studies[cell], trial_id(trial), self.config)
                    raise
                if failure is not None:
                    bar.write(failure)
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
        process runs no trial and never touches CUDA; the workers retry each other's dead trials).

        Args:
            procs: the worker processes.
            progress: show a progress bar on stderr.
        """
        bar = Progress(self.total_trials(), f"sweep {self.config.name}", enabled=progress)
        try:
            counted = 0.0
            while any(p.poll() is None for p in procs):
                if time.monotonic() >= counted:
                    running = self.studies.running()
                    bar.done = self.finished()
                    alive = sum(p.poll() is None for p in procs)
                    bar.update(f"{running} trial(s) running on {alive} worker(s)")
                    bar.advance(0)
                    counted = time.monotonic() + WATCH_SECONDS
                time.sleep(0.1)
            bar.done = self.finished()
        finally:
            bar.close()
