"""Multi-fidelity pruning in sweeps: scale.report, the `pruner` config, pruned trials in results,
verdicts and the report."""

import json
import math
import pickle
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

from mutransfer.cli import main
from mutransfer.sweep import Pruned, Scale, Sweep, config_from_dict
from mutransfer.sweep.analysis.analysis import best, counts, load_results, verdicts
from mutransfer.sweep.recipes import train_mlp

OBJECTIVE = textwrap.dedent('''
    import math

    def train(hp, scale):
        """The synthetic loss of test_sweep (optimum at lr 2^-6 in µP, drifting as 1/width in SP),
        reported on the way down: loss(step) = final + 1/step, so the ranking is the same at every step."""
        target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))
        final = (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.01 * scale.seed
        for step in range(1, int(hp.get("steps", 10))):
            scale.report(step, final + 1.0 / step)
        return final
''')

CONFIG = """
    name = "synthetic"
    objective = "OBJ:train"
    widths = [16, 64]
    sampler = "SAMPLER"
    n_trials = 8
    seeds = [0, 1]
    PRUNER
    [space.lr]
    type = "log"
    low = "2**-10"
    high = "2**-2"
    grid = 9
    [fixed]
    steps = 10
"""

MEDIAN = 'pruner = "median"\n[pruner_options]\nn_startup_trials = 2'


def write(tmp_path, pruner: str, sampler: str = "grid", name: str = "sweep.toml"):
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    path = tmp_path / name
    key, _, table = pruner.partition("[")  # `pruner = ...` among the top-level keys, [pruner_options] last
    body = CONFIG.replace("SAMPLER", sampler).replace("OBJ", str(tmp_path / "obj.py")).replace("PRUNER", key.strip())
    path.write_text(textwrap.dedent(body) + ("[" + table if table else ""))
    return path


def sweep_of(tmp_path, pruner: str, run: str, sampler: str = "grid") -> Sweep:
    cfg = write(tmp_path, pruner, sampler, f"{run}.toml")
    assert main(["sweep", str(cfg), "--run", str(tmp_path / run), "--no-progress"]) == 0
    return Sweep(tmp_path / run)


@pytest.mark.slow
def test_median_pruner_prunes_bad_trials_and_keeps_every_optimum(tmp_path):
    plain = sweep_of(tmp_path, "", "plain")
    pruned = sweep_of(tmp_path, MEDIAN, "pruned")
    assert plain.pruned() == 0
    assert pruned.finished() == pruned.total_trials() == 36 and pruned.failed() == 0
    n = pruned.pruned()
    assert n >= 12, n  # the far ends of each 9-point grid are clearly worse than the middle

    for cell in pruned.config.cells:
        for t in pruned.study(*cell).get_trials():
            assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), (cell, t.number, t.state)
            if t.state == TrialState.PRUNED:
                a = t.user_attrs
                assert a["pruned"] is True and a["losses"] == []  # stopped on the first seed: no second seed
                assert 1 <= a["pruned_step"] < 9 and math.isfinite(a["pruned_loss"])
                assert isinstance(a["seconds"], float) and 0 <= a["cpu_seconds"] <= a["seconds"] * a["threads"] + 0.05
                assert not a.get("failed") and not a.get("diverged")

    results = load_results(pruned)
    assert len(results) == 36
    flagged = [r for r in results if r.pruned]
    assert len(flagged) == n and all(math.isnan(r.loss) and not r.ok for r in flagged)
    assert all(math.isfinite(r.pruned_loss) for r in flagged)
    c = counts(results)
    assert c["pruned"] == n and c["failed"] == 0 and c["completed"] == 36 - n
    # the same optimum per cell as without a pruner: the best grid point and the fitted optimum
    base = load_results(plain)
    for p, w, d in pruned.config.cells:
        assert best(results, p, w, d).params == best(base, p, w, d).params, (p, w)
    for p in pruned.config.parametrizations:
        a, b = verdicts(plain, base)[p]["width"], verdicts(pruned, results)[p]["width"]
        for oa, ob in zip(a.hps["lr"].optima, b.hps["lr"].optima):
            assert (oa.at, oa.grid_x, oa.edge) == (ob.at, ob.grid_x, ob.edge)
            assert oa.x == pytest.approx(ob.x, abs=1e-9)
        assert b.counts["pruned"] > 0 and a.transferred == b.transferred

    # a rerun runs nothing: pruned trials are done
    numbers = {c: [t.number for t in pruned.study(*c).get_trials()] for c in pruned.config.cells}
    assert main(["sweep", str(tmp_path / "pruned.toml"), "--run", str(tmp_path / "pruned"), "--no-progress"]) == 0
    again = Sweep(tmp_path / "pruned")
    assert {c: [t.number for t in again.study(*c).get_trials()] for c in again.config.cells} == numbers
    assert json.loads((tmp_path / "pruned" / "run.json").read_text())["pruned_trials"] == n

    # the report counts them, in the text and in summary.json
    assert main(["report", str(tmp_path / "pruned")]) == 0
    summary = json.loads((tmp_path / "pruned" / "summary.json").read_text())
    assert summary["pruned"] == n and summary["failed"] == 0
    assert sum(summary["counts"][p]["pruned"] for p in ("mup", "sp")) == n
    html = (tmp_path / "pruned" / "report.html").read_text()
    assert f"{summary['counts']['mup']['pruned']} pruned" in html and "<th>pruned</th>" in html


