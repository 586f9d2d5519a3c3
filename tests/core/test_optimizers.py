"""µP for every optimizer: the rules pinned at 16× width, Muon's AdamW split and its adjust_lr_fn
guard, the optimizer classes (Lion, the µP-capped Adafactor, MuonWithAdamW), and the coordinate
check passing µP and failing SP with each."""

import copy
import functools
import math
import warnings

import pytest
import torch
from torch import nn

import mutransfer as mt
from model_helpers import build
from mutransfer.optimizers import LR_FACTOR_KEY
from mutransfer.recipes import GPT, MLP, ResMLP, get_recipe

M = 16.0  # 1024 / 64


@functools.cache  # built once per module: the tests that share it only read it (none steps it)
def _mlp():
    return build(MLP, 1024, 64, depth=3)


NAMES = {
    "input": "input.weight",
    "vector": "input.bias",
    "hidden": "hidden.0.weight",
    "output": "readout.weight",
    "scalar": "readout.bias",
}


def _group_of(groups, model, name):
    p = dict(model.named_parameters())[name]
    hits = [g for g in groups if any(q is p for q in g["params"])]
    assert len(hits) == 1, name
    return hits[0]


# lr factor and ε factor(s) per role at 16× width (m_in = m_out = 16 for hidden), table 3.
PINNED = {
    #            input      vector     hidden          output        scalar
    "sgd": {"input": (M,), "vector": (M,), "hidden": (1.0,), "output": (1 / M,), "scalar": (1.0,)},
    "adam": {
        "input": (1.0, 1 / M),
        "vector": (1.0, 1 / M),
        "hidden": (1 / M, 1 / M),
        "output": (1 / M, 1.0),
        "scalar": (1.0, 1.0),
    },
    "lion": {"input": (1.0,), "vector": (1.0,), "hidden": (1 / M,), "output": (1 / M,), "scalar": (1.0,)},
    # Adafactor: lr = adam − init; ε = (ε₁ like Adam's ε, ε₂ like the init)
    "adafactor": {
        "input": (1.0, 1 / M, 1.0),
        "vector": (1.0, 1 / M, 1.0),
        "hidden": (0.25, 1 / M, 0.25),
        "output": (1.0, 1.0, 1 / M),
        "scalar": (1.0, 1.0, 1.0),
    },
    "soap": {
        "input": (1.0, 1 / M),
        "vector": (1.0, 1 / M),
        "hidden": (1 / M, 1 / M),
        "output": (1 / M, 1.0),
        "scalar": (1.0, 1.0),
    },
}


@pytest.mark.parametrize("optimizer", sorted(PINNED))
def test_every_rule_pinned_at_16x_width(optimizer):
    model = _mlp()
    groups = mt.param_groups(model, 1e-2, optimizer, eps=(1e-30, 1e-3) if optimizer == "adafactor" else None)
    for role, want in PINNED[optimizer].items():
        g = _group_of(groups, model, NAMES[role])
        assert g["lr"] == pytest.approx(1e-2 * want[0], rel=1e-12), (optimizer, role)
        assert g[LR_FACTOR_KEY] == pytest.approx(want[0], rel=1e-12)
        if optimizer == "adafactor":
            assert g["eps"] == pytest.approx((1e-30 * want[1], 1e-3 * want[2]), rel=1e-12), role
        elif len(want) > 1:
            assert g["eps"] == pytest.approx(1e-8 * want[1], rel=1e-12), (optimizer, role)
        else:
            assert "eps" not in g, (optimizer, role)


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = _mlp()
    muon, adamw = mt.param_groups(model, 0.02, "muon", partner_lr=3e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw for p in g["params"]}
    assert in_muon == {"hidden.0.weight", "hidden.1.weight"}
    assert in_adamw == set(names.values()) - in_muon
    assert all(g["lr"] == pytest.approx(0.02) for g in muon)  # square hidden: spectral factor √(m_out/m_in) = 1
    assert _group_of(adamw, model, "readout.weight")["lr"] == pytest.approx(3e-3 / M)  # Adam's column, partner lr
    assert _group_of(adamw, model, "input.weight")["eps"] == pytest.approx(1e-8 / M)
    torch.optim.Muon(muon, lr=0.02)  # the real classes take them
    torch.optim.AdamW(adamw, lr=3e-3)


