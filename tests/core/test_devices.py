"""Device-clean code without a GPU: `device=` threaded through coord_check, the recipes, transfer and
export; bf16 autocast on the CPU; the meta device for the kernels and for a µP model. (On a GPU,
tests/core/test_cuda.py runs the same paths on CUDA.)"""

import math

import pytest
import torch
from torch import nn

import mutransfer as mt
import mutransfer.coord.run as coord_run
from mutransfer._core.devices import module_device, move
from mutransfer.cli import main
from mutransfer.recipes import MLP, get_recipe

MLP_DATA = get_recipe("mlp").data()
NO_CUDA = not torch.cuda.is_available()


def mup_mlp(base: int = 32):
    def make(width: int) -> nn.Module:
        return mt.parametrize(MLP(width), base=MLP(base), delta=MLP(2 * base))

    return make


# --------------------------------------------------------------------------- the helpers


def test_move_reaches_every_tensor_of_nested_batches():
    x, y = torch.randn(2, 3), torch.arange(2)
    moved = move({"x": x, "more": (x, [y, "text"]), "n": 3}, torch.device("meta"))
    assert moved["x"].device.type == "meta" and moved["more"][0].device.type == "meta"
    assert moved["more"][1][0].device.type == "meta" and moved["more"][1][1] == "text" and moved["n"] == 3
    assert isinstance(moved["more"], tuple) and isinstance(moved["more"][1], list)
    assert move(x, torch.device("cpu")) is x  # already there: not copied


