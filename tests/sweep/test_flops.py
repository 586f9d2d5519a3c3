"""FLOPs of sweep trials (`mutransfer.sweep.engine.flops`): exact against hand counts, the sampled estimate against
the full count, the clock's corner cases, nothing left behind, and the trial attributes a sweep records."""

import dataclasses
import gc
import math
import textwrap
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import _global_optimizer_post_hooks
from torch.utils._python_dispatch import TorchDispatchMode, _len_torch_dispatch_stack

import mutransfer as mt
from mutransfer.sweep import Scale, Sweep
from mutransfer.sweep.analysis.analysis import costs, load_results
from mutransfer.sweep.analysis.summary import summarize
from mutransfer.sweep.engine.flops import FlopCount, count_flops, counting
from mutransfer.sweep.engine.recording import Recording
from mutransfer.sweep.recipes import train_gpt

B, D_IN, H, D_OUT = 8, 5, 16, 3


def mlp(bias: bool) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(D_IN, H, bias=bias), nn.ReLU(), nn.Linear(H, H, bias=bias), nn.ReLU(), nn.Linear(H, D_OUT, bias=bias)
    )


def mlp_step_flops() -> int:
    """One SGD step of `mlp`, by hand: forward 2·B·in·out per Linear; backward grad-weight 2·B·in·out each,
    grad-input 2·B·in·out except the first layer (its input needs no gradient)."""
    layers = [(D_IN, H), (H, H), (H, D_OUT)]
    forward = sum(2 * B * i * o for i, o in layers)
    return forward + forward + sum(2 * B * i * o for i, o in layers[1:])


