"""Verdicts from a sweep's own trials: sub-grid optima, bootstrap intervals over seeds, edges, regret."""

import json
import math
import textwrap

import numpy as np
import pytest

from mutransfer.cli import main
from mutransfer.sweep.analysis.analysis import TrialResult
from mutransfer.sweep.analysis.verdict import judge, parabolic_minimum, verdict_sentence
from mutransfer.sweep.config.space import Choice, LogUniform, Uniform

LR = LogUniform(2**-10, 2**-2, 9)


def cell(p, width, optimum, seeds=2, noise=0.0, curvature=0.1, rng=None, diverge_above=None, offsets=None):
    """Trials on LR's grid with loss curvature·(log2 lr − optimum)² + 1/width (+ noise per seed, + each
    seed's own offset in every trial: a seed fixes the data and the init, shared by every trial)."""
    rng = rng or np.random.default_rng(0)
    offsets = offsets or (0.0,) * seeds
    out = []
    for i, lr in enumerate(LR.grid_points()):
        if diverge_above is not None and lr > diverge_above:
            out.append(TrialResult(p, width, i, {"lr": lr}, math.nan, True, 0.0, None, (math.nan,) * seeds))
            continue
        ls = tuple(
            curvature * (math.log2(lr) - optimum) ** 2 + 1 / width + offsets[k] + noise * rng.standard_normal()
            for k in range(seeds)
        )
        out.append(TrialResult(p, width, i, {"lr": lr}, sum(ls) / seeds, False, 0.0, None, ls))
    return out


def test_parabolic_minimum_is_exact_on_a_parabola_and_flags_edges():
    grid = np.arange(-10.0, -1.0)
    y = np.stack([(grid + 6.3) ** 2, (grid + 10.5) ** 2, (grid + 1.2) ** 2, np.full(9, np.inf)])
    x, edge = parabolic_minimum(grid, y)
    assert x[0] == pytest.approx(-6.3) and edge[0] == 0
    assert x[1] == -10 and edge[1] == -1  # beyond the low end: the grid point, flagged
    assert x[2] == -2 and edge[2] == 1
    assert math.isnan(x[3])


def test_a_diverged_neighbour_is_not_an_edge():
    v = judge(
        "mup",
        "width",
        [(16, cell("mup", 16, -3.5, diverge_above=2**-3.5)), (64, cell("mup", 64, -3.5, diverge_above=2**-3.5))],
        {"lr": LR},
        2,
    )
    o = v.hps["lr"].optima[0]
    assert o.edge == 0 and o.grid_x == -4  # best finite point, its high neighbour diverged


def test_aligned_optima_transfer_with_an_interval_from_seeds():
    rng = np.random.default_rng(1)
    v = judge(
        "mup", "width", [(w, cell("mup", w, -6.3, seeds=4, noise=0.02, rng=rng)) for w in (16, 64, 256)], {"lr": LR}, 4
    )
    h = v.hps["lr"]
    assert [o.x for o in h.optima] == pytest.approx([-6.3] * 3, abs=0.15)
    lo, hi = h.drift.interval
    assert lo < h.drift.value < hi and hi - lo < 0.5  # noise 0.02 on a curvature 0.1: a tight interval
    assert v.transferred and h.reasons == []
    assert v.regret[256][1].value == pytest.approx(0.0, abs=1e-12)
    assert verdict_sentence(v, "µP").startswith("µP transferred: lr optimum moved")


def test_a_moving_optimum_does_not_transfer_and_regret_is_measured():
    v = judge(
        "sp",
        "width",
        [(16, cell("sp", 16, -5.0)), (64, cell("sp", 64, -7.0)), (256, cell("sp", 256, -8.2))],
        {"lr": LR},
        2,
    )
    h = v.hps["lr"]
    assert h.drift.value == pytest.approx(-3.2, abs=0.05)
    assert not v.transferred and "regret at width 64" in h.reasons  # 2 octaves on a sharp curve: 10× the best
    absolute, relative = v.regret[256]
    assert absolute.value == pytest.approx(0.1 * 3.2**2 - 0.1 * 0.2**2, rel=1e-9)  # lr 2^-5 vs best grid 2^-8
    assert relative.value == pytest.approx(absolute.value / (0.1 * 0.04 + 1 / 256))
    assert "did not transfer" in verdict_sentence(v, "SP") and "regret at width 256" in verdict_sentence(v, "SP")