def test_random_sampler_counts_pruned_trials_as_done(tmp_path):
    sweep = sweep_of(tmp_path, MEDIAN, "run", sampler="random")
    for cell in sweep.config.cells:
        assert len(sweep.study(*cell).get_trials()) == 8, cell
    assert sweep.finished() == 32 and sweep.failed() == 0


def test_without_a_pruner_report_is_a_no_op_and_the_grid_ascends(tmp_path):
    sweep = sweep_of(tmp_path, "", "run")
    for cell in sweep.config.cells:
        trials = sweep.study(*cell).get_trials()
        assert all(t.state == TrialState.COMPLETE and not t.intermediate_values for t in trials)
        assert [t.params["lr"] for t in trials] == sorted(t.params["lr"] for t in trials)
    with_pruner = Sweep.create(write(tmp_path, MEDIAN, name="p.toml"), tmp_path / "p")
    assert [round(math.log2(g["lr"])) for g in with_pruner.grid()] == [-6, -7, -5, -8, -4, -9, -3, -10, -2]


def test_scale_report_outside_a_sweep_is_a_no_op_and_scale_stays_a_value():
    plain = Scale(32, 32, "mup", 0)
    assert plain.report(3, 1.5) is None
    assert math.isfinite(train_mlp({"lr": 2**-6, "steps": 20}, plain))  # the recipe reports into nothing

    seen = []

    def reporter(step, loss):
        seen.append((step, loss))
        if loss > 2:
            raise Pruned("worse than the median")

    live = Scale(32, 32, "mup", 0, None, None, reporter)
    assert live == plain and hash(live) == hash(plain) and repr(live) == repr(plain)
    copy = pickle.loads(pickle.dumps(live))
    assert copy == plain and copy.reporter is None
    copy.report(1, 100.0)  # a copy in another process is a plain Scale
    live.report(1, 1.0)
    live.report(2, math.nan)  # not reported: a NaN return marks divergence instead
    assert seen == [(1, 1.0)]
    with pytest.raises(optuna.TrialPruned):
        live.report(3, 5.0)
    with pytest.raises(ValueError, match="step"):
        live.report(-1, 1.0)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"pruner": "asha"}, "pruner must be one of"),
        ({"pruner": "median", "pruner_options": {"reduction_factor": 3}}, "pruner_options: unknown key"),
        ({"pruner_options": {"n_startup_trials": 3}}, "pruner_options needs a pruner"),
        ({"pruner": "median", "pruner_options": {"n_startup_trials": -1}}, "pruner_options.n_startup_trials"),
        (
            {"pruner": "successive_halving", "pruner_options": {"reduction_factor": 1}},
            "pruner_options.reduction_factor",
        ),
        ({"pruner": "hyperband", "pruner_options": {"min_resource": 10, "max_resource": 5}}, "max_resource"),
        ({"pruner": "median", "pruner_options": 3}, "pruner_options must be a table"),
    ],
)
def test_bad_pruner_config_is_a_value_error_naming_the_key(extra, message):
    data = {"objective": "recipe:mlp", "widths": [32], "space": {"lr": {"low": 1e-3, "high": 1e-1}}, **extra}
    with pytest.raises(ValueError, match=message):
        config_from_dict(data)


@pytest.mark.parametrize(
    "pruner, options",
    [("median", {}), ("successive_halving", {"min_resource": "auto"}), ("hyperband", {"max_resource": 10})],
)
def test_each_pruner_is_built(pruner, options):
    data = {
        "objective": "recipe:mlp",
        "widths": [32],
        "space": {"lr": {"low": 1e-3, "high": 1e-1}},
        "pruner": pruner,
        "pruner_options": options,
    }
    assert isinstance(config_from_dict(data).optuna_pruner(), optuna.pruners.BasePruner)
    assert config_from_dict({k: v for k, v in data.items() if not k.startswith("pruner")}).optuna_pruner() is None
