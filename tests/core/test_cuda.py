"""The same paths as tests/core/test_devices.py on a real GPU (marked `cuda`: skipped without one, see
conftest.py): µP training, the coordinate check, a bf16 recipe and export, everything on CUDA."""

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import GPT, MLP, get_recipe
from mutransfer.sweep.objective import Scale
from mutransfer.sweep.objectives import train_mlp

pytestmark = pytest.mark.cuda
CUDA = torch.device("cuda")


def _on_cuda(module: torch.nn.Module) -> bool:
    return all(t.device.type == "cuda" for t in list(module.parameters()) + list(module.buffers()))


def test_parametrize_and_adamw_steps_with_everything_on_cuda():
    torch.manual_seed(0)
    model = MLP(256).to(CUDA)
    mt.parametrize(model, base=MLP(64).to(CUDA), delta=MLP(128).to(CUDA))
    opt = torch.optim.AdamW(mt.param_groups(model, lr=1e-2, optimizer="adamw", weight_decay=0.1))
    x, y = torch.randn(64, 32, device=CUDA), torch.randint(0, 10, (64,), device=CUDA)
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert _on_cuda(model) and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert all(t.device.type == "cuda" for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim)


def test_parametrize_a_cuda_model_against_a_cpu_base():
    # the recipes' way: base and delta stay on the CPU (they give shapes and init values only)
    torch.manual_seed(0)
    model = MLP(256).to(CUDA)
    mt.parametrize(model, base=MLP(64), delta=MLP(128))
    assert _on_cuda(model) and model(torch.randn(4, 32, device=CUDA)).device.type == "cuda"


def test_coord_check_on_cuda_passes_for_a_small_mup_mlp():
    def make(width):
        return mt.parametrize(MLP(width), base=MLP(64), delta=MLP(128))

    result = mt.coord_check(
        make,
        [64, 256, 1024],
        get_recipe("mlp").data(),
        optimizer="adam",
        lr=1e-2,
        steps=4,
        seeds=2,
        progress=False,
        device="cuda",
    )
    assert result.passed, str(result)
    assert all(type(r.value) is float for r in result.records)


def test_bf16_recipe_on_cuda_is_finite_and_close_to_fp32():
    hp = dict(lr=1e-2, steps=30)
    fp32 = train_mlp(dict(hp), Scale(64, 32, "mup", 0, device=CUDA))
    bf16 = train_mlp(dict(hp), Scale(64, 32, "mup", 0, device=CUDA, precision="bf16"))
    cpu = train_mlp(dict(hp), Scale(64, 32, "mup", 0))
    assert math.isfinite(bf16) and abs(bf16 - fp32) / fp32 < 0.02
    assert abs(fp32 - cpu) / cpu < 1e-3  # the same init and data on both devices (float rounding only)


def test_export_on_cuda_round_trip_gives_the_same_outputs():
    torch.manual_seed(0)
    build = lambda w: GPT(w, n_layer=2, n_head=2, ctx=8)  # noqa: E731
    model = build(64).to(CUDA)
    mt.parametrize(model, base=build(16), delta=build(32), output_mult=2.0, attn_mult=1.5)
    x = torch.randint(0, 256, (2, 8), device=CUDA)
    with torch.no_grad():
        before = model.eval()(x)
    plain = mt.export(model, x)
    assert _on_cuda(plain)  # where the model lives
    fresh = build(64).to(CUDA)
    fresh.load_state_dict(plain.state_dict())
    with torch.no_grad():
        after = fresh.eval()(x)
    assert float((after - before).abs().max() / before.abs().max()) <= 1e-5
    cpu_model = build(64)
    mt.parametrize(cpu_model, base=build(16), delta=build(32), output_mult=2.0)
    on_cpu = mt.export(cpu_model, x.cpu(), device="cuda")  # probed on the GPU, returned on the CPU
    assert all(p.device.type == "cpu" for p in on_cpu.parameters())


def test_kernels_on_cuda_inputs_stay_on_cuda():
    x = torch.randn(6, 3, device=CUDA)
    k, theta = mt.limits.kernels(x, depth=2, activation="tanh")
    assert k.device.type == theta.device.type == "cuda"
    cpu = mt.limits.nngp(x.cpu(), depth=2, activation="tanh")
    assert torch.allclose(k.cpu(), cpu, rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_sweep_on_two_gpus_places_one_worker_per_gpu(tmp_path):
    """devices [0, 1]: every trial trains on cuda (its worker's one visible GPU), both GPUs are used,
    and the sweep's own process never initialises CUDA."""
    from optuna.trial import TrialState

    from mutransfer.sweep import Sweep

    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        'name = "gpus"\nobjective = "recipe:mlp"\nwidths = [64, 128]\nparametrizations = ["mup"]\n'
        'devices = [0, 1]\nprecision = "bf16"\n[space.lr]\ntype = "log"\nlow = "2**-10"\n'
        'high = "2**-6"\ngrid = 4\n[fixed]\nsteps = 20\n'
    )
    code = (
        "import sys, torch; from mutransfer.sweep import run_sweep; "
        "run_sweep(sys.argv[1], sys.argv[2], progress=False); print(torch.cuda.is_initialized())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(cfg), str(tmp_path / "run")], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "False"  # the sweep's own process never touched CUDA
    sweep = Sweep(tmp_path / "run")
    trials = [t for c in sweep.config.all_cells for t in sweep.study(*c).get_trials() if t.state == TrialState.COMPLETE]
    assert len(trials) == 8
    assert {t.user_attrs["device"] for t in trials} == {"cuda:0"}
    assert {t.user_attrs["cuda_visible_devices"] for t in trials} == {"0", "1"}
    assert {t.user_attrs["precision"] for t in trials} == {"bf16"}