def test_an_optimum_on_the_grid_edge_says_widen_the_grid():
    v = judge("mup", "width", [(16, cell("mup", 16, -9.6)), (64, cell("mup", 64, -10.6))], {"lr": LR}, 2)
    assert v.hps["lr"].optima[1].edge == -1 and not v.transferred
    assert abs(v.hps["lr"].drift.value) < 1  # within tolerance, but the true optimum may lie far beyond
    text = verdict_sentence(v, "µP")
    assert "cannot tell" in text and "widen the grid" in text
    moved = judge("mup", "width", [(16, cell("mup", 16, -6.0)), (64, cell("mup", 64, -11.0))], {"lr": LR}, 2)
    assert verdict_sentence(moved, "µP").startswith("µP did not transfer") and "widen the grid" in verdict_sentence(
        moved, "µP"
    )


def test_a_flat_basin_transfers_by_regret_even_when_the_optimum_moves():
    flat = judge(
        "mup",
        "width",
        [(16, cell("mup", 16, -5.0, curvature=1e-5)), (64, cell("mup", 64, -7.5, curvature=1e-5))],
        {"lr": LR},
        2,
    )
    assert abs(flat.hps["lr"].drift.value) > 1 and flat.regret[64][1].value < 0.01
    assert flat.transferred


