"""The forecast of the target's loss from a sweep's width ladder (`mt.sweep.forecast`, `mutransfer forecast`,
transfer.json's "forecast", the report's figure)."""

import json
import math
import textwrap

import numpy as np
import pytest

import mutransfer as mt
from mutransfer.cli import main
from mutransfer.sweep.analysis.analysis import load_results
from mutransfer.sweep.analysis.forecasts import MAX_FACTOR, Forecast, _fit
from mutransfer.sweep.transfer.transfer import _forecast

# The loss at lr 2^-6 follows 2 + 3·w^-0.5 exactly, plus each seed's own noise (fixed by seed, width, lr); in
# SP the optimum moves an octave per doubling of width, so the loss at the proxy's lr rises at large widths.
OBJECTIVE = textwrap.dedent("""
    import math, random

    def train(hp, scale):
        if scale.width == int(hp.get("fail_width", 0)) and abs(math.log2(hp["lr"]) + 6) < 0.01:
            raise ValueError("boom")
        e = round(math.log2(hp["lr"]))
        noise = random.Random(scale.seed * 1_000_003 + scale.width * 1009 + (scale.depth or 0) * 7 + e).gauss(0, 1)
        target = -6 - (0 if scale.mup else math.log2(scale.width / scale.base_width))
        depth = 0.4 / scale.depth if scale.depth is not None else 0.0
        return 2.0 + 3.0 * scale.width ** -0.5 + depth + 0.05 * (math.log2(hp["lr"]) - target) ** 2 + 0.004 * noise
""")

CONFIG = """
    name = "law"
    objective = "OBJ:train"
    widths = WIDTHS
    seeds = [0, 1, 2]
    sampler = "grid"
    [space.lr]
    type = "log"
    low = "2**-8"
    high = "2**-4"
    grid = 5
    [fixed]
    fail_width = FAIL
"""


def truth(width: int) -> float:
    return 2.0 + 3.0 * width**-0.5


