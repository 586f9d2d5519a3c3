"""The sweep's own writes on Optuna's tables (`mutransfer.sweep.engine.storage`): the rows Optuna would
write, and Optuna's refusals kept."""

import optuna
import pytest

from mutransfer.sweep.engine.storage import open_storage, set_user_attrs


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_set_user_attrs_writes_what_optuna_reads_overwrites_and_refuses_a_finished_trial(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    set_user_attrs(storage, trial, {"seconds": 1.5, "losses": [3.0, None], "where": {"device": "cpu"}})
    set_user_attrs(storage, trial, {"seconds": 2.5, "worker": "host:1"})  # one key again, one new
    set_user_attrs(storage, trial, {})
    assert trial.user_attrs["seconds"] == 2.5  # the running trial's own view follows
    study.tell(trial, 1.0)
    fresh = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}").trials[0]
    assert fresh.user_attrs == {"seconds": 2.5, "losses": [3.0, None], "where": {"device": "cpu"}, "worker": "host:1"}
    with pytest.raises(RuntimeError, match="finished"):  # as Optuna's set_user_attr refuses
        set_user_attrs(storage, trial, {"late": 1})
    assert "late" not in optuna.load_study(study_name="s", storage=storage).trials[0].user_attrs
