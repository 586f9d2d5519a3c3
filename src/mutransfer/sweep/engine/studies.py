"""A sweep's Optuna studies, one per `Cell`: created or loaded once per process, the grid enqueued
once, up front (centre first with a pruner), and the questions asked of all of them together
(prepared? how many trials, by outcome? how many running?)."""

from __future__ import annotations

import hashlib
import json
import time
from itertools import product
from typing import NamedTuple

import optuna
from optuna.trial import TrialState

from ...errors import ConfigError
from ..config.cells import Cell
from ..config.config import SweepConfig
from .independent import plan_size
from .storage import ClaimLock, enqueue_many, optuna_logs_quiet, quiet, study_id, trial_counts
from .trials import trial_outcome

__all__ = ["MAX_STALE_RETRIES", "POLL_SECONDS", "Studies", "Tally", "config_hash", "grid", "tally"]

POLL_SECONDS = 1.0
_DONE_STATES = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


class Tally(NamedTuple):
    """The sweep's trials counted by outcome, in one pass over its studies (see `tally`)."""

    total: int  # trials the sweep runs: its grid points (or n_trials) × its cells
    complete: int
    diverged: int
    failed: int  # the objective raised, not yet retried
    pruned: int

    @property
    def finished(self) -> int:
        """Trials done: completed, diverged, pruned or failed (not retried)."""
        return self.complete + self.diverged + self.failed + self.pruned

    @property
    def unfinished(self) -> int:
        """Trials still to run (waiting, running, or replaced by a queued retry)."""
        return self.total - self.finished


def tally(studies: list[optuna.Study], total: int, storage: optuna.storages.RDBStorage | None = None) -> Tally:
    """Count the outcomes of every trial of `studies` once.

    With `storage`, the database counts COMPLETE and PRUNED trials and only FAIL trials (each
    needs its attributes: diverged, failed, or replaced by a retry) are read: the cost does not
    grow with the finished or waiting trials. Without it, every done trial is read through the
    studies' Optuna cache.

    Args:
        studies: the sweep's studies (one per cell).
        total: how many trials the sweep runs in all.
        storage: the studies' storage (the sweep's `RDBStorage`), to count in the database.

    Returns:
        The counts by outcome.
    """
    counts = dict.fromkeys(("complete", "diverged", "failed", "pruned"), 0)
    for study in studies:
        if storage is None:
            trials = study.get_trials(deepcopy=False, states=_DONE_STATES)
        else:
            by_state = trial_counts(storage, study_id(study))
            counts["complete"] += by_state.get(TrialState.COMPLETE, 0)
            counts["pruned"] += by_state.get(TrialState.PRUNED, 0)
            trials = []
            if by_state.get(TrialState.FAIL):
                trials = storage.get_all_trials(study_id(study), deepcopy=False, states=(TrialState.FAIL,))
        for t in trials:
            outcome = trial_outcome(t)
            if outcome is not None:
                counts[outcome] += 1
    return Tally(total, counts["complete"], counts["diverged"], counts["failed"], counts["pruned"])


def grid(config: SweepConfig, parametrization: str | None = None) -> list[dict]:
    """Every grid point of the config's space, in the order they are enqueued.

    Args:
        config: the sweep's config.
        parametrization: whose space (`SweepConfig.space_for`: its own ``[mup.space.*]`` or
            ``[sp.space.*]`` ranges); None: the first of the config's parametrizations.

    Returns:
        One dict of hyperparameter values per point: ascending, or centre first then outwards
        with a pruner (good references first, so that the clearly bad ends are pruned early).
    """
    space = config.space_for(parametrization or config.parametrizations[0])
    names = list(space)
    axes = [d.grid_points() for d in space.values()]
    points = list(product(*(range(len(a)) for a in axes)))
    if config.pruner != "none":
        points = sorted(points, key=lambda ix: _centre_distance(ix, [len(a) for a in axes]))
    return [{n: a[i] for n, a, i in zip(names, axes, ix)} for ix in points]


def _centre_distance(index: tuple, sizes: list[int]) -> tuple:
    """Sort key of a grid point (indices per HP): its distance from the grid's middle in grid
    steps, then the lower side first."""
    offsets = tuple(i - (n - 1) / 2 for i, n in zip(index, sizes))
    return (sum(o * o for o in offsets), offsets)