class Rect(nn.Module):
    """in → a → b → out: a hidden matrix (b × a) whose two dims scale differently."""

    def __init__(self, a: int, b: int):
        super().__init__()
        self.input, self.mid, self.readout = nn.Linear(8, a), nn.Linear(a, b), nn.Linear(b, 4)

    def forward(self, x):
        return self.readout(torch.relu(self.mid(torch.relu(self.input(x)))))


def _rect(a, b):
    torch.manual_seed(0)
    m = Rect(a, b)
    mt.parametrize(m, base=Rect(64, 64), delta=Rect(128, 128))
    return m


@pytest.mark.parametrize("adjust", [None, "original", "match_rms_adamw"])
def test_muon_steps_meet_the_spectral_condition_whatever_adjust_lr_fn(adjust):
    # mid: fan_in 64 → 256 (m_in 4), fan_out 64 → 1024 (m_out 16): µP wants ‖ΔW‖₂ × √(16/4) = 2 over the
    # base. torch's "original" already multiplies by √(rows/cols) = 2 here, "match_rms_adamw" by
    # 0.2·√1024 / (0.2·√64) = 4: the groups divide that out, so the step is 2×, never 4× or 8×.
    def step_norm(a, b):
        m = _rect(a, b)
        torch.manual_seed(1)
        groups = mt.param_groups(m, 0.01, "muon", adjust_lr_fn=adjust)
        opt = torch.optim.Muon(groups.muon, lr=0.01, weight_decay=0.0, adjust_lr_fn=adjust)
        before = m.mid.weight.detach().clone()
        m(torch.randn(64, 8)).pow(2).mean().backward()
        opt.step()
        return torch.linalg.matrix_norm(m.mid.weight.detach() - before, 2).item()

    ratio = step_norm(256, 1024) / step_norm(64, 64)
    assert ratio == pytest.approx(2.0, rel=0.2)
    factor = {None: 1.0, "original": 1.0, "match_rms_adamw": 0.5}[adjust]
    g = mt.param_groups(_rect(256, 1024), 0.01, "muon", adjust_lr_fn=adjust).muon[0]
    assert g[LR_FACTOR_KEY] == pytest.approx(factor)
    assert mt.optim.muon_adjust_ratio((1024, 256), (64, 64), adjust) == pytest.approx(2.0 / factor)


def test_muon_run_with_another_adjust_lr_fn_than_its_groups_raises_before_the_step():
    m = build(MLP, 128, 64, depth=3)  # the guard does not depend on width; Muon's bf16 step at 1024 took 74 s
    groups = mt.param_groups(m, 0.01, "muon")  # built for torch's default, "original"
    opt = torch.optim.Muon(groups.muon, lr=0.01, adjust_lr_fn="match_rms_adamw")
    before = m.hidden[0].weight.detach().clone()
    m(torch.randn(4, 32)).pow(2).mean().backward()
    with pytest.raises(ValueError, match="adjust_lr_fn='match_rms_adamw'.*built for adjust_lr_fn='original'"):
        opt.step()
    assert torch.equal(m.hidden[0].weight, before)  # nothing moved
    fresh = mt.param_groups(m, 0.01, "muon")  # (torch wrote its defaults into the first groups' dicts)
    torch.optim.Muon(fresh.muon, lr=0.01, adjust_lr_fn="original").step()  # the matching one runs
    with pytest.raises(ValueError, match="adjust_lr_fn must be one of"):
        mt.param_groups(m, 0.01, "muon", adjust_lr_fn="spectral")


def test_ready_muon_is_one_optimizer_with_state_dict_and_schedulers():
    torch.manual_seed(0)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def train(opt, model, steps):
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    m = build(MLP, 256, 64, depth=3)
    opt = mt.optim.Muon(m, lr=0.02, partner_lr=1e-3, adjust_lr_fn="match_rms_adamw")
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt.muon, torch.optim.Muon)
    assert len(opt.param_groups) == len(opt.muon.param_groups) + len(opt.adamw.param_groups)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    train(opt, m, 2)
    sched.step()
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.5 * 0.02 / 2)  # 0.5 × 0.02 × 1/√(256/64)
    saved = copy.deepcopy(opt.state_dict())  # a state_dict holds the live state tensors, as torch's
    weights = {k: v.clone() for k, v in m.state_dict().items()}
    train(opt, m, 2)
    after = {k: v.clone() for k, v in m.state_dict().items()}
    m.load_state_dict(weights)
    opt2 = mt.optim.Muon(m, lr=0.02, partner_lr=1e-3, adjust_lr_fn="match_rms_adamw")
    opt2.load_state_dict(saved)
    train(opt2, m, 2)
    for k, v in m.state_dict().items():
        assert torch.allclose(v, after[k], atol=1e-6), k
    with pytest.raises(ValueError, match="keys 'muon' and 'adamw'"):
        opt2.load_state_dict({"state": {}})


