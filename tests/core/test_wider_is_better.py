"""At fixed HPs, a wider µP MLP reaches a lower training loss (wider is better, TP5 §7)."""

import pytest
import torch
import torch.nn.functional as F

import mutransfer as mt
from mutransfer.recipes import MLP


def _final_loss(width: int, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 32, generator=g)
    teacher = torch.randn(32, 10, generator=g)
    y = (torch.tanh(x @ teacher) @ torch.randn(10, 10, generator=g)).argmax(-1)
    torch.manual_seed(seed)
    model = mt.parametrize(MLP(width, depth=3), base=MLP(32, depth=3), delta=MLP(64, depth=3))
    opt = torch.optim.Adam(mt.param_groups(model, 1e-2, "adam"))
    for _step in range(100):
        idx = torch.randint(0, 512, (128,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


@pytest.mark.slow
def test_wider_is_better_at_fixed_hyperparameters():
    widths = [32, 128, 512]
    losses = [sum(_final_loss(w, s) for s in range(2)) / 2 for w in widths]
    assert losses[0] > losses[1] > losses[2], dict(zip(widths, losses))
