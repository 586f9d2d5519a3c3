"""Optuna RDB storage: an SQLite file by default, PostgreSQL for workers on many machines.

Trials send a heartbeat; a trial whose worker died (kill -9, a lost machine) goes stale after
`GRACE_PERIOD` seconds, is marked failed, and is put back in the queue with the same
hyperparameters (`studies.Studies.fail_stale`; after `studies.MAX_STALE_RETRIES` deaths the
point is finished as failed), so that resuming a sweep loses nothing. ``MUTRANSFER_GRACE_PERIOD``
sets another grace period (seconds; the heartbeat comes 4 times per grace period): longer for a
storage that may be slow to answer, shorter where a dead worker's trial should be rerun sooner
(the tests that kill workers). Every process of a sweep should see the same value.

(Above 500 lines: the connection, the retry of transient errors around every call, the heartbeat
and the claim lock share one notion of a transient error and one "gave up" message.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import optuna
from optuna.trial import TrialState

from ...errors import StorageError
from ..config.urls import PASSWORD_ENV, mask_url, scrub, with_password, without_password
from . import _sql

__all__ = [
    "GRACE_ENV",
    "GRACE_PERIOD",
    "HEARTBEAT_INTERVAL",
    "PASSWORD_ENV",
    "PATIENCE_ENV",
    "PATIENCE_SECONDS",
    "ClaimLock",
    "Heartbeat",
    "cache_trial",
    "default_url",
    "enqueue_many",
    "mask_url",
    "open_storage",
    "optuna_logs_quiet",
    "patience",
    "quiet",
    "set_finished_trial_user_attr",
    "set_user_attrs",
    "study_id",
    "trial_counts",
    "trial_id",
    "waiting_trial_ids",
    "with_password",
    "without_password",
]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Heartbeats and stale-trial retry are marked experimental in Optuna; they are what we rely
    on, so their warnings are silenced where we call them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        yield


@contextlib.contextmanager
def optuna_logs_quiet() -> Iterator[None]:
    """Optuna's INFO lines ("A new study created", "Trial 3 finished with value …") off while the
    sweep works, the caller's log level back afterwards (importing mutransfer changes nothing)."""
    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(old, optuna.logging.WARNING))
    try:
        yield
    finally:
        optuna.logging.set_verbosity(old)


HEARTBEAT_INTERVAL = 2  # seconds
PATIENCE_ENV = "MUTRANSFER_STORAGE_PATIENCE"
STORAGE_ENV = "MUTRANSFER_STORAGE"  # the storage URL a worker or cluster task is given (never a file)
PATIENCE_SECONDS = 120.0  # how long a transient storage error is retried (a database restart)
GRACE_PERIOD = 8  # seconds without a heartbeat before a running trial counts as dead
GRACE_ENV = "MUTRANSFER_GRACE_PERIOD"  # another grace period (the heartbeat interval follows: a quarter of it)


def default_url(run_dir: Path) -> str:
    return f"sqlite:///{(Path(run_dir) / 'sweep.db').resolve()}"


def open_storage(url: str, patient: bool = False) -> optuna.storages.RDBStorage:
    """Connect (creating Optuna's tables if needed); ValueError naming the storage if unreachable.

    Args:
        url: the storage URL.
        patient: a worker joining a sweep: a transient error (the server restarting) is retried
            for `patience()` seconds before it is reported. Otherwise (a new sweep: a typo in the
            URL should be told at once) it is reported at once.

    Returns:
        The storage; its calls retry transient errors for `patience()` seconds.
    """
    if url.startswith("journal:"):
        raise ValueError(
            f"storage {mask_url(url)}: Optuna's journal file storage records no heartbeats (Optuna "
            f"{optuna.__version__}), so a worker that dies or is preempted would leave its trial running "
            "for ever and the sweep would never finish; use postgresql://user@host/db for several "
            "machines, or the default SQLite file on one"
        )
    if url.startswith("sqlite"):
        engine: dict[str, Any] = {"connect_args": {"timeout": 30}}  # then `_PatientStorage` retries
    elif url.startswith("postgresql"):
        engine = {"connect_args": {"connect_timeout": 5}, "pool_pre_ping": True}
    else:
        raise ValueError(f"storage {mask_url(url)}: use sqlite:///path/to/file.db or postgresql://user@host/db")
    connect = with_password(url)
    grace = grace_period()
    last = None
    told = False  # a waiting worker says once why it waits
    deadline = time.monotonic() + (patience() if patient else 0.0)
    attempt = 0
    while attempt < 6:
        attempt += 1
        try:
            with quiet():
                storage = _PatientStorage(
                    connect,
                    engine_kwargs=engine,
                    heartbeat_interval=HEARTBEAT_INTERVAL if grace == GRACE_PERIOD else grace // 4,
                    grace_period=grace,  # stale trials: `Studies.fail_stale` retries them
                )
            if url.startswith("sqlite") and ":memory:" not in url:
                _sqlite_wal(storage)
            storage._label = mask_url(url)
            storage._url = connect
            return storage
        except ImportError as e:
            raise ValueError(
                f"storage {mask_url(url)}: driver missing ({e}); for PostgreSQL: pip install 'mutransfer[postgres]'"
            ) from None
        except Exception as e:  # sqlalchemy's OperationalError and friends
            last = e
            text = str(e)
            # Several processes creating Optuna's tables at once: the losers see the tables appear
            # under them. That is a race, not an unreachable server: try again.
            if any(
                k in text
                for k in ("already exists", "UniqueViolation", "DuplicateTable", "duplicate key", "UNIQUE constraint")
            ):
                time.sleep(0.2 * (attempt + 1))
                continue
            if _transient(e) and time.monotonic() < deadline:  # a worker waiting out a restart
                if not told:
                    told = True
                    print(
                        f"storage {mask_url(url)} is unreachable; retrying for up to {patience():.0f} s "
                        f"({PATIENCE_ENV}=SECONDS to change)",
                        file=sys.stderr,
                        flush=True,
                    )
                attempt = 0
                time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
                continue
            break
    first = str(last).splitlines()[0] if str(last) else type(last).__name__
    waited = f" (retried for {patience():.0f} s; wait longer with {PATIENCE_ENV}=SECONDS)" if patient else ""
    raise ValueError(f"storage {mask_url(url)} is unreachable{waited}: {scrub(first, connect)}") from None