def sweep_dir(tmp_path, widths=(16, 32, 64, 128, 256), fail=0, depths=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    body = textwrap.dedent(CONFIG).replace("OBJ", str(tmp_path / "obj.py"))
    if depths is not None:
        body = body.replace("seeds = ", f"depths = {list(depths)}\nseeds = ")
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(body.replace("WIDTHS", str(list(widths))).replace("FAIL", str(fail)))
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress", "--workers", "1"]) == 0
    return run


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    return sweep_dir(tmp_path_factory.mktemp("ladder"))


def test_a_known_law_is_recovered_and_the_held_out_proxy_lands_inside(ladder):
    fc = mt.sweep.forecast(ladder, width=2048)
    assert fc.ok and fc.loss is not None and fc.interval is not None
    lo, hi = fc.interval
    assert lo <= truth(2048) <= hi, (fc.loss, fc.interval)
    naive = fc.points[-1]["loss"]  # the largest proxy's loss: what one guesses without a law
    assert abs(fc.loss - truth(2048)) < 0.5 * abs(naive - truth(2048))
    assert (hi - lo) / 2 < 2 * (naive - truth(2048))  # the interval is narrower than twice the gain
    assert fc.held_out is not None and fc.held_out["width"] == 256 and fc.held_out["inside"]
    assert fc.held_out["fit_widths"] == [16, 32, 64, 128] and fc.fit_widths == [16, 32, 64, 128, 256]
    b = fc.law_params["terms"]["width"]
    assert b["b_interval"][0] <= 0.5 <= b["b_interval"][1]
    assert fc.regime == "extrapolated 8× past the largest proxy (width 256)"
    line = fc.line()
    assert line.startswith(f"forecast: loss {fc.loss:.4g} [{lo:.4g}, {hi:.4g}] at width 2048 (L = ")
    assert "fit on 16…256, held-out width 256 inside its interval" in line
    assert [p["width"] for p in fc.points] == [16, 32, 64, 128, 256]
    assert all(len(p["losses"]) == 3 for p in fc.points)
    back = Forecast.from_dict(json.loads(json.dumps(fc.as_dict())))
    assert back.line() == line
    one_run = mt.sweep.forecast(ladder, width=2048, seeds=1)  # another seed: its own offset and noise too
    assert one_run.interval[1] - one_run.interval[0] > hi - lo
    assert any("1 seed other than the sweep's 3" in n for n in one_run.notes)


def test_sp_and_a_far_target_get_no_number(ladder):
    sp = mt.sweep.forecast(ladder, width=512, parametrization="sp")
    assert not sp.ok and sp.loss is None and sp.interval is None
    assert "does not fall with width" in sp.reason or "do not follow" in sp.reason
    assert sp.line().startswith("no forecast at width 512: ")
    too_far = int(256 * MAX_FACTOR) + 1
    with pytest.raises(ValueError, match=r"past the 64× .* extrapolate=True"):
        mt.sweep.forecast(ladder, width=too_far)
    assert mt.sweep.forecast(ladder, width=too_far, extrapolate=True).ok
    inside = mt.sweep.forecast(ladder, width=48)
    assert inside.regime.startswith("interpolated") and inside.interval[0] <= truth(48) <= inside.interval[1]
    with pytest.raises(ValueError, match="depth needs a sweep over depths"):
        mt.sweep.forecast(ladder, width=512, depth=4)
    with pytest.raises(ValueError, match="width must be a positive integer"):
        mt.sweep.forecast(ladder, width=0)


def test_the_cli_prints_the_forecast_and_exits_1_without_one(ladder, capsys):
    assert main(["forecast", str(ladder), "--width", "1024"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("forecast: loss ") and "width 256: " in out
    assert main(["forecast", str(ladder), "--width", "1024", "--parametrization", "sp"]) == 1
    assert capsys.readouterr().out.startswith("no forecast at width 1024: ")
    assert main(["forecast", str(ladder), "--width", "100000"]) == 2
    assert "--extrapolate" in capsys.readouterr().err
    assert main(["forecast", str(ladder), "--width", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["width"] == 1024


def test_one_width_and_a_missing_width(tmp_path):
    one = sweep_dir(tmp_path / "one", widths=(32,))
    fc = mt.sweep.forecast(one, width=128)
    assert fc.reason == "one width (32): a law in width needs losses at two widths or more to reach width 128"
    gap = sweep_dir(tmp_path / "gap", widths=(16, 32, 64, 128), fail=64)
    fc = mt.sweep.forecast(gap, width=512)
    assert fc.ok and [p["width"] for p in fc.points] == [16, 32, 128]
    assert fc.missing[0]["width"] == 64 and fc.missing[0]["why"].startswith("failed (ValueError: boom")
    assert any(n.startswith("missing: width 64 (failed") for n in fc.notes)
    assert fc.interval[0] <= truth(512) <= fc.interval[1]


def test_a_sweep_over_depths_gets_a_law_in_width_and_depth(tmp_path):
    both = sweep_dir(tmp_path / "both", widths=(16, 32, 64), depths=(2, 4, 8))
    fc = mt.sweep.forecast(both, width=256, depth=16)
    assert fc.ok and fc.fit_depths == [2, 4, 8] and len(fc.points) == 9
    half = (fc.interval[1] - fc.interval[0]) / 2  # one noisy ladder: a 90% interval misses 1 time in 10
    assert abs(fc.loss - (truth(256) + 0.4 / 16)) < 2 * half  # (calibration: the simulated ladders below)
    assert fc.held_out["width"] == 64 and fc.held_out["depth"] == 8 and fc.held_out["inside"]
    assert (
        "g " in fc.law
        and fc.regime == "extrapolated 4× past the largest proxy (width 64) and 2× past the largest proxy (depth 8)"
    )
    one = sweep_dir(tmp_path / "one", widths=(64,), depths=(2, 4, 8))
    deeper = mt.sweep.forecast(one, width=64, depth=32)
    assert deeper.ok and deeper.band["axis"] == "depth"
    assert deeper.interval[0] <= truth(64) + 0.4 / 32 <= deeper.interval[1]
    wider = mt.sweep.forecast(one, width=512, depth=16)
    assert wider.reason.startswith("one width (64): a law in width needs losses at two widths or more")
    fig = tmp_path / "f.png"
    from mutransfer.sweep.report.plots import plot_forecast

    assert plot_forecast(deeper.as_dict(), fig) and fig.stat().st_size > 20_000


def test_transfer_prints_the_forecast_first_and_records_the_actual_loss(ladder, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ladder, run)
    assert main(["transfer", str(run), "--width", "1024"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("forecast: loss ")  # before the target trains
    t = json.loads((run / "transfer.json").read_text())
    fc = t["forecast"]
    assert fc["width"] == 1024 and fc["actual"]["loss"] == pytest.approx(t["mup"]["loss"])
    assert fc["actual"]["inside"] == (fc["interval"][0] <= t["mup"]["loss"] <= fc["interval"][1])
    half = (fc["interval"][1] - fc["interval"][0]) / 2
    assert abs(t["mup"]["loss"] - fc["loss"]) < 2 * half  # the synthetic target follows the law (and its noise)
    word = "inside" if fc["actual"]["inside"] else "OUTSIDE"
    assert f"actual {t['mup']['loss']:.4g}, {word} the interval" in out
    sweep = mt.sweep.Sweep(run)
    other = _forecast(sweep, load_results(sweep), 1024, None, {"steps": 50}, False)
    assert other.loss is None and "the target trains at steps 50" in other.reason
    assert main(["report", str(run)]) == 0
    png = (run / "forecast.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 20_000
    html = (run / "report.html").read_text()
    assert "forecast.png" in html and "Forecast of the target" in html and "held-out width 256" in html


def _ladder_points(rng, widths, seeds, c, a, b, sigma, offsets):
    out = []
    for w in widths:
        ls = c + a * w**-b + offsets + sigma * rng.standard_normal(seeds)
        out.append({"width": w, "depth": None, "loss": float(ls.mean()), "losses": ls.tolist(), "spread": None})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("widths", [(32, 64, 128), (32, 64, 128, 256)])
def test_the_interval_is_calibrated_on_simulated_ladders(widths):
    """Across exponents and noise levels, with each seed's own offset shared by every width (a seed fixes the
    data order), the 90% interval holds the target's mean over the same seeds about 90% of the time (the
    posterior's calibration, which the bar on unseen tasks stands on)."""
    rng = np.random.default_rng(7)
    hits = n = 0
    target = 8 * max(widths)
    for b in (0.15, 0.4, 0.8):
        for sigma in (0.003, 0.01):
            for _ in range(15):
                offsets = 0.03 * rng.standard_normal(2)
                pts = _ladder_points(rng, widths, 2, 2.0, 3.0, b, sigma, offsets)
                base = Forecast("mup", target, None, None, None, "", None, [], None, pts, [], None, "", "")
                fc = _fit(base, pts, [], target, None, 2, False)
                assert fc.ok, fc.reason
                actual = 2.0 + 3.0 * target**-b + (offsets + sigma * rng.standard_normal(2)).mean()
                hits += fc.interval[0] <= actual <= fc.interval[1]
                n += 1
    assert 0.8 <= hits / n <= 0.99, hits / n


def test_no_noise_estimate_with_one_seed_is_said():
    pts = [{"width": w, "depth": None, "loss": 2 + w**-0.5, "losses": [2 + w**-0.5]} for w in (32, 64)]
    base = Forecast("mup", 256, None, None, None, "", None, [], None, pts, [], None, "", "")
    fc = _fit(base, pts, [], 256, None, 1, False)
    assert fc.ok and fc.held_out is None
    assert any("one seed" in n for n in fc.notes) and any("no held-out check" in n for n in fc.notes)
    assert fc.interval[0] < 2 + 256**-0.5 < fc.interval[1]  # the exponent's prior spans the truth
    assert math.isfinite(fc.loss)