def test_one_seed_gives_no_interval_and_uniform_and_choice_hps_work():
    space = {"lr": LR, "mom": Uniform(0.0, 0.9, 4), "act": Choice(("relu", "gelu"))}
    trials = []
    for w in (16, 64):
        n = 0
        for lr in LR.grid_points():
            for mom in space["mom"].grid_points():
                for act in ("relu", "gelu"):
                    loss = (math.log2(lr) + 6) ** 2 + (mom - 0.6) ** 2 + (act == "relu") * 0.5
                    trials.append(
                        TrialResult("mup", w, n, {"lr": lr, "mom": mom, "act": act}, loss, False, 0.0, None, (loss,))
                    )
                    n += 1
    v = judge("mup", "width", [(16, trials[: len(trials) // 2]), (64, trials[len(trials) // 2 :])], space, 1)
    assert v.hps["lr"].optima[0].x_interval is None and v.hps["lr"].optima[0].x == pytest.approx(-6)
    assert v.hps["mom"].optima[0].x == pytest.approx(0.6)  # between grid points 0.6: on the grid here
    assert v.hps["act"].optima[0].x == 1.0 and v.transferred
    assert v.as_dict()["hparams"]["act"]["optimum"]["16"]["value"] == "gelu"


OBJECTIVE = textwrap.dedent('''
    import math

    def train(hp, scale):
        """µP's optimum moves 3 octaves from width 16 to 128; SP's stays put (the opposite of µP's promise)."""
        target = -4 - (math.log2(scale.width / scale.base_width) if scale.mup else 0)
        return 0.1 * (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 0.001 * scale.seed
''')


def test_every_estimate_sits_in_the_middle_of_its_interval_even_with_two_seeds():
    """With two seeds the bootstrap has three distinct draws, two of them single-seed fits: a plain
    quantile range put the estimate on its own edge (the demo printed "+0.09 (90% CI -0.05 … +0.09)")."""
    rng = np.random.default_rng(3)
    v = judge(
        "mup", "width", [(w, cell("mup", w, -6.3, seeds=2, noise=0.03, rng=rng)) for w in (16, 64, 256)], {"lr": LR}, 2
    )
    h = v.hps["lr"]
    estimates = [(o.x, o.x_interval) for o in h.optima] + [(m.value, m.interval) for m in h.moves.values()]
    assert all(iv is not None for _, iv in estimates)
    for x, (lo, hi) in estimates:
        assert lo < x < hi and x - lo == pytest.approx(hi - x), (x, lo, hi)
    for _absolute, relative in v.regret.values():
        if relative.interval is not None:
            lo, hi = relative.interval
            assert 0 <= lo <= relative.value <= hi  # a regret is never negative


def test_the_report_states_what_the_data_show_not_a_fixed_caption(tmp_path, capsys):
    """On main the report printed "Under µP the optima line up … Under SP they move" whatever the data."""
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        textwrap.dedent(f'''
        name = "backwards"
        objective = "{tmp_path / "obj.py"}:train"
        widths = [16, 128]
        seeds = [0, 1]
        [space.lr]
        low = "2**-9"
        high = "2**-1"
        grid = 9
    ''')
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["transferred"] == {"mup": False, "sp": True}
    # `mutransfer report` prints the verdicts and the transferred HPs, then the path
    assert all(line in printed for line in summary["verdicts"])
    lr = summary["transferred_hparams"]["lr"]
    assert "Transferred hyperparameters" in printed and f"lr = {lr:.6g}" in printed
    assert printed.rstrip().endswith(f"report: {run / 'report.html'}")
    mup = summary["analysis"]["mup"]["width"]["hparams"]["lr"]
    assert mup["drift"]["value"] == pytest.approx(-3.0, abs=1e-6)
    assert mup["optimum"]["128"]["log2"] == pytest.approx(-7.0, abs=1e-6)
    assert summary["analysis"]["sp"]["width"]["regret"]["128"]["relative"] == pytest.approx(0.0)
    assert summary["verdict"].startswith("µP across widths did not transfer: lr optimum moved -3.00 octaves")
    html = (run / "report.html").read_text()
    assert "line up" not in html and "did not transfer" in html and summary["verdict"] in html
    assert html.count("<table>") == html.count("</th></tr><tr>")  # every table has a row under its header


AXES_OBJECTIVE = textwrap.dedent('''
    import math

    def train(hp, scale):
        """µP's optimum stays at 2^-6 across width, batch size and horizon; SP's moves with all three."""
        shift = math.log2(scale.width / scale.base_width) + math.log2(hp["batch_size"] / 8) / 2 \\
            + math.log2(hp["steps"] / 10) / 2
        target = -6 - (0 if scale.mup else shift)
        return 0.1 * (math.log2(hp["lr"]) - target) ** 2 + 1.0 / scale.width + 1.0 / hp["steps"] + 0.001 * scale.seed
''')


def test_batch_size_and_steps_are_axes_with_drift_and_regret(tmp_path, capsys):
    (tmp_path / "obj.py").write_text(AXES_OBJECTIVE)
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        textwrap.dedent("""
        name = "axes"
        objective = "obj.py:train"
        widths = [16, 64]
        batch_sizes = [32, 8]
        horizons = [10, 40]
        seeds = [0, 1]
        [space.lr]
        low = "2**-10"
        high = "2**-2"
        grid = 9
    """)
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    from mutransfer.sweep import Sweep

    sweep = Sweep(run)
    assert [c[3] for c in sweep.config.all_cells if c[0] == "mup"] == [(), (), (("batch_size", 32),), (("steps", 40),)]
    assert sweep.config.cells == [(p, w, None) for p in ("mup", "sp") for w in (16, 64)]  # unchanged meaning
    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    mup, sp = summary["analysis"]["mup"], summary["analysis"]["sp"]
    assert set(mup) == {"width", "batch_size", "steps"}
    assert mup["batch_size"]["hparams"]["lr"]["drift"]["value"] == pytest.approx(0.0, abs=1e-9)
    assert sp["batch_size"]["hparams"]["lr"]["drift"]["value"] == pytest.approx(-1.0, abs=1e-9)  # ×4 batch
    assert sp["steps"]["hparams"]["lr"]["drift"]["value"] == pytest.approx(-1.0, abs=1e-9)  # ×4 steps
    assert sp["width"]["hparams"]["lr"]["drift"]["value"] == pytest.approx(-2.0, abs=1e-9)
    assert sp["steps"]["regret"]["40"]["relative"] > 0 and mup["steps"]["regret"]["40"]["relative"] == 0
    assert summary["transferred"] == {"mup": True, "sp": False}
    for name in ("loss_vs_lr.png", "loss_vs_lr_by_batch_size.png", "loss_vs_lr_by_steps.png"):
        assert (run / name).read_bytes()[:4] == b"\x89PNG", name
    assert "µP across batch sizes transferred" in (run / "report.html").read_text()
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "64", "--batch-size", "32", "--steps", "40"]) == 0
    t = json.loads((run / "transfer.json").read_text())
    assert t["mup"]["hparams"] == {"lr": 2**-6, "batch_size": 32, "steps": 40}
    assert t["mup"]["loss"] == pytest.approx(1 / 64 + 1 / 40 + 0.0005)


SETUP_OBJECTIVE = textwrap.dedent('''
    import math, time
    _LOADED = []

    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    def train(hp, scale):
        """One-time setup of 1 CPU s per process (like loading a dataset), then 0.002 CPU s × width."""
        if not _LOADED:
            burn(1.0)
            _LOADED.append(True)
        burn(0.002 * scale.width)
        return (math.log2(hp["lr"]) + 6) ** 2 + 1.0 / scale.width
''')


@pytest.mark.slow
def test_the_target_run_is_costed_without_one_time_setup(tmp_path, capsys):
    """On main a fresh `mutransfer transfer` process timed its imports and data loading as the target run."""
    (tmp_path / "obj.py").write_text(SETUP_OBJECTIVE)
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        textwrap.dedent("""
        name = "setup"
        objective = "obj.py:train"
        widths = [16, 32]
        parametrizations = ["mup"]
        seeds = [0, 1, 2]
        [space.lr]
        low = "2**-7"
        high = "2**-5"
        grid = 3
    """)
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "mutransfer.cli", "transfer", str(run), "--width", "128"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    t = json.loads((run / "transfer.json").read_text())
    per_seed = t["mup"]["cpu_seconds_per_seed"]
    assert per_seed[0] > per_seed[1] + 0.5  # the first seed paid the setup
    assert t["mup"]["cpu_seconds"] == pytest.approx(3 * 0.002 * 128, rel=0.3)  # training alone
    work = 3 * 3 * 0.002 * (16 + 32)  # 3 lrs × 3 seeds at widths 16 and 32, plus the sweep process's one setup
    assert t["sweep_cpu_seconds"] == pytest.approx(work + 1.0, rel=0.3)
    assert t["proxy_cpu_seconds"] >= 0.7 * 3 * 3 * 0.002 * 16
    assert t["proxy_cost_ratio"] == pytest.approx(t["proxy_cpu_seconds"] / t["mup"]["cpu_seconds"])
    assert "tuning at the proxy / one target run" in proc.stdout


FAILING_OBJECTIVE = textwrap.dedent("""
    import math

    def train(hp, scale):
        if scale.width == 64 and hp["lr"] > 2 ** -6.5:
            raise RuntimeError("out of memory (simulated)")
        return 0.1 * (math.log2(hp["lr"]) + 6.2) ** 2 + 1.0 / scale.width + 0.001 * scale.seed
""")


def test_failed_points_are_counted_shown_and_never_taken_for_an_optimum(tmp_path):
    """On main the report said "N trials (0 diverged)" and picked width 64's optimum from the points left."""
    (tmp_path / "obj.py").write_text(FAILING_OBJECTIVE)
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        textwrap.dedent("""
        name = "failing"
        objective = "obj.py:train"
        widths = [16, 64]
        parametrizations = ["mup"]
        seeds = [0, 1]
        [space.lr]
        low = "2**-9"
        high = "2**-3"
        grid = 7
    """)
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert main(["report", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["failed"] == 4 and summary["counts"]["mup"] == {
        "completed": 10,
        "diverged": 0,
        "failed": 4,
        "pruned": 0,
    }
    width = summary["analysis"]["mup"]["width"]
    assert width["counts"]["failed"] == 4
    assert width["hparams"]["lr"]["optimum"]["64"]["edge"] == "unevaluated neighbour above"  # it failed
    assert summary["transferred"]["mup"] is False and "cannot tell" in summary["verdict"]
    assert "4 failed" in summary["verdict"]
    html = (run / "report.html").read_text()
    assert "Failed trials" in html and "out of memory (simulated)" in html and "--retry-failed" in html


# ---------------------------------------------------------------- defects a user test found (each failed before)


def test_the_proxys_hps_diverging_at_a_width_is_not_a_transfer():
    v = judge(
        "mup", "width", [(16, cell("mup", 16, -6.0)), (64, cell("mup", 64, -7.0, diverge_above=2**-6.5))], {"lr": LR}, 2
    )
    assert math.isinf(v.regret[64][0].value) and not v.transferred
    assert verdict_sentence(v, "µP").startswith("µP did not transfer") and "diverge at width 64" in verdict_sentence(
        v, "µP"
    )


def test_a_small_move_with_a_large_regret_is_not_a_transfer():
    v = judge(
        "sp",
        "width",
        [(16, cell("sp", 16, -6.0, curvature=1.0)), (64, cell("sp", 64, -6.9, curvature=1.0))],
        {"lr": LR},
        2,
    )
    assert abs(v.hps["lr"].drift.value) < 1 and v.regret[64][1].value > 0.05
    assert not v.transferred and "regret at width 64" in v.hps["lr"].reasons


def test_a_hyperparameter_without_effect_is_cannot_tell_not_a_move_or_an_edge():
    rng = np.random.default_rng(3)
    noisy = judge(
        "mup",
        "width",
        [(w, cell("mup", w, -6.0, seeds=3, noise=0.05, curvature=0.0, rng=rng)) for w in (16, 64)],
        {"lr": LR},
        3,
    )
    text = verdict_sentence(noisy, "µP")
    assert text.startswith("µP: cannot tell (a hyperparameter without measurable effect)"), text
    assert all(o.flat and o.x_interval is None for o in noisy.hps["lr"].optima)
    constant = judge("mup", "width", [(w, cell("mup", w, -6.0, curvature=0.0)) for w in (16, 64)], {"lr": LR}, 2)
    assert "widen the grid" not in verdict_sentence(constant, "µP") and "no measurable effect" in verdict_sentence(
        constant, "µP"
    )


def test_a_seeds_common_offset_is_not_noise_between_points_of_the_curve():
    """Every trial of a seed shares its data order and init: a seed whose loss is 0.3 higher everywhere
    says nothing about whether lr matters. The points of the curve differ by far more than the seeds'
    disagreement about those differences (0.01 per seed), so the optimum is located, not called flat (the
    unpaired spread across seeds called it flat: issue 32's benchmark, weight decay on the GPT)."""
    rng = np.random.default_rng(5)
    cells = [
        (w, cell("mup", w, -6.0, seeds=2, noise=0.01, curvature=0.03, rng=rng, offsets=(0.0, 0.3))) for w in (16, 64)
    ]
    v = judge("mup", "width", cells, {"lr": LR}, 2)
    assert not any(o.flat for o in v.hps["lr"].optima), v.hps["lr"].reasons
    assert all(abs(o.x - (-6.0)) < 0.5 for o in v.hps["lr"].optima), [o.x for o in v.hps["lr"].optima]
    # one run blown up without diverging (loss 300 and 500: the benchmark's GPT at lr 1, λ 2, off the lr
    # profile as λ 2 is not the best λ at lr 1) is not noise for the rest of the curve
    from mutransfer.sweep.analysis.statistics import CellData, _noise

    losses = np.array([[t.losses[0], t.losses[1]] for t in cells[0][1]])
    clean = _noise(CellData({}, losses, []))
    assert clean < 0.01  # the noise of differences (0.01 per seed), not the 0.3 offset
    blown = _noise(CellData({}, np.vstack([losses, [[300.0, 500.0]]]), []))
    assert blown < 2 * clean, (clean, blown)
    # noise that does differ between points still makes a curve flat (the test above, and here with offsets)
    rng = np.random.default_rng(3)
    noisy = [
        (w, cell("mup", w, -6.0, seeds=3, noise=0.05, curvature=0.0, rng=rng, offsets=(0, 0.3, -0.2))) for w in (16, 64)
    ]
    assert all(o.flat for o in judge("mup", "width", noisy, {"lr": LR}, 3).hps["lr"].optima)


def test_an_optimum_on_an_edge_or_beside_a_diverged_point_has_no_false_precision():
    edge = judge("mup", "width", [(w, cell("mup", w, -12.0)) for w in (16, 64)], {"lr": LR}, 2)
    assert edge.hps["lr"].optima[0].x_interval is None and edge.hps["lr"].drift.interval is None
    assert "CI" not in verdict_sentence(edge, "µP").split("regret")[0]
    beside = judge("mup", "width", [(w, cell("mup", w, -4.2, diverge_above=2**-4.5)) for w in (16, 64)], {"lr": LR}, 2)
    lo, hi = beside.hps["lr"].optima[0].x_interval
    assert lo <= -5.5 and hi >= -4.5  # best grid point -5, its neighbour above diverged: no parabola there


def test_negative_losses_give_absolute_regret_and_valid_json(tmp_path):
    (tmp_path / "obj.py").write_text(
        "import math\ndef train(hp, scale):\n"
        "    return (math.log2(hp['lr']) + 6 + (0 if scale.mup else math.log2(scale.width / 16))) ** 2 - 5\n"
    )
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        textwrap.dedent("""
        name = "negative"
        objective = "obj.py:train"
        widths = [16, 64]
        seeds = [0, 1]
        [space.lr]
        low = "2**-10"
        high = "2**-2"
        grid = 9
    """)
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    assert main(["report", str(run)]) == 0
    text = (run / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    summary = json.loads(text)
    assert summary["analysis"]["sp"]["width"]["regret"]["64"]["relative"] is None
    assert summary["analysis"]["sp"]["width"]["regret"]["64"]["loss"] == pytest.approx(4.0)
    assert "in loss units" in summary["verdicts"][1]
    assert "<td>diverged</td>" not in (run / "report.html").read_text()  # the regret column said so


def test_the_head_to_head_says_tie_or_cannot_tell_from_its_interval():
    from mutransfer.sweep.report.report import head_to_head_line

    base = {"width": 256, "proxy_width": 32, "mup_transferred": 2.0, "sp_retuned": 2.0, "mup_pruned": False}
    assert "as good (within 1%)" in head_to_head_line({**base, "relative": 0.0, "relative_interval": (0.0, 0.0)})
    assert "as good (within 1%)" in head_to_head_line({**base, "relative": -0.009, "relative_interval": None})
    assert "cannot be told apart" in head_to_head_line({**base, "relative": 0.05, "relative_interval": (-0.02, 0.12)})
    assert "SP re-tuned" in head_to_head_line({**base, "relative": 0.05, "relative_interval": (0.03, 0.07)})
    assert "µP is better" in head_to_head_line({**base, "relative": -0.05, "relative_interval": (-0.07, -0.03)})


def test_a_blow_up_does_not_flatten_the_loss_plot():
    """One SP run at loss 287 beside curves between 1.2 and 2.6: the plot's y-axis stopped at 287 and every
    curve lay flat on the floor; now it stops at min + 4 × (median − min) and counts what lies above."""
    from mutransfer.sweep.report.plots import loss_axis_top

    losses = [1.2, 1.3, 1.5, 1.6, 1.8, 2.0, 2.1, 2.6, 14.0, 287.1]
    top, above = loss_axis_top(losses)
    assert top == pytest.approx(1.2 + 4 * (2.0 - 1.2)) and above == 2  # the median: the 6th of 10
    assert loss_axis_top([1.0, 1.1, 1.3, 1.6]) == (1.6, 0)  # nothing far above: the largest loss
    assert loss_axis_top([2.0, 2.0]) == (2.0, 0) and loss_axis_top([]) == (1.0, 0)