def grace_period() -> int:
    """Seconds without a heartbeat before a running trial counts as dead: ``MUTRANSFER_GRACE_PERIOD``,
    else `GRACE_PERIOD` (8); StorageError naming the variable when it is not a whole number ≥ 4 (Optuna
    counts heartbeats in whole seconds, one every quarter of the grace period)."""
    text = os.environ.get(GRACE_ENV, "").strip()
    if not text:
        return GRACE_PERIOD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 4:
        raise StorageError(f"{GRACE_ENV} must be a whole number of seconds ≥ 4 (default {GRACE_PERIOD}), got {text!r}")
    return value


def patience() -> float:
    """Seconds a transient storage error is retried: ``MUTRANSFER_STORAGE_PATIENCE``, else
    `PATIENCE_SECONDS` (120); ValueError naming the variable when it is not a number ≥ 0."""
    text = os.environ.get(PATIENCE_ENV, "").strip()
    if not text:
        return PATIENCE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise StorageError(
            f"{PATIENCE_ENV} must be a number of seconds ≥ 0 (default {PATIENCE_SECONDS:.0f}), got {text!r}"
        )
    return value


def _transient(e: BaseException) -> bool:
    """Is `e` (or its cause) a storage error that may go away: a lost or refused connection, a
    server restarting, SQLite's "database is locked"? (Not a constraint violation or a bug.)"""
    import sqlalchemy.exc

    error: BaseException | None = e
    for _ in range(5):  # the error and its causes
        if error is None or isinstance(error, sqlalchemy.exc.IntegrityError):
            return False
        if isinstance(error, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
        if isinstance(error, sqlalchemy.exc.DBAPIError) and error.connection_invalidated:
            return True
        error = error.__cause__ or error.__context__
    return False


def _gave_up(label: str, e: BaseException, url: str) -> StorageError:
    """The error a storage call raises once transient errors lasted `patience()` seconds: the
    storage's (masked) label, the error's first line with the password in `url` scrubbed, the fix."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return StorageError(
        f"storage {label} failed for {patience():.0f} s ({scrub(first, url)[:200]}): check that the database "
        f"is up and reachable, then rerun the same command to resume (wait longer with {PATIENCE_ENV}=SECONDS)"
    )


# The storage calls a sweep makes, and those Optuna's cache makes (private ones included); each is
# retried on a transient error (see `_PatientStorage`).
_RETRIED = (
    "create_new_study get_study_id_from_name get_study_name_from_id get_study_directions "
    "get_study_user_attrs get_study_system_attrs set_study_user_attr set_study_system_attr get_all_studies "
    "create_new_trial set_trial_param get_trial_param set_trial_state_values set_trial_intermediate_value "
    "set_trial_user_attr set_trial_system_attr get_trial_id_from_study_id_trial_number get_trial "
    "get_all_trials get_best_trial get_trial_user_attrs get_trial_system_attrs record_heartbeat "
    "_get_stale_trial_ids _get_trials _create_new_trial _set_trial_param _get_best_trial_id"
).split()


class _PatientStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose calls ride out a transient error (a PostgreSQL restart, SQLite
    locked beyond its timeout): retried with exponential backoff (0.25 s doubling to 10 s) for
    `patience()` seconds, then `StorageError` naming the storage and the fix. Once it has given
    up, every later call fails at once (the process is leaving; its bookkeeping must not wait again).
    A write whose commit reached the server just before the connection broke may be applied
    twice; Optuna's writes are state changes that refuse a second application, or idempotent."""

    _label = "?"
    _url = ""  # the URL connected to, password included: only to scrub it from error messages
    _gave_up: StorageError | None = None


def _patient(name: str):
    method = getattr(optuna.storages.RDBStorage, name, None) or globals().get(f"_{name}") or getattr(_sql, name)

    def call(self, *args, **kwargs):
        if self._gave_up is not None:
            raise self._gave_up
        deadline = None
        wait = 0.25
        while True:
            try:
                return method(self, *args, **kwargs)
            except Exception as e:
                if not _transient(e):
                    raise
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + patience()
                if now >= deadline:
                    self._gave_up = _gave_up(self._label, e, self._url)
                    raise self._gave_up from None
                time.sleep(min(wait, max(0.0, deadline - now)))
                wait = min(2 * wait, 10.0)

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


for _name in _RETRIED + [
    "waiting_trial_ids",
    "trial_counts",
    "enqueue_many",
    "set_user_attrs",
    "set_finished_user_attr",
]:
    setattr(_PatientStorage, _name, _patient(_name))


def trial_counts(storage: optuna.storages.RDBStorage, study_id: int) -> dict[TrialState, int]:
    """How many trials of the study `study_id` are in each state, counted by the database.

    Args:
        storage: the sweep's storage.
        study_id: the study's storage id.

    Returns:
        A count per state present (states with no trial are missing).
    """
    if isinstance(storage, _PatientStorage):
        return storage.trial_counts(study_id)  # type: ignore[attr-defined]
    return _sql.trial_counts(storage, study_id)


def enqueue_many(storage: optuna.storages.RDBStorage, study_id: int, points: list[dict]) -> None:
    """Queue a WAITING trial for each of `points` (hyperparameter values) in one transaction.

    Args:
        storage: the sweep's storage.
        study_id: the study's storage id.
        points: one dict of hyperparameter values per trial, in queue order.
    """
    if isinstance(storage, _PatientStorage):
        storage.enqueue_many(study_id, points)  # type: ignore[attr-defined]
    else:
        _sql.enqueue_many(storage, study_id, points)


def set_user_attrs(storage: optuna.storages.RDBStorage, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """`trial.set_user_attr` for each of `attrs`, in one transaction instead of one commit each.

    Args:
        storage: the sweep's storage (the trial's study's).
        trial: a running trial.
        attrs: attribute names and JSON-serializable values.
    """
    if isinstance(storage, _PatientStorage):
        storage.set_user_attrs(trial_id(trial), attrs)  # type: ignore[attr-defined]
    else:
        _sql.set_user_attrs(storage, trial_id(trial), attrs)
    cached = getattr(trial, "_cached_frozen_trial", None)  # what `trial.user_attrs` shows
    if cached is not None:
        cached.user_attrs.update(attrs)


def cache_trial(study: optuna.Study, trial_id: int) -> None:
    """Make a trial claimed from the database known to `study`'s Optuna cache, reading that one trial.

    Optuna's cached storage accepts params for a trial only once it has read it, and reading a study
    through it re-reads every unfinished trial: a grid's thousands of WAITING trials on each claim,
    so per-trial cost grew with the grid. This registers the one trial as Optuna's own read would
    (an unfinished trial, re-read until it finishes); with another Optuna cache layout it falls
    back to reading the study's RUNNING trials.

    Args:
        study: the study the trial belongs to.
        trial_id: the trial's storage id.
    """
    cache = study._storage
    try:
        frozen = cache._backend.get_trial(trial_id)  # type: ignore[attr-defined]
        with cache._lock:  # type: ignore[attr-defined]
            info = cache._studies.get(study_id(study))  # type: ignore[attr-defined]
            if info is None:
                raise AttributeError("study not cached yet")
            cache._add_trials_to_cache(study_id(study), [frozen])  # type: ignore[attr-defined]
            info.unfinished_trial_ids.add(trial_id)
    except AttributeError:
        study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def waiting_trial_ids(storage: optuna.storages.RDBStorage, study_id: int, limit: int = 8) -> list[int]:
    """The ids of the first `limit` WAITING trials of the study `study_id`, by trial number.

    Args:
        storage: the sweep's storage.
        study_id: the study's storage id.
        limit: how many at most.

    Returns:
        Trial ids, oldest first.
    """
    if isinstance(storage, _PatientStorage):
        return storage.waiting_trial_ids(study_id, limit)  # type: ignore[attr-defined]
    return _sql.waiting_trial_ids(storage, study_id, limit)


def _sqlite_wal(storage: optuna.storages.RDBStorage) -> None:
    """Write-ahead logging and synchronous=NORMAL on every connection to an SQLite file.

    In SQLite's default rollback journal every commit (a trial records 5–6) waits for an fsync and
    a writer blocks readers, so local workers queue behind each other's bookkeeping. WAL lets
    readers run beside the writer and NORMAL syncs at checkpoints only; a killed process loses no
    committed trial (a power cut may lose the last few, never the file's consistency). WAL needs
    every process on one machine, which is what SQLite storage is for (PostgreSQL otherwise).
    """
    import sqlalchemy

    def pragmas(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()  # connections opened while creating the tables predate the listener


class Heartbeat:
    """Records a trial's heartbeat from a background thread while the trial runs."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int):
        self.storage, self.trial_id = storage, trial_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a transient database error must not kill the trial
                pass
            self._stop.wait(self.storage.heartbeat_interval or HEARTBEAT_INTERVAL)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class ClaimLock:
    """Serializes trial claims (and a sweep's preparing) between processes sharing a storage.

    Optuna claims a waiting trial with SELECT … FOR UPDATE, which SQLite ignores: two workers can
    both see a trial WAITING and both take it (seen in a test, as "Cannot tell a COMPLETE trial").
    An exclusive flock on a file beside the database makes the claim atomic; PostgreSQL's row locks
    need nothing for claims. Preparing a sweep (creating its studies, enqueueing the grid once)
    passes `storage`: on PostgreSQL the lock is then a session-level advisory lock in the
    database, so two `mutransfer sweep` started together on any machines enqueue once. Where
    flock does not exist the SQLite lock is a no-op.

    Args:
        url: the storage URL.
        storage: the opened storage; given, a PostgreSQL storage is locked too (advisory lock).
    """

    _ADVISORY_KEY = 0x6D7554  # "muT": the one advisory lock mutransfer takes

    def __init__(self, url: str, storage: optuna.storages.RDBStorage | None = None):
        self.path: str | None = None
        if url.startswith("sqlite:///") and ":memory:" not in url:
            self.path = url[len("sqlite:///") :] + ".claim-lock"
        self._engine = storage.engine if storage is not None and url.startswith("postgresql") else None
        self._file: IO[str] | None = None
        self._connection: Any = None

    def __enter__(self) -> ClaimLock:
        if self._engine is not None:
            self._connection = self._advisory_lock()
        if self.path is not None:
            try:
                import fcntl
            except ImportError:  # not POSIX
                return self
            self._file = handle = open(self.path, "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            import fcntl

            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._connection is not None:
            import sqlalchemy

            try:
                self._connection.execute(sqlalchemy.text(f"SELECT pg_advisory_unlock({self._ADVISORY_KEY})"))
                self._connection.commit()
            except Exception:  # the server went away: its session, and so the lock, ended with it
                pass
            finally:
                with contextlib.suppress(Exception):
                    self._connection.close()
                self._connection = None

    def _advisory_lock(self) -> Any:
        """A connection holding the advisory lock; a server that is down (restarting) is waited for
        `patience()` seconds, then `StorageError`."""
        engine = self._engine
        if engine is None:  # pragma: no cover  (only called with an engine)
            return None
        import sqlalchemy

        deadline = time.monotonic() + patience()
        while True:
            try:
                connection = engine.connect()
                connection.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({self._ADVISORY_KEY})"))
                return connection
            except Exception as e:
                if not _transient(e) or time.monotonic() >= deadline:
                    url = engine.url.render_as_string(hide_password=False)
                    raise _gave_up(mask_url(str(engine.url)), e, url) from None
                time.sleep(1.0)


def set_finished_trial_user_attr(storage: optuna.storages.RDBStorage, trial_id: int, key: str, value: Any) -> None:
    """Set a user attribute on a trial that has already finished (Optuna's API refuses: finished
    trials are immutable there). Used for the note `retried` on a failed trial once a retry of it
    is queued. Studies opened before this call may still show the trial without it (Optuna caches
    finished trials): open the study again to see it.

    Args:
        storage: the sweep's storage.
        trial_id: the trial's storage id.
        key: the attribute's name.
        value: a JSON-serializable value.
    """
    if isinstance(storage, _PatientStorage):
        storage.set_finished_user_attr(trial_id, key, value)  # type: ignore[attr-defined]
    else:
        _sql.set_finished_user_attr(storage, trial_id, key, value)


# Optuna exposes no public accessor for the storage ids of a study or trial (a Study's and a
# FrozenTrial's ``_study_id`` / ``_trial_id``); the runner needs them to claim trials and
# record heartbeats through the storage. These two functions are the only readers.
def study_id(study: optuna.Study) -> int:
    """The storage id of an Optuna study."""
    return study._study_id


def trial_id(trial) -> int:
    """The storage id of an Optuna Trial or FrozenTrial."""
    return trial._trial_id
