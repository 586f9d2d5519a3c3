"""u-µP as a first-class entry of a sweep's `parametrizations` (issue 50): µP and u-µP cells side by side on
the built-in GPT recipe, each cell parametrized its own way, the report labelling u-µP; `mutransfer transfer
--precision fp8` on that run; bad input."""

import json
import textwrap

import optuna
import pytest
from optuna.trial import TrialState

from mutransfer.cli import main
from mutransfer.errors import ConfigError
from mutransfer.sweep import Sweep, config_from_dict
from mutransfer.sweep.analysis.analysis import load_results

pytestmark = pytest.mark.filterwarnings("ignore::mutransfer.errors.MuPWarning")

CONFIG = """
    name = "umup-side-by-side"
    objective = "recipe:gpt"
    widths = [32, 64]
    parametrizations = ["mup", "u-mup"]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-8"
    high = "2**-6"
    grid = 2
    [fixed]
    steps = 6
    batch_size = 4
    seq_len = 16
    n_layer = 1
    threads = 1
"""

# an objective that says which parametrization the model it built is in (a wrong one fails its trial)
CHECKING = textwrap.dedent("""
    import torch
    import mutransfer as mt
    from mutransfer._core.spec import find_spec
    from mutransfer.recipes import GPT
    from mutransfer.sweep.scale import mup_kwargs

    def train(hp, scale):
        build = lambda w: GPT(w, n_layer=1, n_head=2, ctx=8, vocab=32)
        torch.manual_seed(scale.seed)
        model = mt.parametrize(build(scale.width), base=build(scale.base_width), delta=build(2 * scale.base_width),
                               **mup_kwargs(hp))
        assert scale.mup
        assert find_spec(model).parametrization == {"mup": "mup", "u-mup": "u-mup"}[scale.parametrization]
        return hp["lr"] + (1.0 if scale.parametrization == "u-mup" else 0.0)
""")


def test_mup_and_umup_cells_run_side_by_side_and_transfer_in_fp8(tmp_path, capsys):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    sweep = Sweep(run)
    assert [c[0] for c in sweep.config.cells] == ["mup", "mup", "u-mup", "u-mup"]
    for cell in sweep.config.cells:
        done = sweep.study(*cell).get_trials(states=(TrialState.COMPLETE,))
        assert len(done) == 2, cell
    assert optuna.study.get_all_study_names(sweep.storage) and any(
        "/u-mup/w64" in n for n in optuna.study.get_all_study_names(sweep.storage)
    )
    results = load_results(sweep)
    by = {(r.parametrization, r.width, r.params["lr"]): r.loss for r in results}
    # the same lr, width and seed train different models: u-µP's unit-scaled GPT is not µP's
    assert by[("u-mup", 64, 2**-8)] != pytest.approx(by[("mup", 64, 2**-8)], rel=1e-4)
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    assert "u-µP" in (run / "report.html").read_text()

    # the target in the FP8 simulation: both parametrizations train at width 128, each from its own proxy optimum
    assert main(["transfer", str(run), "--width", "128", "--precision", "fp8"]) == 0
    out = capsys.readouterr().out
    fp8 = json.loads((run / "transfer.json").read_text())
    assert fp8["precision"] == "fp8"
    assert fp8["u-mup"]["hparams"]["parametrization"] == "u-mup"
    assert "parametrization" not in fp8["mup"]["hparams"]
    assert 0 < fp8["mup"]["loss"] < 10 and 0 < fp8["u-mup"]["loss"] < 10
    assert "u-µP target" in out
    assert main(["transfer", str(run), "--width", "128"]) == 0
    fp32 = json.loads((run / "transfer.json").read_text())
    assert fp32["precision"] == "fp32"
    # E4M3 operands and E5M2 gradients moved the losses: the simulation ran (and the fp32 run did not reuse it)
    for p in ("mup", "u-mup"):
        assert fp8[p]["loss"] != pytest.approx(fp32[p]["loss"], rel=1e-6), p


def test_each_umup_cell_parametrizes_as_umup_through_mup_kwargs(tmp_path):
    (tmp_path / "obj.py").write_text(CHECKING)
    cfg = {
        "name": "checking",
        "objective": f"{tmp_path / 'obj.py'}:train",
        "widths": [16, 32],
        "parametrizations": ["mup", "umup", "sp"][:2],  # an alias reads as "u-mup"
        "space": {"lr": {"low": 0.01, "high": 0.02, "grid": 2}},
    }
    assert config_from_dict(cfg).parametrizations == ["mup", "u-mup"]
    cfg_path = tmp_path / "checking.toml"
    cfg_path.write_text(
        textwrap.dedent(f"""
        name = "checking"
        objective = "{tmp_path / "obj.py"}:train"
        widths = [16, 32]
        parametrizations = ["mup", "umup"]
        [space.lr]
        low = 0.01
        high = 0.02
        grid = 2
        """)
    )
    assert main(["sweep", str(cfg_path), "--run", str(tmp_path / "run2"), "--no-progress"]) == 0
    results = load_results(Sweep(tmp_path / "run2"))
    assert len(results) == 8 and all(r.ok for r in results)  # a wrong parametrization fails its trial
    assert {round(r.loss - r.params["lr"], 9) for r in results if r.parametrization == "u-mup"} == {1.0}


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"parametrizations": ["mup", "x-mup"]}, "parametrizations: unknown 'x-mup'"),
        ({"parametrizations": ["u-mup", "umup"]}, "lists 'u-mup' twice"),
        ({"parametrizations": []}, "non-empty list"),
        (
            {"parametrizations": ["mup", "u-mup"], "fixed": {"parametrization": "u-mup"}},
            "remove [fixed] parametrization",
        ),
    ],
)
def test_bad_parametrizations_name_the_fix(edit, message):
    cfg = {"name": "bad", "objective": "recipe:mlp", "widths": [16], "space": {"lr": {"low": 0.01, "high": 0.1}}}
    with pytest.raises(ConfigError, match=None) as info:
        config_from_dict({**cfg, **edit})
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_umup_has_its_own_space_table():
    cfg = config_from_dict(
        {
            "name": "own",
            "objective": "recipe:mlp",
            "widths": [16],
            "parametrizations": ["mup", "u-mup"],
            "space": {"lr": {"low": 0.001, "high": 0.01}},
            "u-mup": {"space": {"lr": {"low": 0.01, "high": 0.1}}},
        }
    )
    assert cfg.space_for("u-mup")["lr"].low == 0.01 and cfg.space_for("mup")["lr"].low == 0.001