class Studies:
    """The studies of one sweep on one storage, each opened once and kept.

    Args:
        config: the sweep's config (its cells, sampler and pruner).
        storage: the Optuna storage the studies live in.
    """

    def __init__(self, config: SweepConfig, storage: optuna.storages.RDBStorage):
        self.config = config
        self.storage = storage
        self._open: dict[Cell, optuna.Study] = {}
        self._grids: dict[str, list[dict]] = {}

    def __getitem__(self, cell: Cell | tuple) -> optuna.Study:
        """The study of `cell` (a `Cell` or the equal tuple), created on first use."""
        key = Cell(*cell)
        if key not in self._open:
            self._open[key] = self._create(key)
        return self._open[key]

    def all(self) -> list[optuna.Study]:
        """Every study of the sweep, in the order of `SweepConfig.all_cells`."""
        return [self[cell] for cell in self.config.all_cells]

    def forget(self) -> None:
        """Drop the opened studies (Optuna caches finished trials: reopen to see changes made to them)."""
        self._open.clear()

    @optuna_logs_quiet()  # on creation only: a log-level change clears logging's caches
    def _create(self, cell: Cell) -> optuna.Study:
        seed = cell.sampler_seed
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
            study_name=cell.study_name(self.config.name),
            load_if_exists=True,
        )

    def grid(self, parametrization: str | None = None) -> list[dict]:
        """`parametrization`'s grid points in enqueueing order (see `grid`), computed once."""
        p = parametrization or self.config.parametrizations[0]
        if p not in self._grids:
            self._grids[p] = grid(self.config, p)
        return self._grids[p]

    def trials_per_cell(self, parametrization: str | None = None) -> int:
        """Trials each of `parametrization`'s studies runs: its grid points, the independent search's
        points (`independent.plan_size`), or `n_trials` (random/TPE)."""
        if self.config.sampler == "independent":
            return plan_size(self.config.space_for(parametrization or self.config.parametrizations[0]))
        return len(self.grid(parametrization)) if self.config.sampler == "grid" else self.config.n_trials

    @property
    def total(self) -> int:
        """Trials the whole sweep runs."""
        return sum(self.trials_per_cell(cell.parametrization) for cell in self.config.all_cells)

    @optuna_logs_quiet()
    def prepare(self, config_toml: str, url: str, source: str = "") -> None:
        """Create the studies; for a grid sweep, enqueue every grid point once.

        Under the sweep's `ClaimLock` (a file lock on SQLite, an advisory lock on PostgreSQL):
        two processes preparing the same sweep at once enqueue the grid once between them.

        Args:
            config_toml: the run's copy of the config, kept on each study so that workers on
                other machines can join by the sweep's name.
            url: the storage's URL (for the lock).
            source: where the config comes from (shown when another config has the same name).

        Raises:
            ConfigError: the storage holds a sweep of the same `name` made from a different config.
        """
        digest = config_hash(self.config)
        with ClaimLock(url, self.storage):
            for cell, study in zip(self.config.all_cells, self.all()):
                attrs = self.storage.get_study_user_attrs(study_id(study))  # fresh, not a cache
                if "config_toml" in attrs:
                    self._check_same(attrs, digest, study.study_name, source)
                else:
                    study.set_user_attr("config_toml", config_toml)
                    study.set_user_attr("config_hash", digest)
                    study.set_user_attr("config_source", source)
                if self.config.sampler == "grid" and not attrs.get("enqueued"):
                    # The points an interrupted earlier prepare enqueued are read once: Optuna's
                    # skip_if_exists reads every trial per point (5,000 points took > 45 min).
                    # Then the missing points go in one transaction (a commit per point took ~5 min
                    # for 5,000), and the mark after them: a prepare cut off in between is redone.
                    queued: set[str] = set()
                    if trial_counts(self.storage, study_id(study)):
                        trials = self.storage.get_all_trials(study_id(study), deepcopy=False)
                        queued = {_key(t.system_attrs.get("fixed_params")) for t in trials}
                    missing = [params for params in self.grid(cell.parametrization) if _key(params) not in queued]
                    enqueue_many(self.storage, study_id(study), missing)
                    study.set_user_attr("enqueued", True)

    def _check_same(self, attrs: dict, digest: str, study_name: str, source: str) -> None:
        """Refuse a study made from another config of the same name (they would share trials)."""
        old = attrs.get("config_hash")
        if old is None or old == digest:  # None: made before hashes were kept; not compared
            return
        where = attrs.get("config_source") or "an earlier config"
        raise ConfigError(
            f"sweep name {self.config.name!r}: the storage already holds a sweep of this name made from "
            f"a different config ({where}, config hash {old}; this one: {source or 'this config'}, hash {digest}); "
            f"study {study_name} would mix their trials. Give this config its own `name`, or use "
            "another --storage (or run directory)"
        )

    def prepared(self) -> bool:
        """Has `prepare` run (every study exists and, for a grid, is enqueued)?"""
        summaries = optuna.study.get_all_study_summaries(self.storage, include_best_trial=False)
        names = {s.study_name: s for s in summaries}
        for cell in self.config.all_cells:
            summary = names.get(cell.study_name(self.config.name))
            if summary is None or (self.config.sampler == "grid" and not summary.user_attrs.get("enqueued")):
                return False
        return True

    def wait_prepared(self, timeout: float) -> None:
        """Block until the sweep's own process has prepared the studies (a worker may start first).

        Args:
            timeout: seconds to wait.

        Raises:
            ValueError: the sweep was not prepared in time.
        """
        deadline = time.monotonic() + timeout
        while not self.prepared():
            if time.monotonic() > deadline:
                raise ValueError(
                    f"sweep {self.config.name} was not prepared within {timeout:.0f} s; "
                    "start it with `mutransfer sweep CONFIG` first"
                )
            time.sleep(POLL_SECONDS)

    def tally(self) -> Tally:
        """Every study's trials counted by outcome, in one pass."""
        return tally(self.all(), self.total, self.storage)

    def running(self) -> int:
        """Trials running now, on any worker (counted by the database)."""
        return sum(trial_counts(self.storage, study_id(s)).get(TrialState.RUNNING, 0) for s in self.all())

    def fail_stale(self) -> int:
        """Mark the trials of dead workers (heartbeat stale) FAIL and queue each again, at most
        `MAX_STALE_RETRIES` times per grid point: a point whose worker died that many times in a row
        (an objective that kills its process: out of memory, a segfault) is finished as failed
        with the error "worker died N times" instead, so that the sweep ends; `retry_failed`
        (``--retry-failed``) reruns it like any failed trial.

        Returns:
            How many points were finished as failed here.
        """
        gave_up = 0
        with quiet():
            for study in self.all():
                for tid in self.storage._get_stale_trial_ids(study_id(study)):
                    gave_up += _fail_stale_trial(self.storage, study, tid)
        return gave_up


