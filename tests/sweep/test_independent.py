"""The "independent" sampler (issue 50, item 3): lr first, then each other hyperparameter alone at the
best lr, then their best values combined; resumable after a kill."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from mutransfer.errors import ConfigError
from mutransfer.sweep import Sweep
from mutransfer.sweep.config.config import config_from_dict
from mutransfer.sweep.config.space import default_value, dimension_from_dict
from mutransfer.sweep.engine.independent import plan, plan_size

SRC = Path(__file__).resolve().parents[2] / "src"

# separable, with its optimum at lr 2^-6, a = 2, b = 0.75 (b's default 0.5 is a grid point)
OBJECTIVE = textwrap.dedent("""
    import math, os
    from pathlib import Path

    def train(hp, scale):
        die = Path(__file__).parent / "DIE"  # kill this process once, on the first trial of stage 2
        if die.exists() and hp["a"] != 1.0:
            die.unlink()
            os.kill(os.getpid(), 9)
        return (math.log2(hp["lr"]) + 6) ** 2 + (math.log2(hp["a"]) - 1) ** 2 + 4 * (hp["b"] - 0.75) ** 2
""")

CONFIG = """
    name = "indep"
    objective = "OBJ:train"
    widths = [16]
    parametrizations = ["mup"]
    sampler = "independent"
    [space.lr]
    low = "2**-9"
    high = "2**-3"
    grid = 7
    [space.a]
    low = "2**-1"
    high = "2**2"
    grid = 4
    default = 1
    [space.b]
    type = "uniform"
    low = 0
    high = 1
    grid = 5
"""


def write(tmp_path: Path) -> Path:
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(CONFIG.replace("OBJ", str(tmp_path / "obj.py"))))
    return path


def ordered(run: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="indep/mup/w16", storage=f"sqlite:///{run / 'sweep.db'}")
    return sorted(study.get_trials(), key=lambda t: t.number)


def test_lr_first_then_each_hyperparameter_alone_then_the_combination(tmp_path):
    sweep = Sweep.create(write(tmp_path), tmp_path / "run")
    sweep.prepare()
    assert sweep.total_trials() == 7 + (4 - 1) + (5 - 1) + 1  # a's and b's defaults are grid points: not rerun
    assert sweep.work(progress=False) == 15
    trials = ordered(tmp_path / "run")
    assert all(t.state == TrialState.COMPLETE for t in trials)
    stage1, stage2, combined = trials[:7], trials[7:14], trials[14]
    # stage 1: the lr grid, everything else at its default (a: 1, given; b: the grid point at the middle, 0.5)
    assert [math.log2(t.params["lr"]) for t in stage1] == [-9, -8, -7, -6, -5, -4, -3]
    assert {(t.params["a"], t.params["b"]) for t in stage1} == {(1.0, 0.5)}
    # stage 2: at stage 1's best lr, each hyperparameter alone (a's grid, then b's), the other at its default
    assert {t.params["lr"] for t in stage2} == {2.0**-6}
    # a's grid is 0.5, 1, 2, 4 and b's 0, 0.25, 0.5, 0.75, 1: their defaults (1, 0.5) are not run again
    assert [(t.params["a"], t.params["b"]) for t in stage2] == [
        (0.5, 0.5),
        (2.0, 0.5),
        (4.0, 0.5),
        (1.0, 0.0),
        (1.0, 0.25),
        (1.0, 0.75),
        (1.0, 1.0),
    ]
    # the combination: each sweep's best (a: 2, b: 0.75), at the best lr
    assert combined.params == {"lr": 2.0**-6, "a": 2.0, "b": 0.75}
    assert combined.value == min(t.value for t in trials)


def test_stage_two_waits_for_every_stage_one_trial():
    space = {
        "lr": dimension_from_dict("lr", {"low": 2**-4, "high": 2**-2, "grid": 3}),
        "a": dimension_from_dict("a", {"low": 0.5, "high": 2, "grid": 3, "default": 1}),
    }
    assert plan_size(space) == 3 + 2 + 1
    assert default_value(space["a"]) == 1.0
    first = plan(space, [])
    assert [p["lr"] for p in first.points] == [2**-4, 2**-3, 2**-2] and not first.complete

    def done(params, value, state=TrialState.COMPLETE):
        return optuna.trial.create_trial(
            params=params,
            distributions={
                "lr": optuna.distributions.FloatDistribution(2**-4, 2**-2, log=True),
                "a": optuna.distributions.FloatDistribution(0.5, 2, log=True),
            },
            value=value if state == TrialState.COMPLETE else None,
            state=state,
        )

    two = [done(p, v) for p, v in zip(first.points[:2], (3.0, 1.0))]
    assert len(plan(space, two).points) == 3  # one lr still to run: stage 2 not due
    three = [*two, done(first.points[2], 2.0)]
    after = plan(space, three)
    assert after.best == {"lr": 2**-3} and after.stages[3:] == ["a", "a"]
    assert [p["a"] for p in after.points[3:]] == [0.5, 2.0] and {p["lr"] for p in after.points[3:]} == {2**-3}
    every = [*three, done(after.points[3], 5.0), done(after.points[4], 0.5)]
    final = plan(space, every)
    assert final.complete and final.points[-1] == {"lr": 2**-3, "a": 2.0} and final.stages[-1] == "combined"


def test_the_config_names_what_the_independent_sampler_needs():
    base = {"objective": "recipe:mlp", "widths": [16], "sampler": "independent"}
    with pytest.raises(ConfigError, match=r"sampler \"independent\" sweeps lr first.*\[space.lr\]"):
        config_from_dict({**base, "space": {"a": {"low": 1, "high": 2}}})
    with pytest.raises(ConfigError, match=r"space.a.default \(4\) must lie in the range 1 … 2"):
        config_from_dict(
            {**base, "space": {"lr": {"low": 1e-3, "high": 1e-1}, "a": {"low": 1, "high": 2, "default": 4}}}
        )
    with pytest.raises(ConfigError, match="space.c.default must be one of its values"):
        config_from_dict(
            {
                **base,
                "space": {"lr": {"low": 1e-3, "high": 1e-1}, "c": {"type": "choice", "values": [1, 2], "default": 3}},
            }
        )
    with pytest.raises(ConfigError, match="sampler must be one of grid, random, tpe, independent"):
        config_from_dict({**base, "sampler": "bayes", "space": {"lr": {"low": 1e-3, "high": 1e-1}}})


@pytest.mark.slow
def test_a_kill_loses_no_finished_trial_and_the_rerun_finishes_the_search(tmp_path):
    cfg = write(tmp_path)
    (tmp_path / "DIE").touch()
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mutransfer.cli", "sweep", str(cfg), "--run", str(run), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert killed.returncode == -9, killed.stderr  # killed on stage 2's first trial
    before = ordered(run)
    finished = {t.number: t.params for t in before if t.state == TrialState.COMPLETE}
    assert len(finished) == 7 and [t.state for t in before].count(TrialState.RUNNING) == 1
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert rerun.returncode == 0, rerun.stderr
    after = ordered(run)
    complete = [t for t in after if t.state == TrialState.COMPLETE]
    assert {t.number: t.params for t in complete if t.number in finished} == finished  # kept, not rerun
    assert len(complete) == 15  # the dead worker's trial ran again, once; nothing duplicated
    assert len({tuple(sorted(t.params.items())) for t in complete}) == 15
    assert min(complete, key=lambda t: t.value).params["lr"] == 2.0**-6
