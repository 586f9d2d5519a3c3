"""External oracle: the Table 8 formulation matches Microsoft's `mup` 1.0.0 parameter for parameter."""

import pytest
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import MLP

mup = pytest.importorskip("mup")


class MuMLP(MLP):
    """The same MLP written the `mup` way: the readout is a MuReadout."""

    def __init__(self, width, **kw):
        super().__init__(width, **kw)
        plain = self.readout
        self.readout = mup.MuReadout(width, plain.out_features)
        with torch.no_grad():  # keep the plain readout's values so both models start equal
            self.readout.weight.copy_(plain.weight)
            self.readout.bias.copy_(plain.bias)


def _pair(width=512, base=64, seed=0, meta_base=True):
    torch.manual_seed(seed)
    ours = MLP(width)
    torch.manual_seed(seed)
    theirs = MuMLP(width)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)  # same construction order, same init before µP
    if meta_base:
        with torch.device("meta"):
            b_ours, d_ours = MLP(base), MLP(2 * base)
    else:
        b_ours, d_ours = MLP(base), MLP(2 * base)
    mt.parametrize(ours, base=b_ours, delta=d_ours, formulation="table8")
    mup.set_base_shapes(theirs, MuMLP(base), delta=MuMLP(2 * base))
    return ours, theirs


def _lr_of(optimizer):
    return {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}


def _wd_of(optimizer):
    return {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}


def test_init_matches_mup_exactly_with_a_shapes_only_base():
    ours, theirs = _pair()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a, b), name


def test_init_std_matches_mup_with_a_real_base():
    ours, theirs = _pair(width=1024, meta_base=False)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        tol = 0.05 if a.numel() > 5000 else 0.25
        assert a.std().item() == pytest.approx(b.std().item(), rel=tol), name


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_per_parameter_lr_and_weight_decay_match_mup(kind):
    ours, theirs = _pair()
    torch_cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    mup_cls = {"sgd": mup.MuSGD, "adam": mup.MuAdam, "adamw": mup.MuAdamW}[kind]
    opt_ours = torch_cls(mt.param_groups(ours, 0.1, kind, weight_decay=0.01))
    opt_theirs = mup_cls(theirs.parameters(), lr=0.1, weight_decay=0.01)
    lr_ours, lr_theirs = _lr_of(opt_ours), _lr_of(opt_theirs)
    wd_ours, wd_theirs = _wd_of(opt_ours), _wd_of(opt_theirs)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert lr_ours[id(a)] == pytest.approx(lr_theirs[id(b)], rel=1e-12), name
        assert wd_ours[id(a)] == pytest.approx(wd_theirs[id(b)], rel=1e-12), name


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_training_trajectory_matches_mup(kind):
    ours, theirs = _pair()
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    if kind == "sgd":
        opt_ours = torch.optim.SGD(mt.param_groups(ours, 0.05, "sgd"), momentum=0.9)
        opt_theirs = mup.MuSGD(theirs.parameters(), lr=0.05, momentum=0.9)
    else:  # mup leaves ε alone; make it negligible so that only the lrs matter
        opt_ours = torch.optim.Adam(mt.param_groups(ours, 1e-2, "adam", eps=1e-16))
        opt_theirs = mup.MuAdam(theirs.parameters(), lr=1e-2, eps=1e-16)
    for _ in range(5):
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-5)
