"""Each parametrization's own search range: `[sp.space.lr]` / `[mup.space.lr]` replace `[space.lr]`'s
keys for that parametrization's studies (SP's optimum moves with width, µP's stays: a narrower µP grid
costs fewer runs)."""

import json
import math
import textwrap

import pytest
from optuna.trial import TrialState

from mutransfer.cli import main
from mutransfer.errors import ConfigError
from mutransfer.sweep import Sweep, config_from_dict
from mutransfer.sweep.analysis.analysis import drift, load_results, verdicts

OBJECTIVE = """
import math

def train(hp, scale):
    target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))  # SP's optimum drifts as 1/width
    return (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.01 * scale.seed
"""


def write(tmp_path, body):
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(body).replace("OBJ", str(tmp_path / "obj.py")))
    return path


SPLIT = """
    name = "split"
    objective = "OBJ:train"
    widths = [16, 64]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-7"
    high = "2**-4"
    grid = 4
    [sp.space.lr]
    low = "2**-10"
    grid = 7
"""


def test_each_parametrization_sweeps_its_own_range_and_is_judged_on_it(tmp_path):
    run = tmp_path / "run"
    assert main(["sweep", str(write(tmp_path, SPLIT)), "--run", str(run), "--no-progress"]) == 0
    sweep = Sweep(run)
    assert sweep.total_trials() == 2 * 4 + 2 * 7  # µP 4 points per width, SP 7
    for (p, w, d), n in {("mup", 16, None): 4, ("mup", 64, None): 4, ("sp", 16, None): 7, ("sp", 64, None): 7}.items():
        trials = sweep.study(p, w, d).get_trials(states=(TrialState.COMPLETE,))
        lrs = sorted(round(math.log2(t.params["lr"])) for t in trials)
        assert lrs == list(range(-7 if p == "mup" else -10, -3)), (p, w, lrs)
        assert len(trials) == n
    results = load_results(sweep)
    # the synthetic SP optimum sits at 2^-8 at width 64: outside µP's grid, inside SP's own
    assert drift(sweep, results, "mup", "lr") == 0.0 and drift(sweep, results, "sp", "lr") == -2.0
    judged = verdicts(sweep, results)
    assert judged["mup"]["width"].transferred is True
    sp = judged["sp"]["width"]
    assert sp.transferred is False and "edge" not in " ".join(sp.hps["lr"].reasons)
    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["transferred"] == {"mup": True, "sp": False}


def test_a_single_range_still_serves_every_parametrization():
    cfg = config_from_dict({"objective": "recipe:mlp", "widths": [16, 64], "space": {"lr": {"low": 0.01, "high": 0.1}}})
    assert cfg.space_for("mup") == cfg.space_for("sp") == cfg.space


BASE = {"objective": "recipe:mlp", "widths": [16, 64], "space": {"lr": {"low": 1e-3, "high": 1e-1, "grid": 3}}}


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"sp": {"space": {"wd": {"low": 0.1}}}}, "sp.space.wd: wd is not swept in [space]"),
        (
            {"sp": {"space": {"lr": {"low": 1.0}}}},
            r"[sp.space.lr] merged over [space.lr]: space.lr: low (1) must be less",
        ),
        ({"sp": {"space": {"lr": {"type": "uniform"}}}}, "sp.space.lr.type must be [space.lr]'s type"),
        ({"sp": {"space": {"lr": 0.1}}}, "sp.space.lr must be a table"),
        ({"sp": {"lr": {"low": 0.1}}}, "[sp] holds only a [sp.space] table"),
        (
            {"parametrizations": ["mup"], "sp": {"space": {"lr": {"low": 1e-4}}}},
            "[sp.space] is given but parametrizations",
        ),
        ({"mup": {"space": {"lr": {"grid": 10**9}}}}, "[mup.space.lr] merged over [space.lr]: space.lr.grid must"),
        (
            {
                "space": {"lr": {"low": 1e-3, "high": 1e-1, "grid": 3}, "wd": {"low": 1e-3, "high": 1, "grid": 1000}},
                "mup": {"space": {"lr": {"grid": 1001}}},
            },
            "space: the grid has 1,001,000 points per study",
        ),
    ],
)
def test_bad_per_parametrization_ranges_are_config_errors_naming_the_table(extra, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict({**BASE, **extra})
    assert message in str(e.value), str(e.value)


def test_a_choice_has_one_set_of_values():
    data = {**BASE, "space": {"act": {"type": "choice", "values": ["relu", "gelu"]}}}
    with pytest.raises(ConfigError, match=r"sp\.space\.act: act is a choice"):
        config_from_dict({**data, "sp": {"space": {"act": {"values": ["relu"]}}}})