def test_lion_step_by_hand():
    p = nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0]))
    opt = mt.optimizers.Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    p.grad = torch.tensor([0.3, -0.1, 0.0, 2.0])
    opt.step()
    expected = torch.tensor([1.0, -2.0, 0.5, 3.0]) * (1 - 0.1 * 0.5) - 0.1 * torch.tensor([1.0, -1.0, 0.0, 1.0])
    assert torch.allclose(p.detach(), expected)
    assert torch.allclose(opt.state[p]["exp_avg"], 0.01 * torch.tensor([0.3, -0.1, 0.0, 2.0]))
    p.grad = torch.tensor([-0.3, 0.1, 1.0, 2.0])  # now sign(0.9·m + 0.1·g) mixes both
    before = p.detach().clone()
    opt.step()
    m = 0.01 * torch.tensor([0.3, -0.1, 0.0, 2.0])
    direction = torch.sign(0.9 * m + 0.1 * torch.tensor([-0.3, 0.1, 1.0, 2.0]))
    assert torch.allclose(p.detach(), before * 0.95 - 0.1 * direction)


def test_adafactor_cap_is_scaled_by_the_group_factor():
    # At step 400, 1/√t = 0.05 < the base lr 0.1: the base model steps 0.05·RMS(W). µP's group of factor ¼
    # (lr 0.025) must step ¼ of that, ρ = 0.0125; torch's own Adafactor gives it min(0.025, 0.05) = 0.025.
    def step_at_400(cls, lr_at_400=None):
        torch.manual_seed(0)
        p = nn.Parameter(torch.randn(8, 8))
        opt = cls([{"params": [p], "lr": 0.025, "weight_decay": 0.0, LR_FACTOR_KEY: 0.25}])
        p.grad = torch.randn(8, 8)
        opt.step()  # t = 1: min(0.025, 0.25/1) = 0.025 for both classes
        opt.state[p]["step"].fill_(399.0)
        if lr_at_400 is not None:
            opt.param_groups[0]["lr"] = lr_at_400
        before = p.detach().clone()
        p.grad = torch.randn(8, 8)
        opt.step()
        return p.detach() - before

    ours = step_at_400(mt.optimizers.Adafactor)
    assert torch.allclose(ours, step_at_400(torch.optim.Adafactor, lr_at_400=0.0125), rtol=1e-4, atol=1e-7)
    assert torch.allclose(step_at_400(torch.optim.Adafactor), 2 * ours, rtol=1e-4, atol=1e-7)  # the flattening


def test_adafactor_keeps_weight_decay_per_step_while_capped():
    p = nn.Parameter(torch.ones(4, 4))
    opt = mt.optimizers.Adafactor([{"params": [p], "lr": 0.025, "weight_decay": 0.4, LR_FACTOR_KEY: 0.25}])
    p.grad = torch.zeros(4, 4)
    opt.step()
    opt.state[p]["step"].fill_(399.0)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((4, 4), (1 - 0.025 * 0.4) ** 2))
    assert opt.param_groups[0]["lr"] == 0.025 and opt.param_groups[0]["weight_decay"] == 0.4  # restored