def train_mlp(steps: int, bias: bool = True, optimizers: int = 1) -> None:
    model = mlp(bias)
    params = list(model.parameters())
    opts: list[torch.optim.Optimizer]
    if optimizers == 1:
        opts = [torch.optim.SGD(params, lr=0.01, momentum=0.9)]
    else:  # two Adams, each over half the parameters, both stepping every iteration
        opts = [torch.optim.Adam(params[: len(params) // 2]), torch.optim.Adam(params[len(params) // 2 :])]
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(B, D_IN, generator=g), torch.randn(B, D_OUT, generator=g)
        loss = F.mse_loss(model(x), y)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()


def clean() -> tuple[int, int]:
    return len(_global_optimizer_post_hooks), _len_torch_dispatch_stack()


@pytest.mark.parametrize("bias", [False, True])
def test_an_mlp_counts_exactly_its_matmuls(bias):
    steps = 5
    with FlopCount(exact=True) as full:
        train_mlp(steps, bias)
    assert full.exact and full.error is None and full.steps == steps and full.intervals == steps - 1
    assert full.total == full.counted == steps * mlp_step_flops()
    with FlopCount() as sampled:  # I_0, I_2 and what was drawn; the rest priced at the counted steps' mean
        train_mlp(steps, bias)
    assert not sampled.exact and sampled.counted < sampled.total == steps * mlp_step_flops()
    assert sampled.first == mlp_step_flops()  # I_0: setup (no matmul) and the first step


def gpt_flops(width: int, n_layer: int, seq: int, batch: int, steps: int, vocab: int = 256) -> int:
    """Training recipes.GPT (tied readout), by hand. Per token and layer, forward: the Linear layers (qkv 3d²,
    proj d², fc 4d², fc_out 4d²) 2·12·d², attention (torch's SDPA formula: QKᵀ and PV, the causal mask
    ignored) 2·2·seq·d; backward: 2× each Linear (every one's input needs a gradient: the first one's comes
    from the embeddings), SDPA's recomputed scores and four products 5·2·seq·d. The readout: 3·2·d·vocab."""
    per_token = n_layer * (3 * 24 * width**2 + (4 + 10) * seq * width) + 3 * 2 * width * vocab
    return per_token * batch * seq * steps


GPT_HP = {"lr": 2**-6, "steps": 60, "batch_size": 8, "seq_len": 32, "n_layer": 2, "n_head": 4}


def test_the_sampled_estimate_of_a_gpt_trial_matches_the_full_count_and_the_hand_count():
    with FlopCount(exact=True) as full:
        train_gpt(dict(GPT_HP), Scale(32, 32, "mup", 0))
    with FlopCount(seed=7) as sampled:
        train_gpt(dict(GPT_HP), Scale(32, 32, "mup", 0))
    with FlopCount(first=sampled.first) as reused:  # a later seed: I_0 taken from the first
        train_gpt(dict(GPT_HP), Scale(32, 32, "mup", 1))
    assert full.exact and full.steps == sampled.steps == 60
    assert sampled.intervals_counted < 10 and sampled.counted < 0.2 * sampled.total
    assert sampled.total == pytest.approx(full.total, rel=0.02)
    assert reused.total == pytest.approx(full.total, rel=0.02) and reused.counted < sampled.counted
    hand = gpt_flops(32, 2, 32, 8, 60)
    assert full.total == pytest.approx(hand, rel=0.01)  # the rest: setup (µP's parametrize)
    kaplan = 6 * (12 * 2 * 32**2 + 32 * 256) * 8 * 32 * 60  # 6 × matmul parameters × tokens, no attention
    assert 1.0 < full.total / kaplan < 1.3


def test_the_noise_measurement_after_training_is_counted_by_passes():
    """A recorded µP trial measures the gradient noise scale after its last step: 65 forward/backward passes
    (the tail, which no step delimits), counted by `counting(model)`: its first pass, the rest priced per example."""
    hp = {**GPT_HP, "steps": 20}
    counts = []
    for kwargs in ({"exact": True}, {}):
        rec = Recording(hp["steps"], noise=True, guarded=True)
        scale = dataclasses.replace(Scale(32, 32, "mup", 0), _recording=rec)
        with FlopCount(**kwargs) as count:
            train_gpt(dict(hp), scale)
        rec.close()
        assert rec.noise_scales and count.error is None
        counts.append(count)
    full, sampled = counts
    assert full.exact and full.total > 2 * gpt_flops(32, 2, 32, 8, 20)  # the measurement: more than training
    assert sampled.total == pytest.approx(full.total, rel=0.02) and sampled.counted < 0.3 * full.total


def test_only_the_first_optimizer_to_step_is_the_clock():
    steps = 30
    with FlopCount(exact=True) as full:
        train_mlp(steps, optimizers=2)
    with FlopCount() as sampled:
        train_mlp(steps, optimizers=2)
    assert full.steps == sampled.steps == steps  # not 2 × steps: the second Adam does not tick
    assert full.total == steps * mlp_step_flops()
    assert sampled.total == pytest.approx(full.total, rel=0.01)


def test_a_run_without_an_optimizer_is_counted_whole():
    a, b = torch.randn(7, 11), torch.randn(11, 13)

    def run():
        for _ in range(4):
            torch.mm(a, b)

    (out, count) = count_flops(run)
    assert out is None and count.exact and count.steps == 0
    assert count.total == count.counted == count.first == 4 * 2 * 7 * 11 * 13


@pytest.mark.parametrize("at", [2, 4])  # raising in I_2 (counted) and in I_4 (drawn out with rate 0)
def test_a_run_that_raises_leaves_no_mode_and_no_hook(at):
    before = clean()

    def run():
        model = mlp(True)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(6):
            if step == at:
                model(torch.randn(B, D_IN))  # a forward pass, then the failure
                raise RuntimeError("boom")
            F.mse_loss(model(torch.randn(B, D_IN)), torch.zeros(B, D_OUT)).backward()
            opt.step()

    with pytest.raises(RuntimeError, match="boom"), FlopCount(rate=0.0) as count:
        run()
    assert clean() == before
    assert count.steps == at and count.error is None and count.total >= at * mlp_step_flops()


def test_a_mode_of_the_objective_spanning_ticks_stays_and_ours_goes():
    """A dispatch mode the objective enters around some steps sits above ours: ours stays on (those intervals
    count whole) until it can leave; the objective's mode is left where it was."""

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    before = clean()
    model = mlp(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    theirs = Passthrough()
    with FlopCount(rate=0.0) as count:
        for step in range(8):
            if step == 2:
                theirs.__enter__()
            F.mse_loss(model(torch.randn(B, D_IN)), torch.zeros(B, D_OUT)).backward()
            opt.step()
            if step == 5:
                theirs.__exit__(None, None, None)
    assert clean() == before
    assert count.total == 8 * mlp_step_flops() and count.intervals_counted >= 3


def test_compiled_models_and_higher_order_operators_run_and_count_under_the_mode():
    """torch.compile with fullgraph=True (flex attention always uses it) refused to compile under a plain
    dispatch mode, and a higher-order operator (torch.cond) refused to run: the trial failed. Now both run; the
    compiled code's matmuls count as eager ones do."""
    steps = 3
    model = mlp(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, fullgraph=True)
    with FlopCount(exact=True) as count:
        for _ in range(steps):
            F.mse_loss(compiled(torch.randn(B, D_IN)), torch.zeros(B, D_OUT)).backward()
            opt.step()
    assert count.error is None and count.total == steps * mlp_step_flops()
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with FlopCount() as count:
        out = torch.cond(a.sum() > 0, lambda x, y: x @ y, lambda x, y: (x @ y) * 2, (a, b))
    assert out.shape == (8, 4) and count.error is None  # counted as nothing: torch has no formula for cond


def test_a_formula_that_raises_fails_the_count_not_the_run(monkeypatch):
    from torch.utils import flop_counter

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a formula's bug")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.mm, broken)
    before = clean()
    model = mlp(False)  # no bias: every Linear is an mm
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stacks = []
    with FlopCount(exact=True) as count:
        for _ in range(4):
            F.mse_loss(model(torch.randn(B, D_IN)), torch.zeros(B, D_OUT)).backward()
            opt.step()
            stacks.append(_len_torch_dispatch_stack())
    assert clean() == before
    assert math.isnan(count.total) and "ZeroDivisionError" in str(count.error)
    assert stacks == [before[1]] * 4  # off at the first step after the failure: no slower run for nothing


def test_the_counter_keeps_no_optimizer_alive():
    """A trial's later seeds train while the first seed's counter is kept: it must not hold that seed's
    optimizer (its state and the model's parameters)."""
    model = mlp(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with FlopCount() as count:
        for _ in range(3):
            F.mse_loss(model(torch.randn(B, D_IN)), torch.zeros(B, D_OUT)).backward()
            opt.step()
    ref = weakref.ref(opt)
    del opt, model
    gc.collect()
    assert ref() is None and count.steps == 3


def test_counting_without_a_flop_count_does_nothing_and_bad_settings_are_refused():
    with counting(nn.Linear(2, 2)):
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="warm"):
        FlopCount(warm=0)
    with pytest.raises(ValueError, match="rate"):
        FlopCount(rate=1.5)
    with pytest.raises(ValueError, match="first"):
        FlopCount(first=-1.0)
    with pytest.raises(TypeError, match="first"):
        FlopCount(first="1e9")  # type: ignore[arg-type]


SWEEP = """
    name = "flops"
    objective = "recipe:mlp"
    widths = [16, 32]
    parametrizations = ["mup"]
    sampler = "grid"
    seeds = [0, 1]
    [space.lr]
    type = "log"
    low = "2**-8"
    high = "2**-6"
    grid = 2
    [fixed]
    steps = 8
    batch_size = 16
    threads = 1
"""


def _run_sweep(tmp_path):
    from mutransfer.sweep import run_sweep

    cfg = tmp_path / "sweep.toml"
    cfg.write_text(textwrap.dedent(SWEEP))
    return run_sweep(cfg, tmp_path / "run", progress=False)


def test_a_sweep_records_every_trials_flops_in_its_summary(tmp_path):
    sweep = _run_sweep(tmp_path)
    results = load_results(sweep)
    summary = summarize(sweep, results)
    entries = summary["trial_list"]
    assert len(entries) == 4 and all(e["flops"] > 0 for e in entries)
    # recipe:mlp at width 16 (d_in 32, 10 classes, depth 3): at least the 8 steps of both seeds
    layers = [(32, 16), (16, 16), (16, 16), (16, 10)]
    step = 2 * 16 * (2 * sum(i * o for i, o in layers) + sum(i * o for i, o in layers[1:]))
    narrow = [e["flops"] for e in entries if e["width"] == 16]
    assert min(narrow) >= 2 * 8 * step
    cost = costs(sweep, results)
    assert cost["sweep_flops"] == pytest.approx(sum(e["flops"] for e in entries))
    assert cost["proxy_flops"] == pytest.approx(sum(narrow))
    for study in (sweep.study("mup", 16), sweep.study("mup", 32)):
        for t in study.get_trials():
            per_seed = t.user_attrs["flops_per_seed"]
            assert len(per_seed) == 2 and t.user_attrs["flops"] == pytest.approx(sum(per_seed))
    with_target = costs(sweep, results, {"mup": {"cpu_seconds": 2.0, "flops": 1e6}})
    assert with_target["target_flops"] == 1e6
    assert with_target["sweep_flops_over_target"] == pytest.approx(cost["sweep_flops"] / 1e6)
    assert with_target["proxy_flops_over_target"] == pytest.approx(cost["proxy_flops"] / 1e6)
    assert "target_flops" not in costs(sweep, results, {"mup": {"cpu_seconds": 2.0}})


def test_a_trial_whose_counting_fails_completes_without_a_count(tmp_path, monkeypatch):
    from torch.utils import flop_counter

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a formula's bug")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.addmm, broken)
    sweep = _run_sweep(tmp_path)
    results = load_results(sweep)
    assert len(results) == 4 and all(r.ok for r in results)
    assert all(math.isnan(r.flops) for r in results)
    trial = sweep.study("mup", 16).get_trials()[0]
    assert trial.user_attrs["flops"] is None and "ZeroDivisionError" in trial.user_attrs["flops_error"]
    assert costs(sweep, results)["sweep_flops"] is None
    assert Sweep(tmp_path / "run").finished() == 4


def test_transfer_counts_the_target_run_and_states_tuning_in_target_runs(tmp_path):
    from mutransfer.sweep.transfer.transfer import format_transfer, transfer

    sweep = _run_sweep(tmp_path)
    out = transfer(sweep, width=64, peak_tflops=1e-3)
    # recipe:mlp at width 64, 8 steps of batch 16: at least its matmuls (see the test above), at most 30 % more
    layers = [(32, 64), (64, 64), (64, 64), (64, 10)]
    step = 2 * 16 * (2 * sum(i * o for i, o in layers) + sum(i * o for i, o in layers[1:]))
    target = out["mup"]["flops"]
    assert 8 * step <= target <= 1.3 * 8 * step
    assert len(out["mup"]["flops_per_seed"]) == 2 and target == pytest.approx(sum(out["mup"]["flops_per_seed"]) / 2)
    flops = out["flops"]
    assert flops["target_flops"] == target
    assert flops["proxy_flops_over_target"] == pytest.approx(flops["proxy_flops"] / target)
    text = format_transfer(out)
    ratio = flops["proxy_flops"] / target
    hours = flops["proxy_flops"] / 1e9 / 3600
    assert f"tuning: {flops['proxy_flops']:.3g} FLOPs = {ratio:.3g} target runs, {hours:.3g} device-hours" in text
    assert out["peak"] == {"tflops": 1e-3, "source": "--peak-tflops"}
    with pytest.raises(ValueError, match="--peak-tflops must be a positive number"):
        transfer(sweep, width=64, peak_tflops=0.0)


def test_the_forecast_estimates_the_targets_flops_from_the_sweeps_counts(tmp_path):
    """Before training it: a polynomial in width through the per-seed training counts (the proxy cell's trials
    also measured the gradient noise scale: kept apart as flops_measurement), within 2 % of the measured run."""
    from mutransfer.sweep import run_sweep
    from mutransfer.sweep.transfer.transfer import transfer

    cfg = tmp_path / "sweep.toml"
    cfg.write_text(textwrap.dedent(SWEEP).replace("widths = [16, 32]", "widths = [16, 32, 48]"))
    sweep = run_sweep(cfg, tmp_path / "run", progress=False)
    estimate = mt.sweep.forecast(sweep, width=128).flops
    assert estimate is not None
    measured = transfer(sweep, width=128)["mup"]["flops"]
    assert estimate["target"] == pytest.approx(measured, rel=0.02) and estimate["misfit"] < 0.02
    assert estimate["fit"] == "a sum of 1, w, w² fitted to the per-seed training counts at widths 16…48"
    assert any(r.flops_measurement > 0 for r in load_results(sweep) if r.width == 16)