def test_module_device_reads_parameters_then_buffers():
    assert module_device(nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert module_device(nn.BatchNorm1d(2, affine=False, device="meta")) == torch.device("meta")
    assert module_device(nn.ReLU()) == torch.device("cpu")


# --------------------------------------------------------------------------- coord_check


def test_coord_check_moves_models_and_every_batch_to_the_device(monkeypatch):
    moved, seen = [], []
    real_move = coord_run.move
    monkeypatch.setattr(coord_run, "move", lambda obj, device: moved.append(device) or real_move(obj, device))

    class Spy(MLP):
        def forward(self, x):
            seen.append((x.device, self.input.weight.device))
            return super().forward(x)

    def make(width):
        model = Spy(width)
        model.to = lambda device, _to=model.to: seen.append(("to", device)) or _to(device)
        return mt.parametrize(model, base=MLP(32), delta=MLP(64))

    data = MLP_DATA[:2]
    result = mt.coord_check(make, [32, 64], data, steps=2, seeds=1, progress=False, device="cpu")
    assert moved == [torch.device("cpu")] * len(data)  # every batch, once
    assert ("to", torch.device("cpu")) in seen  # the model each make_model returns
    assert all(d == (torch.device("cpu"), torch.device("cpu")) for d in seen if d[0] != "to")
    assert all(type(r.value) is float for r in result.records)


def test_coord_check_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # on a GPU machine too
    dicts = [({"x": x}, y) for x, y in MLP_DATA[:2]]
    moved, seen = [], []
    real_move = coord_run.move
    monkeypatch.setattr(coord_run, "move", lambda obj, device: moved.append(device) or real_move(obj, device))

    class Kw(MLP):
        def forward(self, x):
            seen.append((x.device, self.input.weight.device))
            return super().forward(x)

    def make(width):
        return mt.parametrize(Kw(width), base=Kw(32), delta=Kw(64))

    auto = mt.coord_check(make, [32, 128], dicts, steps=2, seeds=1, progress=False)  # device="auto"
    cpu = torch.device("cpu")
    assert moved == [cpu] * len(dicts)  # every batch, to the CPU
    assert seen and set(seen) == {(cpu, cpu)}  # inputs and weights on the CPU in every forward
    seen.clear()
    explicit = mt.coord_check(make, [32, 128], dicts, steps=2, seeds=1, progress=False, device="cpu")
    assert auto.records and auto.records == explicit.records  # the same measurements as device="cpu"


@pytest.mark.skipif(not NO_CUDA, reason="checks the error where there is no GPU")
def test_coord_check_on_cuda_without_a_gpu_names_the_parameter():
    with pytest.raises(ValueError, match="device 'cuda'.*CUDA is not available.*'auto' or 'cpu'"):
        mt.coord_check(mup_mlp(), [32, 64], MLP_DATA, steps=1, seeds=1, progress=False, device="cuda")
    with pytest.raises(TypeError, match="device must be"):
        mt.coord_check(mup_mlp(), [32, 64], MLP_DATA, steps=1, seeds=1, progress=False, device=0)


def test_cli_bad_device_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["coord-check", "--recipe", "mlp", "--device", "cuda:99", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mutransfer coord-check: error: --device 'cuda:99'")


def test_cli_device_cpu_runs(capsys, tmp_path):
    code = main(
        [
            "coord-check",
            "--recipe",
            "mlp",
            "--widths",
            "32,128",
            "--seeds",
            "1",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code in (0, 1)
    assert (tmp_path / "coord_check.json").is_file()


# --------------------------------------------------------------------------- the sweep recipes


from mutransfer.sweep.recipes import train_gpt, train_mlp, train_resmlp  # noqa: E402
from mutransfer.sweep.scale import Scale  # noqa: E402

# Measured (CPU, µP, width 64 over base 32, 30 steps): |bf16 − fp32| / fp32 = 0.44% (mlp), 0.26% (resmlp),
# 0.02% (gpt, 6 steps). 2% leaves room for other BLAS builds while a float32-only run (gap 0) or a broken
# bf16 run (NaN, or a loss far off) fails.
BF16_RTOL = 0.02


@pytest.mark.parametrize(
    "train, hp",
    [
        (train_mlp, dict(lr=1e-2, steps=30)),
        (train_resmlp, dict(lr=1e-2, steps=30)),
        (train_gpt, dict(lr=1e-2, steps=6, batch_size=4, seq_len=16)),
    ],
)
def test_bf16_recipe_on_the_cpu_is_close_to_fp32_but_not_equal(train, hp):
    fp32 = train(dict(hp), Scale(64, 32, "mup", 0))
    bf16 = train(dict(hp), Scale(64, 32, "mup", 0, precision="bf16"))
    assert math.isfinite(bf16) and bf16 != fp32
    assert abs(bf16 - fp32) / fp32 < BF16_RTOL


def test_bf16_recipe_runs_its_linears_in_bfloat16_and_keeps_float32_parameters_and_state(monkeypatch):
    import mutransfer.optim as mt_optim

    seen, optimizers = {}, []

    def hook(module, args, output):  # training forwards only: parametrize's probes run before the optimizer
        if isinstance(module, nn.Linear) and optimizers:
            seen.setdefault(output.dtype, set()).add(module.weight.dtype)

    real = mt_optim.build_optimizer
    monkeypatch.setattr(mt_optim, "build_optimizer", lambda *a, **k: optimizers.append(real(*a, **k)) or optimizers[-1])
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        train_mlp(dict(lr=1e-2, steps=3), Scale(64, 32, "mup", 0, precision="bf16"))
    finally:
        handle.remove()
    assert seen == {torch.bfloat16: {torch.float32}}  # activations in bf16, weights float32
    states = [t for s in optimizers[0].state.values() for t in s.values() if torch.is_tensor(t) and t.ndim]
    assert states and all(t.dtype == torch.float32 for t in states)
    seen.clear()
    optimizers.clear()
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        train_mlp(dict(lr=1e-2, steps=2), Scale(64, 32, "mup", 0))
    finally:
        handle.remove()
    assert seen == {torch.float32: {torch.float32}}  # fp32: no autocast


def test_recipe_with_an_unknown_precision_names_it():
    with pytest.raises(ValueError, match="scale.precision must be one of 'fp32', 'bf16', 'fp8', got 'fp16'"):
        train_mlp(dict(lr=1e-2, steps=2), Scale(64, 32, "mup", 0, precision="fp16"))


# --------------------------------------------------------------------------- transfer and the demo


import json  # noqa: E402
import textwrap  # noqa: E402

RECORDING_OBJECTIVE = textwrap.dedent("""
    import json, math
    from pathlib import Path

    def train(hp, scale):
        with open(Path(__file__).parent / "seen.jsonl", "a") as f:
            f.write(json.dumps([scale.width, str(scale.device), scale.precision]) + "\\n")
        return (math.log2(hp["lr"]) + 6) ** 2 + 1.0 / scale.width
""")


def _tiny_sweep(tmp_path):
    (tmp_path / "obj.py").write_text(RECORDING_OBJECTIVE)
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        textwrap.dedent(f'''
        name = "devices"
        objective = "{tmp_path / "obj.py"}:train"
        widths = [16, 32]
        sampler = "grid"
        [space.lr]
        type = "log"
        low = "2**-8"
        high = "2**-4"
        grid = 3
    ''')
    )
    run = tmp_path / "run"
    assert main(["sweep", str(cfg), "--run", str(run), "--no-progress"]) == 0
    (tmp_path / "seen.jsonl").unlink()
    return run


def _seen(tmp_path):
    return [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]


def test_transfer_trains_the_target_on_the_device_and_records_it(tmp_path, capsys):
    from mutransfer.sweep import Sweep
    from mutransfer.sweep.transfer.transfer import transfer

    run = _tiny_sweep(tmp_path)
    # meta: no objective of ours could train there, but this one only reports where it was asked to run
    out = transfer(Sweep(run), 32, device=torch.device("meta"))
    assert out["device"] == "meta" and out["precision"] == "fp32"
    assert _seen(tmp_path) == [[32, "meta", "fp32"]] * 2  # µP and SP, one seed each
    assert json.loads((run / "transfer.json").read_text())["device"] == "meta"
    (tmp_path / "seen.jsonl").unlink()
    assert main(["transfer", str(run), "--width", "32", "--device", "cpu"]) == 0
    # on the CPU, where the sweep trained, SP's target is the sweep's own trial at width 32: only µP trains (monitored)
    assert _seen(tmp_path) == [[32, "cpu", "fp32"]]
    result = json.loads((run / "transfer.json").read_text())
    assert result["device"] == "cpu" and "reused" in result["sp"] and "reused" not in result["mup"]
    capsys.readouterr()
    assert main(["transfer", str(run), "--width", "32", "--device", "gpu0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu0'" in err


def test_sweep_scale_takes_a_device():
    from mutransfer.sweep.engine.runner import Sweep

    sweep = Sweep.__new__(Sweep)  # Sweep.scale reads the config's base width, depth and precision
    sweep.config = type("Cfg", (), {"base_width": 16, "base_depth": None, "precision": "fp32"})()
    sweep.device = torch.device("cpu")  # what Sweep.__init__ sets (use_device changes it)
    assert sweep.scale("mup", 64, None, 0).device == torch.device("cpu")
    scale = sweep.scale("mup", 64, None, 1, device=torch.device("meta"))
    assert scale.device == torch.device("meta") and (scale.width, scale.seed, scale.precision) == (64, 1, "fp32")


@pytest.mark.parametrize("flag, devices", [([], "auto"), (["--device", "cpu"], "cpu"), (["--device", "auto"], "auto")])
def test_demo_passes_its_devices_to_run_demo(flag, devices, monkeypatch, tmp_path, capsys):
    import mutransfer.sweep.transfer.demo as demo

    got = {}

    def fake(out, **kw):
        got.update(kw)
        raise ValueError("stop here")

    monkeypatch.setattr(demo, "run_demo", fake)
    assert main(["demo", "--out", str(tmp_path), *flag]) == 2
    assert got["devices"] == devices and "stop here" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [("x", "--device must be 'auto', 'cpu' or comma-separated GPU ids"), ("0,-1", "comma-separated GPU ids")]
    + ([("0,1", "--device 'cuda:0'")] if NO_CUDA else []),
)
def test_demo_bad_devices_exit_2(text, message, capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path), "--device", text]) == 2
    assert message in capsys.readouterr().err


def test_run_demo_passes_devices_to_both_sweeps(monkeypatch, tmp_path):
    import mutransfer.sweep.transfer.demo as demo

    calls = []

    def fake_run_sweep(config, run, **kw):
        calls.append(kw["devices"])
        raise ValueError("stop")

    monkeypatch.setattr(demo, "run_sweep", fake_run_sweep)
    with pytest.raises(ValueError, match="stop"):
        demo.run_demo(tmp_path, quick=True, devices=[1, 0], progress=False)
    assert calls == [[1, 0]]
    assert demo._target_device([1, 0]) == "cuda:1" and demo._target_device("cpu") == "cpu"
    assert demo._target_device(None) is None


# --------------------------------------------------------------------------- export


from mutransfer.recipes import GPT  # noqa: E402


def _mup_gpt():
    torch.manual_seed(0)
    model = GPT(64, n_layer=2, n_head=2, ctx=8)
    return mt.parametrize(
        model,
        base=GPT(16, n_layer=2, n_head=2, ctx=8),
        delta=GPT(32, n_layer=2, n_head=2, ctx=8),
        output_mult=2.0,
        attn_mult=1.5,
    )


def test_export_probes_on_another_device_through_a_copy_and_returns_the_model_where_it_lives(monkeypatch):
    import importlib

    export_mod = importlib.import_module("mutransfer._core.export")  # the module (mt.export is the function)
    model, x = _mup_gpt(), torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        before = model(x)
    plain = mt.export(model, x, device="cpu")  # the model's own device: no copy
    # pretend "cpu" is another device than the model's: the path a CPU model probed on a GPU takes
    monkeypatch.setattr(export_mod, "same_device", lambda a, b: False)
    copied = []
    real_copy = export_mod.copy_model
    monkeypatch.setattr(export_mod, "copy_model", lambda obj: copied.append(obj) or real_copy(obj))
    other = mt.export(model, x, device="cpu")
    assert copied[0] is model  # the probe copy, made from the model itself
    with torch.no_grad():
        for m in (plain, other):
            assert module_device(m) == torch.device("cpu")
            assert float((m.eval()(x) - before).abs().max() / before.abs().max()) <= 1e-5
        assert torch.equal(model(x), before)  # the µP model is untouched
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu'"):
        mt.export(model, x, device="nonsense")


def test_export_fused_qkv_row_indices_live_on_the_weights_device():
    from mutransfer._core.fold import _query_candidates

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24, device="meta")

    rows = [part[1] for _, part in _query_candidates(Attn(), head_dim=4) if part is not None]
    assert len(rows) == 2 and all(r.device.type == "meta" for r in rows)  # q in thirds, and interleaved per head


# --------------------------------------------------------------------------- the meta device


def test_fully_connected_kernels_run_on_meta_inputs():
    # on meta a CPU tensor next to a non-scalar meta tensor raises: every tensor made inside must take
    # its neighbours' device. relu and erf have closed forms; the series path (tanh, gelu, ...) groups
    # equal variances with torch.unique, which has no meta kernel (data-dependent size), so it is not
    # testable here.
    x1, x2 = torch.randn(5, 3, device="meta"), torch.randn(2, 3, device="meta")
    for act in ("relu", "erf"):
        k, theta = mt.limits.kernels(x1, x2, depth=2, activation=act, bias_var=0.1)
        assert k.device.type == theta.device.type == "meta" and k.shape == theta.shape == (5, 2)
        assert k.dtype == torch.float64
    assert mt.limits.nngp(x1, depth=3).shape == (5, 5)


@pytest.mark.parametrize(
    "net, shape",
    [
        (lambda: nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)), (5, 3)),
        (
            lambda: nn.Sequential(
                nn.Conv1d(1, 4, 3, padding=1), nn.ReLU(), nn.AvgPool1d(3), nn.Flatten(), nn.Linear(12, 1)
            ),
            (5, 1, 9),
        ),  # padding and pooling index maps
    ],
)
def test_traced_module_kernels_run_on_meta_inputs(net, shape):
    x1, x2 = torch.randn(*shape, device="meta"), torch.randn(2, *shape[1:], device="meta")
    for f in (mt.limits.nngp, mt.limits.ntk):
        k = f(net(), x1, x2, bias_var=0.1)  # the module on the CPU, the inputs on meta: computed on meta
        assert k.device.type == "meta" and k.shape == (5, 2) and k.dtype == torch.float64


def test_a_mup_model_moved_to_meta_still_runs():
    from mutransfer.recipes import MHATransformer, ResMLP

    gpt = lambda w: GPT(w, n_layer=2, n_head=2, ctx=8)  # noqa: E731  SDPA attention, tied readout
    cases = [
        (gpt(64), gpt(16), gpt(32), torch.randint(0, 256, (2, 8)), dict(output_mult=2.0, attn_mult=1.5)),
        (MHATransformer(64), MHATransformer(16), MHATransformer(32), torch.randn(2, 6, 16), dict(attn_mult=1.5)),
        # deeper than the base: residual branch multipliers as well
        (ResMLP(64, depth=8), ResMLP(16, depth=4), ResMLP(32, depth=4), torch.randn(3, 32), dict(depth_alpha=1.0)),
    ]
    for model, base, delta, x, kw in cases:
        mt.parametrize(model, base=base, delta=delta, **kw)
        expected = model(x).shape
        model.to("meta")
        out = model(x.to("meta"))  # forward constants and attention scales hold no CPU tensor
        assert out.device.type == "meta" and out.shape == expected