def test_depth_composes_with_every_optimizer():
    # ResMLP blocks 2 → 8 at α = ½: a normalised step in a block × m_L^-½ = ½ (Lion, Muon, SOAP like Adam);
    # SGD's × m_L^0; Adafactor's lr is Adam's over the init (which depth leaves alone in a block).
    torch.manual_seed(0)
    model = ResMLP(256, depth=8)
    mt.parametrize(model, base=ResMLP(64, depth=2), delta=ResMLP(128, depth=2), depth_alpha=0.5)
    spec = model._mutransfer_spec
    for name, _info in spec.params.items():
        adam = spec.factors(name, "adam")[0]
        assert spec.factors(name, "lion")[0] == pytest.approx(adam), name
        assert spec.factors(name, "soap")[0] == pytest.approx(adam), name
        init_f = spec.column_factor(name, "init")
        assert spec.factors(name, "adafactor")[0] == pytest.approx(adam / init_f), name
    block_hidden = next(n for n, i in spec.params.items() if i.role == "hidden" and i.depth_role == "block")
    assert spec.factors(block_hidden, "muon")[0] == pytest.approx(0.5)  # width 1 (square) × depth ½
    assert spec.factors(block_hidden, "adam")[0] == pytest.approx(0.25 * 0.5)
    assert spec.factors(block_hidden, "sgd")[0] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: mt.param_groups(m, 1e-3, "shampoo"), "unknown optimizer 'shampoo'"),
        (lambda m: mt.param_groups(m, 1e-3, "lion", eps=1e-8), "Lion has no ε"),
        (lambda m: mt.param_groups(m, 1e-3, "adafactor", eps=1e-8), "pair"),
        (lambda m: mt.param_groups(m, 1e-3, "adamw", partner_lr=1e-3), "partner_lr"),
        (lambda m: mt.param_groups(m, 1e-3, "adam", adjust_lr_fn="original"), "adjust_lr_fn belongs to"),
        (lambda m: mt.optim.build_optimizer(MLP(64), "muon", 1e-3, mup=False), "hidden=mt.optim.hidden_matrices"),
    ],
)
def test_bad_optimizer_settings_name_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(_mlp())


def test_plain_model_muon_finds_hidden_matrices_from_shapes():
    assert mt.optim.hidden_matrices(GPT(64), GPT(128)) == {
        f"blocks.{i}.{n}.weight" for i in range(2) for n in ("attn.qkv", "attn.proj", "fc", "fc_out")
    }
    opt = mt.optim.build_optimizer(MLP(64), "muon", 1e-3, mup=False, hidden=mt.optim.hidden_matrices(MLP(64), MLP(128)))
    assert len(opt.muon.param_groups[0]["params"]) == 1 and len(opt.adamw.param_groups[0]["params"]) == 5


def _coord(recipe_name, optimizer, mup, widths):
    recipe = get_recipe(recipe_name)

    def make(w):
        m = recipe.build(w)
        if mup:
            mt.parametrize(m, base=recipe.build(widths[0]), delta=recipe.build(2 * widths[0]))
        return m

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mt.coord_check(
            make,
            widths,
            recipe.data(),
            optimizer=optimizer,
            lr=recipe.lr_for(optimizer),
            steps=4,
            seeds=2,
            progress=False,
        )


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "lion", "adafactor", "soap", "muon"])
def test_coord_check_passes_mup_and_fails_sp_on_the_mlp(optimizer):
    # margins as at 1024 (tests/conftest.py, "Sizes"); Muon's bf16 step: µP −0.12 / SP +0.60 at 64…256
    # (14 s) against −0.13 / +0.67 at 64…512 (130 s)
    widths = [64, 128, 256] if optimizer == "muon" else [64, 256, 512]
    assert _coord("mlp", optimizer, True, widths).passed
    assert not _coord("mlp", optimizer, False, widths).passed


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["lion", "muon"])
def test_coord_check_passes_mup_and_fails_sp_on_the_gpt(optimizer):
    widths = [32, 64, 128, 256]
    assert _coord("gpt", optimizer, True, widths).passed
    assert not _coord("gpt", optimizer, False, widths[:3]).passed  # failing on less range is the stricter test


@pytest.mark.parametrize("optimizer", ["lion", "muon", "adafactor"])
def test_sweep_objective_trains_with_the_optimizer(optimizer):
    from mutransfer.sweep.recipes import train_mlp
    from mutransfer.sweep.scale import Scale

    hp = {"lr": 1e-3 if optimizer != "adafactor" else 0.03, "optimizer": optimizer, "steps": 20}
    first = train_mlp({**hp, "steps": 2}, Scale(128, 64, "mup"))
    loss = train_mlp(hp, Scale(128, 64, "mup"))
    assert math.isfinite(loss) and loss < first
    assert math.isfinite(train_mlp(hp, Scale(128, 64, "sp")))
    with pytest.raises(ValueError, match="hyperparameter 'optimizer'"):
        train_mlp({**hp, "optimizer": "shampoo"}, Scale(128, 64, "mup"))


