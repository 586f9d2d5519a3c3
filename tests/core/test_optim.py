"""param_groups with user groups, torch optimizers, and LR schedulers."""

import pytest
import torch

import mutransfer as mt
from model_helpers import build
from mutransfer.recipes import GPT, MLP


def test_user_groups_are_kept_and_split():
    m = build(GPT, 256, 64)
    decay = [p for n, p in m.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in m.named_parameters() if p.ndim < 2]
    groups = mt.param_groups(
        m,
        1e-3,
        "adamw",
        weight_decay=0.1,
        groups=[{"params": decay, "tag": "decay"}, {"params": no_decay, "weight_decay": 0.0, "tag": "no_decay"}],
    )
    assert {g["tag"] for g in groups} == {"decay", "no_decay"}
    assert all(g["weight_decay"] == 0.0 for g in groups if g["tag"] == "no_decay")
    assert sum(len(g["params"]) for g in groups) == len(list(m.parameters()))
    hidden = next(g for g in groups if any(p is m.blocks[0].fc.weight for p in g["params"]))
    assert hidden["tag"] == "decay" and hidden["lr"] == pytest.approx(1e-3 / 4)
    assert hidden["weight_decay"] == pytest.approx(0.1 * 4)


def test_group_lr_override_is_scaled_too():
    m = build(MLP, 256, 64)
    groups = mt.param_groups(m, 1e-3, "adam", groups=[{"params": list(m.parameters()), "lr": 1e-2}])
    assert sorted({g["lr"] for g in groups}) == pytest.approx([1e-2 / 4, 1e-2])


@pytest.mark.parametrize("kwargs", [{"foreach": True}, {"foreach": False}, {"fused": True}])
def test_works_with_torch_adam_variants(kwargs):
    m = build(MLP, 256, 64)
    opt = torch.optim.AdamW(mt.param_groups(m, 1e-3, "adamw"), **kwargs)
    loss = m(torch.randn(8, 32)).pow(2).mean()
    loss.backward()
    opt.step()
    assert len(opt.param_groups) == 4  # (lr, ε) = (1, ¼), (¼, ¼), (¼, 1), (1, 1)


def test_thin_optimizer_conveniences():
    m = build(MLP, 256, 64)
    for factory, momentum in (
        (mt.optim.SGD, {"momentum": 0.9, "nesterov": True}),
        (mt.optim.Adam, {}),
        (mt.optim.AdamW, {"betas": (0.9, 0.95)}),
    ):
        opt = factory(m, 1e-3, weight_decay=0.01, **momentum)
        assert sorted({round(g["lr"] / 1e-3, 6) for g in opt.param_groups}) in ([0.25, 1.0], [0.25, 1.0, 4.0])


@pytest.mark.parametrize(
    "make",
    [
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.5**s),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.3),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=5),
    ],
)
def test_multiplicative_schedulers_keep_the_ratios(make):
    m = build(MLP, 256, 64)
    opt = torch.optim.Adam(mt.param_groups(m, 1e-3, "adam"))
    sched = make(opt)
    for _ in range(4):
        opt.step()
        sched.step()
        mt.optim.check_lr_ratios(opt)


def test_one_cycle_with_a_scalar_max_lr_is_caught_and_fixed():
    m = build(MLP, 256, 64)
    opt = torch.optim.Adam(mt.param_groups(m, 1e-3, "adam"))
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)
    with pytest.raises(ValueError, match="scaled_lrs"):
        mt.optim.check_lr_ratios(opt)
    opt = torch.optim.Adam(mt.param_groups(m, 1e-3, "adam"))
    sched = mt.optim.OneCycleLR(opt, max_lr=1e-2, total_steps=10)
    for _ in range(5):
        opt.step()
        sched.step()
        mt.optim.check_lr_ratios(opt)
    assert [g["max_lr"] for g in opt.param_groups] == pytest.approx(
        [1e-2 * g["mup_lr_factor"] for g in opt.param_groups]
    )
