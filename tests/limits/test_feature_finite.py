"""`mt.limits.finite.train_mup`, the one home of the finite networks `FeatureLimit` is the limit of
(issue 45, item 6: the loop was written out in the example, the convergence benchmark and the tests)."""

import sys
from pathlib import Path

import pytest
import torch

import mutransfer as mt
from mutransfer.limits import finite

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from limits_convergence import ln_mlp  # the convergence table's LayerNorm MLP


def _data(n=8, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return x, torch.randn(n, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)


def _make(n, seed=0):
    torch.manual_seed(seed)
    return ln_mlp(n)


def test_train_mup_is_parametrize_then_sgd_on_param_groups_over_the_limits_batches():
    x, y, xt = _data()
    base = _make(16)
    net = finite.train_mup(_make(128, 1), base, x, y, steps=4, lr=0.3, batch_size=3, batch_seed=7, momentum=0.5)
    by_hand = mt.parametrize(_make(128, 1), base=base)
    opt = torch.optim.SGD(mt.param_groups(by_hand, 0.3, "sgd"), lr=0.3, momentum=0.5)
    for idx in finite.sgd_batches(len(x), 4, 3, 7):
        loss = 0.5 * ((by_hand(x[idx]) - y[idx, None]) ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        assert float((net(xt) - by_hand(xt)).abs().max()) == 0.0
        assert float((net(xt) - _make(128, 1)(xt)).abs().max()) > 0.05  # it trained


def test_train_mup_with_the_limits_seed_is_the_network_the_limit_describes():
    """Minibatches of 3 with momentum: width-1024 networks on the limit's batches (batch_seed = its
    seed) are far closer to it than networks on another order of the same data (measured RMS gaps
    0.046 and 0.55)."""
    x, y, xt = _data()
    base = _make(16)
    lim = mt.limits.FeatureLimit(_make(256, 1), base=base, particles=2**11, groups=4, seed=3)
    f = lim.fit(x, y, steps=4, lr=0.1, momentum=0.5, batch_size=3).predict(xt)[:, 0]
    gaps = []
    for batch_seed in (3, 4):
        preds = []
        for s in range(2):
            net = finite.train_mup(_make(1024, 100 + s), base, x, y, 4, 0.1, 3, batch_seed, momentum=0.5)
            with torch.no_grad():
                preds.append(net(xt)[:, 0])
        gaps.append(float((torch.stack(preds) - f).pow(2).mean().sqrt()))
    assert float(f.pow(2).mean().sqrt()) > 0.2
    assert gaps[0] < 0.1 and gaps[1] > 0.3, gaps


def test_train_mup_bad_input_names_the_argument():
    x, y, _ = _data()
    with pytest.raises(ValueError, match=r"y has 2 target\(s\) per input but the model gives 1"):
        finite.train_mup(_make(32), _make(16), x, torch.zeros(8, 2), steps=1, lr=0.1)
    with pytest.raises(ValueError, match="momentum must be a number in"):
        finite.train_mup(_make(32), _make(16), x, y, steps=1, lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="lr must be a positive"):
        finite.train_mup(_make(32), _make(16), x, y, steps=1, lr=0.0)
    with pytest.raises(TypeError, match="model and base must be torch.nn.Module"):
        finite.train_mup(_make(32), None, x, y, steps=1, lr=0.1)