def test_describe_prints_the_factors_param_groups_writes():
    model = _mlp()
    text = mt.describe(model, "muon", adjust_lr_fn="match_rms_adamw")
    groups = mt.param_groups(model, 1.0, "muon", adjust_lr_fn="match_rms_adamw")
    row = next(line for line in text.splitlines() if line.startswith("hidden.0.weight"))
    assert row.split()[-3:] == ["muon", f"{groups.muon[0]['lr']:.4g}", "-"] == ["muon", "0.25", "-"]
    row = next(line for line in text.splitlines() if line.startswith("readout.weight"))
    assert row.split()[-3:] == ["adamw", "0.0625", "1"]
    text = mt.describe(model, "adafactor")
    assert "ε₁×" in text and next(line for line in text.splitlines() if line.startswith("hidden.0.weight")).split()[
        -4:
    ] == ["adafactor", "0.25", "0.0625", "0.25"]


def _regret(optimizer, grid, parametrization, seeds=2, wide=256):
    """The residual MLP (pre-LN blocks) regressing a teacher's outputs — not the benchmark's models or
    data. The lr tuned at width 32 (mean of 2 seeds), used at `wide`: its loss there over the wide
    model's own best on the grid, minus 1 (the transfer's regret), and the narrow model's best index."""
    from mutransfer.sweep.recipes import train_resmlp
    from mutransfer.sweep.scale import Scale

    hp = {"optimizer": optimizer, "task": "regress", "steps": 60, "d_in": 16, "d_out": 4}
    if optimizer == "muon":
        hp["adjust_lr_fn"] = "match_rms_adamw"

    def losses(width):
        return [
            sum(train_resmlp({**hp, "lr": 2.0**k}, Scale(width, 32, parametrization, seed=s)) for s in range(seeds))
            / seeds
            for k in grid
        ]

    narrow, target = losses(32), losses(wide)
    tuned = min(range(len(narrow)), key=narrow.__getitem__)
    return target[tuned] / min(target) - 1, tuned


@pytest.mark.slow
def test_lion_lr_transfers_on_another_task_and_model():
    regret, tuned = _regret("lion", range(-10, -5), "mup")
    assert 0 < tuned < 4  # a located optimum, not the grid's edge
    assert regret <= 0.05


@pytest.mark.slow
def test_muon_lr_transfers_better_than_sp_on_another_task_and_model():
    # Width 32 → 128 (Newton–Schulz costs ~15 matmuls per matrix and step: at 256 this test took 197 s).
    # Measured at 128 (2-core CPU): µP's optimum stays at 2^-4 (regret 0), SP's moves 2^-4 → 2^-7
    # (regret 9.3%). At 256: µP 2^-4 → 2^-6 (≈ 17%), SP → 2^-8 or below (≈ 36%).
    mup, tuned = _regret("muon", range(-8, -2), "mup", seeds=1, wide=128)
    sp, _ = _regret("muon", range(-8, -2), "sp", seeds=1, wide=128)
    assert 0 < tuned < 5
    assert mup < 0.6 * sp, (mup, sp)


@pytest.mark.parametrize("shape", [(48, 96), (96, 48)])
def test_the_suites_float32_newton_schulz_matches_torchs_bfloat16_one(shape):
    # tests/muon_fp32.py swaps Muon's bfloat16 iteration for a float32 one on CPU (17× faster here):
    # the swap is only sound if both orthogonalise a gradient to the same update.
    from muon_fp32 import MUON_BF16, newton_schulz_fp32

    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ours, torchs = (
        newton_schulz_fp32(g, (3.4445, -4.7750, 2.0315), 5, 1e-7),
        MUON_BF16(g, (3.4445, -4.7750, 2.0315), 5, 1e-7),
    )
    assert ours.shape == torchs.shape == g.shape
    assert (ours - torchs.float()).norm() / torchs.float().norm() < 0.03
    s = torch.linalg.svdvals(ours)
    assert 0.5 < s.min() and s.max() < 1.5  # Muon's "US'Vᵀ, S' ≈ Uniform(0.5, 1.5)"
