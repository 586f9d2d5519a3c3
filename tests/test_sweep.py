"""Sweeps on SQLite: configs, grid/random/TPE, workers, divergence, kill -9 and resume, report, transfer."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import optuna
import pytest
from optuna.trial import TrialState

from mutransfer.cli import main
from mutransfer.sweep import Sweep, config_from_dict, mask_url
from mutransfer.sweep.analysis import drift, load_results, max_drift_steps

OBJECTIVE = textwrap.dedent('''
    import math, time

    def train(hp, scale):
        """A synthetic loss whose optimum is at lr 2^-6 in µP and drifts as 1/width in SP."""
        time.sleep(float(hp.get("sleep", 0)))
        if hp["lr"] > float(hp.get("diverge_above", 1e9)):
            return float("nan")
        target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))
        return (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.01 * scale.seed
''')


def write(tmp_path, body, objective=True):
    if objective:
        (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(body).replace("OBJ", str(tmp_path / "obj.py")))
    return path


GRID = '''
    name = "synthetic"
    objective = "OBJ:train"
    widths = [16, 64]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-10"
    high = "2**-2"
    grid = 9
    [fixed]
    sleep = SLEEP
'''


def studies(sweep):
    return {cell: sweep.study(*cell) for cell in sweep.config.cells}


def test_grid_sweep_report_and_transfer(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    sweep = Sweep(run)
    for cell, study in studies(sweep).items():
        trials = study.get_trials(states=(TrialState.COMPLETE,))
        assert len(trials) == 9 and len({t.params["lr"] for t in trials}) == 9, cell
    results = load_results(sweep)
    assert drift(sweep, results, "mup", "lr") == 0.0
    assert drift(sweep, results, "sp", "lr") == -2.0  # 1/width over 4× width = 2 octaves
    assert max_drift_steps(sweep, results, "sp", "lr") == 2.0

    assert main(["report", str(run)]) == 0
    for name in ("report.html", "loss_vs_lr.png", "transferred.json", "summary.json"):
        assert (run / name).stat().st_size > 0, name
    assert json.loads((run / "transferred.json").read_text())["lr"] == 2 ** -6
    html = (run / "report.html").read_text()
    assert "loss_vs_lr.png" in html and "Drift" in html
    png = (run / "loss_vs_lr.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 20_000

    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "256"]) == 0
    out = capsys.readouterr().out
    result = json.loads((run / "transfer.json").read_text())
    assert result["mup"]["hparams"]["lr"] == 2 ** -6 and result["sp"]["hparams"]["lr"] == 2 ** -6
    assert result["mup"]["loss"] < result["sp"]["loss"]  # SP's proxy optimum is 4 octaves off at 256
    assert "µP target" in out and "sweep compute / one target run" in out
    assert main(["report", str(run)]) == 0  # the report now shows the transfer too
    assert "Transfer from width 16 to width 256" in (run / "report.html").read_text()


def test_rerunning_a_finished_sweep_runs_nothing_and_a_changed_config_is_refused(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    numbers = {c: [t.number for t in s.get_trials()] for c, s in studies(Sweep(run)).items()}
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert {c: [t.number for t in s.get_trials()] for c, s in studies(Sweep(run)).items()} == numbers
    cfg.write_text(cfg.read_text().replace("grid = 9", "grid = 5"))
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 2
    assert "different config" in capsys.readouterr().err


def test_two_local_workers_run_every_trial_once(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0.2"))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--workers", "2", "--no-progress"]) == 0
    workers = set()
    for study in studies(Sweep(run)).values():
        trials = study.get_trials()
        assert all(t.state == TrialState.COMPLETE for t in trials)
        assert sorted(t.params["lr"] for t in trials) == sorted(set(t.params["lr"] for t in trials))
        assert len(trials) == 9
        workers |= {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2


def test_diverged_trials_are_recorded_and_the_sweep_goes_on(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0") + "diverge_above = 0.03\n")
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    results = load_results(Sweep(run))
    diverged = [r for r in results if r.diverged]
    assert len(results) == 36 and len(diverged) == 4 * 2 * 2  # lrs 2^-5…2^-2 in 2 widths × 2 parametrizations
    assert all(math.isnan(r.loss) and r.params["lr"] > 0.03 for r in diverged)
    assert main(["report", str(run)]) == 0


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_random_and_tpe_run_n_trials_per_cell(tmp_path, sampler):
    body = GRID.replace("SLEEP", "0").replace('sampler = "grid"', f'sampler = "{sampler}"\n    n_trials = 6')
    cfg = write(tmp_path, body)
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 0
    for study in studies(Sweep(tmp_path / "run")).values():
        trials = study.get_trials(states=(TrialState.COMPLETE,))
        assert len(trials) == 6
        assert all(2 ** -10 <= t.params["lr"] <= 2 ** -2 for t in trials)


@pytest.mark.slow
def test_kill_9_then_rerun_resumes_without_losing_trials(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0.6").replace("widths = [16, 64]", "widths = [16]")
                .replace('name = "synthetic"', 'name = "synthetic"\n    parametrizations = ["mup"]'))
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    storage = f"sqlite:///{run / 'sweep.db'}"
    deadline = time.time() + 120
    done = []
    while time.time() < deadline:
        time.sleep(0.3)
        try:
            study = optuna.load_study(study_name="synthetic/mup/w16", storage=storage)
            done = study.get_trials(states=(TrialState.COMPLETE,))
        except Exception:
            continue
        if len(done) >= 3 and study.get_trials(states=(TrialState.RUNNING,)):
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: (t.params["lr"], t.value) for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert 3 <= len(before) < 9
    assert len(study.get_trials(states=(TrialState.RUNNING,))) == 1  # the trial that was cut off

    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 0
    study = optuna.load_study(study_name="synthetic/mup/w16", storage=storage)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    after = {t.number: (t.params["lr"], t.value) for t in complete}
    assert all(after[n] == v for n, v in before.items())  # every completed trial kept as it was
    assert sorted(lr for lr, _ in after.values()) == sorted({lr for lr, _ in after.values()})
    assert len(after) == 9  # the interrupted one retried, nothing run twice
    assert len(study.get_trials(states=(TrialState.FAIL,))) == 1  # the dead worker's trial, marked stale


@pytest.mark.parametrize("edit, message", [
    (lambda s: "bogus = 1\n" + s, "unknown key(s) bogus"),
    (lambda s: s.replace('high = "2**-2"', 'high = "2**-12"'), "space.lr: low"),
    (lambda s: s.replace('type = "log"', 'type = "loglog"'), "space.lr.type"),
    (lambda s: s.replace('sampler = "grid"', 'sampler = "cmaes"'), "sampler"),
    (lambda s: s.replace("widths = [16, 64]", "widths = []"), "widths"),
    (lambda s: s.replace("widths = [16, 64]", "widths = [16, 64"), "not valid TOML"),
])
def test_bad_config_fails_at_once_with_exit_2(tmp_path, capsys, edit, message):
    cfg = write(tmp_path, edit(GRID.replace("SLEEP", "0")))
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(cfg) in err
    assert not (tmp_path / "run" / "sweep.db").exists()


def test_unreachable_storage_exits_2_without_leaking_credentials(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    start = time.time()
    code = main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--storage",
                 "sqlite:////nonexistent-dir/x/sweep.db", "--no-progress"])
    assert code == 2 and time.time() - start < 20
    assert "unreachable" in capsys.readouterr().err
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run2"), "--storage",
                 "mysql://bob:hunter2@localhost/db", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "bob:***@" in err


def test_unknown_objective_fails_at_once(tmp_path, capsys):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace('"OBJ:train"', '"recipe:resnet"'))
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "unknown recipe" in capsys.readouterr().err


def test_mask_url():
    assert mask_url("postgresql://u:p4ss@db.example:5432/x") == "postgresql://u:***@db.example:5432/x"
    assert mask_url("postgresql://u@host/x") == "postgresql://u@host/x"
    assert mask_url("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


def test_config_from_python_matches_toml():
    cfg = config_from_dict({"objective": "recipe:mlp", "widths": [64, 32], "space": {"lr": {"low": 1e-4, "high": 1e-2,
                                                                                         "grid": 3}}})
    assert cfg.widths == [32, 64] and cfg.base_width == 32 and cfg.sampler == "grid"
    assert [round(math.log10(v), 6) for v in cfg.space["lr"].grid_points()] == [-4, -3, -2]
    with pytest.raises(ValueError, match="both swept"):
        config_from_dict({"objective": "recipe:mlp", "widths": [8], "space": {"lr": {"low": 1, "high": 2}},
                          "fixed": {"lr": 1}})


def test_a_worker_elsewhere_joins_by_sweep_name_and_storage(tmp_path, monkeypatch):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0"))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--storage", storage, "--no-progress"]) == 0
    elsewhere = tmp_path / "other-machine"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["worker", "synthetic", "--storage", storage, "--no-progress"]) == 0  # nothing left to do
    assert (elsewhere / "synthetic" / "config.toml").read_text() == cfg.read_text()


@pytest.mark.slow
def test_a_worker_dying_right_after_claiming_does_not_block_the_sweep(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0").replace("widths = [16, 64]", "widths = [16]"))
    run = tmp_path / "run"
    Sweep.create(cfg, run).prepare()
    code = ("import os, sys; from mutransfer.sweep import Sweep; s = Sweep(sys.argv[1]); "
            "t = s._claim(s.study('mup', 16)); assert t is not None; os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(run)], check=True, timeout=120)
    sweep = Sweep(run)
    start = time.time()
    sweep.work(progress=False)
    assert time.time() - start < 60
    for study in studies(sweep).values():
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 9


def test_a_worker_started_before_the_sweep_waits_for_it(tmp_path):
    cfg = write(tmp_path, GRID.replace("SLEEP", "0.05"))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = subprocess.Popen([sys.executable, "-m", "mutransfer.cli", "worker", "synthetic", "--storage", storage,
                               "--no-progress", "--wait", "60"], cwd=elsewhere, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert main(["sweep", str(cfg), "--run", str(tmp_path / "run"), "--storage", storage, "--no-progress"]) == 0
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    for study in studies(Sweep(tmp_path / "run", storage=storage)).values():
        assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 9


def test_claim_lock_excludes_other_processes_on_sqlite(tmp_path):
    """SQLite ignores SELECT … FOR UPDATE, so claims are serialized by a file lock."""
    from mutransfer.sweep.storage import ClaimLock
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    probe = ("import fcntl, sys\nf = open(sys.argv[1], 'a')\n"
             "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    lock_file = str(tmp_path / "sweep.db.claim-lock")
    with ClaimLock(url):
        held = subprocess.run([sys.executable, "-c", probe, lock_file], capture_output=True, text=True).stdout
    free = subprocess.run([sys.executable, "-c", probe, lock_file], capture_output=True, text=True).stdout
    assert held.strip() == "held" and free.strip() == "free"
    assert ClaimLock("postgresql://u@localhost/db").path is None
