"""At base width µP is the user's own model: same parameters, same lrs, same outputs."""

import pytest
import torch

import mutransfer as mt
from mutransfer.recipes import CNN, GPT, MLP, MHATransformer


@pytest.mark.parametrize(
    "cls,x",
    [
        (MLP, torch.randn(4, 32)),
        (CNN, torch.randn(2, 3, 8, 8)),
        (GPT, torch.randint(0, 256, (2, 16))),
        (MHATransformer, torch.randn(2, 5, 16)),
    ],
)
@pytest.mark.parametrize("formulation", ["table3", "table8"])
def test_base_width_is_bit_for_bit_the_plain_model(cls, x, formulation):
    torch.manual_seed(0)
    plain = cls(64)
    torch.manual_seed(0)
    mu = cls(64)
    mt.parametrize(mu, base=cls(64), delta=cls(128), formulation=formulation)
    for (n, p), q in zip(plain.named_parameters(), mu.parameters()):
        assert torch.equal(p, q), n
    assert torch.equal(plain(x), mu(x))
    for optimizer in ("sgd", "adam", "adamw"):
        groups = mt.param_groups(mu, 3e-3, optimizer, weight_decay=0.1, eps=1e-7)
        assert len(groups) == 1
        assert groups[0]["lr"] == 3e-3 and groups[0]["weight_decay"] == 0.1
        if optimizer != "sgd":
            assert groups[0]["eps"] == 1e-7
    assert mu._mutransfer_spec.forward_constants == {}


def test_training_at_base_width_matches_plain_training_exactly():
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def train(model, groups):
        opt = torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1)
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss.item()

    torch.manual_seed(0)
    plain = MLP(64)
    torch.manual_seed(0)
    mu = mt.parametrize(MLP(64), base=MLP(64), delta=MLP(128))
    assert train(plain, plain.parameters()) == train(mu, mt.param_groups(mu, 1e-2, "adamw", weight_decay=0.1))