# Optuna's retry of a stale trial (renamed in Optuna 4.9)
_RETRY = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
MAX_STALE_RETRIES = 3  # re-queues of a grid point whose worker died, before it is finished as failed


def _fail_stale_trial(storage: optuna.storages.RDBStorage, study: optuna.Study, tid: int) -> int:
    """Fail one stale trial: queue it again (Optuna's retry: same params, `retry_history`
    extended), or after `MAX_STALE_RETRIES` retries record it as failed (its user attributes set
    while it still runs, so that no process ever caches it FAIL without them). Returns 1 when it
    was finished as failed, else 0 (also when another process failed it first)."""
    try:
        frozen = storage.get_trial(tid)
        deaths = len(_RETRY.retry_history(frozen)) + 1
        if deaths > MAX_STALE_RETRIES:
            storage.set_trial_user_attr(tid, "failed", True)
            storage.set_trial_user_attr(tid, "stale", True)
            storage.set_trial_user_attr(
                tid,
                "error",
                f"worker died {deaths} times (killed, out of memory or crashed while training this trial; "
                "no traceback): fix the cause, then rerun with --retry-failed",
            )
            storage.set_trial_user_attr(tid, "traceback", "")
        if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
            return 0
    except optuna.exceptions.UpdateFinishedTrialError:
        return 0  # another process failed it first (and queued its retry)
    if deaths > MAX_STALE_RETRIES:
        return 1
    _RETRY()(study, storage.get_trial(tid))
    return 0


def _key(params: dict | None) -> str:
    """A grid point as a comparable string."""
    return json.dumps(params, sort_keys=True, default=repr)


def config_hash(config: SweepConfig) -> str:
    """A short hash of what a config says (`SweepConfig.contents`: not where it lives).

    Args:
        config: a sweep's config.

    Returns:
        12 hex digits, equal for configs that say the same.
    """
    text = json.dumps(config.contents, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
