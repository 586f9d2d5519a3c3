"""Run a sweep: one Optuna study per (parametrization, width[, depth]), workers claiming trials.

A run directory holds ``config.toml`` (the sweep's config, copied at creation) and, with the
default storage, ``sweep.db``. Any number of workers — local processes or other machines —
run `work()` on the same storage; each claims a trial atomically (grid points are enqueued once,
up front), trains it and records the loss. Diverged trials (NaN/inf loss) are recorded and the
sweep goes on. A trial whose worker died is retried (see `storage`).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from itertools import product
from pathlib import Path
from typing import Optional, Union

import optuna
from optuna.trial import TrialState

from ..progress import Progress
from .config import SweepConfig, load_config
from .objective import Objective, Scale, load_objective
from .space import Choice, Dimension, LogUniform
from .storage import ClaimLock, Heartbeat, default_url, mask_url, open_storage, quiet

CONFIG_FILE = "config.toml"
STORAGE_ENV = "MUTRANSFER_STORAGE"
POLL_SECONDS = 1.0
optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_name(config: SweepConfig, parametrization: str, width: int, depth: Optional[int] = None) -> str:
    """`{name}/{parametrization}/w{width}`, plus `/d{depth}` in a sweep over depths."""
    name = f"{config.name}/{parametrization}/w{width}"
    return name if depth is None else f"{name}/d{depth}"


def cell_label(parametrization: str, width: int, depth: Optional[int] = None) -> str:
    """'mup width 32' or 'mup width 32 depth 4', for progress lines."""
    return f"{parametrization} width {width}" + ("" if depth is None else f" depth {depth}")


class Sweep:
    """A sweep's run directory, config, storage and studies."""

    def __init__(self, run_dir: Union[str, os.PathLike], storage: Optional[str] = None, wait: float = 0.0):
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
            raise ValueError(f"{self.run_dir} is not a sweep run directory (no {CONFIG_FILE}); start one with "
                             "`mutransfer sweep CONFIG --run DIR`, or pass the sweep's name and --storage")
        self.config = load_config(path)
        self.url = storage or self.config.storage or default_url(self.run_dir)
        self.storage = open_storage(self.url)
        self._objective: Optional[Objective] = None
        self._studies: dict[tuple[str, int, Optional[int]], optuna.Study] = {}

    @classmethod
    def create(cls, config_path: Union[str, os.PathLike], run_dir: Union[str, os.PathLike],
               storage: Optional[str] = None) -> "Sweep":
        """Make (or reopen) the run directory for `config_path`; a rerun must use the same config."""
        config = load_config(config_path)  # validates before anything is written
        run_dir = Path(run_dir)
        target = run_dir / CONFIG_FILE
        if target.is_file():
            if load_config(target).raw != config.raw:
                raise ValueError(f"{run_dir} already holds a sweep with a different config; "
                                 "use a new --run directory or the same config to resume")
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(config_path, target)
        return cls(run_dir, storage)

    @property
    def objective(self) -> Objective:
        if self._objective is None:
            self._objective = load_objective(self.config.objective)
        return self._objective

    def study(self, parametrization: str, width: int, depth: Optional[int] = None) -> optuna.Study:
        key = (parametrization, width, depth)
        if key not in self._studies:
            seed = (1000 * width + (parametrization == "sp") + 7919 * (depth or 0)) % 2 ** 32
            sampler = (optuna.samplers.TPESampler(seed=seed) if self.config.sampler == "tpe"
                       else optuna.samplers.RandomSampler(seed=seed))
            self._studies[key] = optuna.create_study(storage=self.storage, sampler=sampler, direction="minimize",
                                                     study_name=study_name(self.config, *key), load_if_exists=True)
        return self._studies[key]

    # ------------------------------------------------------------------ preparing

    def grid(self) -> list[dict]:
        names = list(self.config.space)
        return [dict(zip(names, values)) for values in product(*(d.grid_points() for d in self.config.space.values()))]

    def prepare(self) -> None:
        """Create the studies; for a grid sweep, enqueue every grid point once."""
        for cell in self.config.cells:
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
        for cell in self.config.cells:
            summary = names.get(study_name(self.config, *cell))
            if summary is None or (self.config.sampler == "grid" and not summary.user_attrs.get("enqueued")):
                return False
        return True

    def wait_prepared(self, timeout: float) -> None:
        """Block until the sweep's own process has prepared the studies (a worker may start first)."""
        deadline = time.monotonic() + timeout
        while not self.prepared():
            if time.monotonic() > deadline:
                raise ValueError(f"sweep {self.config.name} was not prepared within {timeout:.0f} s; "
                                 "start it with `mutransfer sweep CONFIG` first")
            time.sleep(POLL_SECONDS)

    def total_trials(self) -> int:
        per_cell = len(self.grid()) if self.config.sampler == "grid" else self.config.n_trials
        return per_cell * len(self.config.cells)

    # ------------------------------------------------------------------ working

    def _claim(self, study: optuna.Study) -> Optional[optuna.Trial]:
        """Atomically take a waiting trial, or (random/TPE) start a new one while trials are due."""
        for frozen in self.storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.WAITING,)):
            try:
                if self.storage.set_trial_state_values(frozen._trial_id, TrialState.RUNNING):
                    # A first heartbeat at once: a trial with none is never found stale, so a worker
                    # dying before its heartbeat thread starts would block the sweep for good.
                    self.storage.record_heartbeat(frozen._trial_id)
                    return optuna.Trial(study, frozen._trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        if self.config.sampler == "grid":
            return None
        counted = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
        done = len(study.get_trials(deepcopy=False, states=counted))
        diverged = sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                       if t.user_attrs.get("diverged"))
        if done + diverged >= self.config.n_trials:
            return None
        with quiet():  # we send the heartbeats ourselves (see Heartbeat)
            trial = study.ask()
        self.storage.record_heartbeat(trial._trial_id)
        return trial

    def _suggest(self, trial: optuna.Trial, name: str, dim: Dimension):
        if isinstance(dim, Choice):
            return trial.suggest_categorical(name, list(dim.values))
        return trial.suggest_float(name, dim.low, dim.high, log=isinstance(dim, LogUniform))

    def scale(self, parametrization: str, width: int, depth: Optional[int], seed: int) -> Scale:
        """Where a trial of this sweep runs; depth None keeps the objective's own depth."""
        return Scale(width, self.config.base_width, parametrization, seed, depth,
                     None if depth is None else self.config.base_depth)

    def _run(self, study: optuna.Study, trial: optuna.Trial, parametrization: str, width: int,
             depth: Optional[int] = None) -> None:
        params = {name: self._suggest(trial, name, dim) for name, dim in self.config.space.items()}
        hparams = {**self.config.fixed, **params}
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        start = time.perf_counter()
        with Heartbeat(self.storage, trial._trial_id):
            try:
                losses = [float(self.objective(dict(hparams), self.scale(parametrization, width, depth, seed)))
                          for seed in self.config.seeds]
            except Exception as e:
                trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:500])
                study.tell(trial, state=TrialState.FAIL)
                raise
        try:
            trial.set_user_attr("seconds", time.perf_counter() - start)
            trial.set_user_attr("losses", [l if math.isfinite(l) else None for l in losses])
            if all(math.isfinite(l) for l in losses):
                study.tell(trial, sum(losses) / len(losses), skip_if_finished=True)
            else:
                trial.set_user_attr("diverged", True)
                study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker finished this very trial first (same HPs and seeds: same result)

    def finished(self) -> int:
        n = 0
        for cell in self.config.cells:
            for t in self.study(*cell).get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
                n += t.state == TrialState.COMPLETE or bool(t.user_attrs.get("diverged"))
        return n

    def work(self, progress: bool = True, max_trials: Optional[int] = None) -> int:
        """Claim and run trials until none is left (waiting for other workers' running trials to
        finish or go stale, so that a dead worker's trial is retried). Returns trials run here."""
        cells = self.config.cells
        bar = Progress(self.total_trials(), f"sweep {self.config.name}", enabled=progress)
        bar.done = self.finished()
        ran = 0
        while max_trials is None or ran < max_trials:
            claimed = None
            with quiet():
                for cell in cells:
                    optuna.storages.fail_stale_trials(self.study(*cell))
            with ClaimLock(self.url):
                for cell in sorted(cells, key=lambda c: len(self.study(*c).get_trials(deepcopy=False))):
                    trial = self._claim(self.study(*cell))
                    if trial is not None:
                        claimed = (cell, trial)
                        break
            if claimed is None:
                running = sum(len(self.study(*c).get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
                              for c in cells)
                if not running:
                    break
                bar.update(f"waiting for {running} running trial(s) of other workers")
                time.sleep(POLL_SECONDS)
                continue
            cell, trial = claimed
            bar.update(f"{cell_label(*cell)} trial {trial.number}")
            self._run(self.study(*cell), trial, *cell)
            ran += 1
            bar.done = self.finished()
            bar.advance(0)
        bar.close()
        return ran


def _fetch_config(storage, name: str, path: Path) -> None:
    """Write the config of the sweep called `name` from its studies in `storage` to `path`."""
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name.startswith(f"{name}/") and "config_toml" in summary.user_attrs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(summary.user_attrs["config_toml"])
            return


def run_sweep(config_path: Union[str, os.PathLike], run_dir: Union[str, os.PathLike], workers: int = 1,
              storage: Optional[str] = None, progress: bool = True) -> Sweep:
    """Create/resume the sweep and run it with `workers` local processes (this one included)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    sweep = Sweep.create(config_path, run_dir, storage)
    sweep.objective  # fail now on a bad objective, not in every worker
    sweep.prepare()
    env = dict(os.environ, **{STORAGE_ENV: sweep.url})  # not on the command line: it may hold a password
    procs = [subprocess.Popen([sys.executable, "-m", "mutransfer.cli", "worker", str(sweep.run_dir), "--no-progress"],
                              env=env) for _ in range(workers - 1)]
    try:
        sweep.work(progress=progress)
    finally:
        codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"{sum(1 for c in codes if c)} worker process(es) failed (exit codes {codes})")
    with open(sweep.run_dir / "run.json", "w") as f:
        json.dump({"storage": mask_url(sweep.url), "finished_trials": sweep.finished(),
                   "total_trials": sweep.total_trials()}, f, indent=1)
    return sweep
