"""The sweep's own SQL on Optuna's tables: the few reads and writes whose Optuna API costs grow with
the study (every trial built, or a commit per row), each one indexed query or one transaction. Optuna's
schema is read and written as Optuna itself does (its ORM models and row builder); nothing is added to it.
`storage` wraps each in its retry of transient errors (use those)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState


def waiting_trial_ids(storage: optuna.storages.RDBStorage, study_id: int, limit: int = 8) -> list[int]:
    """The ids of the first `limit` WAITING trials of a study, by number (one indexed query; Optuna's
    get_all_trials builds every waiting trial, and a 5,000-point grid made each claim slow)."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(storage.scoped_session) as session:
        rows = (
            session.query(models.TrialModel.trial_id)
            .filter(models.TrialModel.study_id == study_id, models.TrialModel.state == TrialState.WAITING)
            .order_by(models.TrialModel.number)
            .limit(limit)
            .all()
        )
    return [row[0] for row in rows]


def trial_counts(storage: optuna.storages.RDBStorage, study_id: int) -> dict[TrialState, int]:
    """How many trials of a study are in each state (one indexed COUNT … GROUP BY: no trial is built)."""
    import sqlalchemy
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(storage.scoped_session) as session:
        rows = (
            session.query(models.TrialModel.state, sqlalchemy.func.count(models.TrialModel.trial_id))
            .filter(models.TrialModel.study_id == study_id)
            .group_by(models.TrialModel.state)
            .all()
        )
    return {TrialState(state): int(n) for state, n in rows}


def enqueue_many(storage: optuna.storages.RDBStorage, study_id: int, points: list[dict]) -> None:
    """Queue one WAITING trial per point (its `fixed_params`), all in one transaction: the rows
    `Study.enqueue_trial` writes, through Optuna's own row builder, without a commit (and on SQLite an
    fsync) per point. All or nothing: an interrupted call leaves none of them."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import create_trial

    if not points:
        return
    with _create_scoped_session(storage.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        for params in points:
            template = create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": params})
            storage._get_prepared_new_trial(study_id, template, session)


def _write_user_attrs(session, trial_id: int, attrs: dict) -> None:
    """A trial's user-attribute rows for `attrs`' keys deleted and written again, in one insert: the
    rows Optuna writes (`value_json` = `json.dumps(value)`), without its per-attribute read and commit."""
    import json

    import sqlalchemy
    from optuna.storages._rdb import models

    table = models.TrialUserAttributeModel
    session.query(table).filter(table.trial_id == trial_id, table.key.in_(list(attrs))).delete(
        synchronize_session=False
    )
    rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in attrs.items()]
    session.execute(sqlalchemy.insert(table), rows)


def set_user_attrs(storage: optuna.storages.RDBStorage, trial_id: int, attrs: dict) -> None:
    """Set several user attributes of a running trial in one transaction of three statements: the
    trial's state (refused unless running, as Optuna refuses), then `_write_user_attrs`. Optuna's
    `set_trial_user_attr` commits each attribute and reads the trial back for each (~12 ms per
    attribute on SQLite)."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    if not attrs:
        return
    with _create_scoped_session(storage.scoped_session) as session:
        state = session.query(models.TrialModel.state).filter(models.TrialModel.trial_id == trial_id).one_or_none()
        if state is None:
            raise KeyError(models.NOT_FOUND_MSG)
        storage.check_trial_is_updatable(trial_id, state[0])
        _write_user_attrs(session, trial_id, attrs)


def set_finished_user_attr(storage: optuna.storages.RDBStorage, trial_id: int, key: str, value: object) -> None:
    """Set one user attribute of a trial in any state (Optuna refuses finished trials), in one
    transaction (`_write_user_attrs`)."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(storage.scoped_session) as session:
        models.TrialModel.find_or_raise_by_id(trial_id, session)
        _write_user_attrs(session, trial_id, {key: value})
