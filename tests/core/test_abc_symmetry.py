"""TP5 Table 3 and Table 8 are one parametrization: same function trajectory to float error."""

import pytest
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import GPT, MLP


def _trajectory(cls, formulation, optimizer, width=256, steps=5, **kw):
    torch.manual_seed(0)
    base, delta = cls(64, **kw), cls(128, **kw)
    torch.manual_seed(1)
    model = cls(width, **kw)
    mt.parametrize(model, base=base, delta=delta, formulation=formulation)
    model.double()
    groups = mt.param_groups(model, 1e-2 if optimizer == "adam" else 0.5, optimizer, eps=1e-6)
    opt = torch.optim.Adam(groups) if optimizer == "adam" else torch.optim.SGD(groups, momentum=0.9)
    g = torch.Generator().manual_seed(2)
    if cls is MLP:
        x, y = torch.randn(32, 32, generator=g, dtype=torch.float64), torch.randint(0, 10, (32,), generator=g)
    else:
        x = torch.randint(0, 256, (4, 16), generator=g)
        y = torch.randint(0, 256, (4, 16), generator=g)
    outs = []
    for _ in range(steps):
        out = model(x)
        outs.append(out.detach())
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    outs.append(model(x).detach())
    return torch.stack(outs)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("cls,kw", [(MLP, {}), (GPT, {"tied": False})])
def test_table3_and_table8_train_identically(cls, kw, optimizer):
    t3 = _trajectory(cls, "table3", optimizer, **kw)
    t8 = _trajectory(cls, "table8", optimizer, **kw)
    assert not torch.allclose(t3[0], t3[-1])  # the model did learn
    torch.testing.assert_close(t3, t8, rtol=1e-9, atol=1e-9)
