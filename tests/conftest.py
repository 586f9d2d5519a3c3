"""Shared helpers for the tests: building plain/µP models and measuring coordinate changes.

Sizes: a coordinate check's verdict margin is max(slope − 2·SE − expected − allowed slope) over its
trends (passes below 0, fails above). Measured on a 2-core CPU (issue 28, mt.coord_check as the tests call it):
the MLP recipe's margins at widths 64,256,512 are those at 64,256,1024 within 0.05 (µP −0.12…−0.16,
SP +0.52…+1.36 for sgd/adam/lion/adafactor) at half the time, so the tests stop at 512 where only
the verdict is asserted. The tied GPT's (widths 64…512 vs 64…1024, 3 seeds): µP sgd −0.13 vs −0.13,
adam −0.12 vs −0.08; attention at 1/√d +0.34 vs +0.34 (sgd), attention logits the worst offender in
both. Muon steps in bfloat16, which a CPU runs slowly: keep its widths small.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mutransfer as mt

# One intra-op thread per test process by default. With 2 threads, any other busy process on the
# cores (a second xdist worker, a benchmark, a shared runner) makes OpenMP's threads wait on each
# other: measured on a loaded 2-core CPU, one depth coordinate check took 101-107 s with 2 threads
# and 10.5-11.2 s with 1. MUTRANSFER_TEST_THREADS=2 restores the old setting on a machine of one's own.
torch.set_num_threads(int(os.environ.get("MUTRANSFER_TEST_THREADS", "1")))
_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _one_thread_again():
    """A test that sets torch's threads (a recipe's `threads` hyperparameter, a sweep's placement run
    in this process) would leave them set for every later test of this process."""
    yield
    if torch.get_num_threads() != _THREADS:
        torch.set_num_threads(_THREADS)


# Muon's Newton–Schulz in float32 on CPU: see tests/muon_fp32.py.
import muon_fp32  # noqa: E402, F401


def build(cls, width: int, base_width: int, seed: int = 0, mup: bool = True, **kw) -> nn.Module:
    """The model at `width`, seeded; in µP relative to `base_width` when `mup`."""
    torch.manual_seed(seed)
    model = cls(width, **kw)
    if mup:
        mt.parametrize(model, base=cls(base_width, **kw), delta=cls(2 * base_width, **kw))
    return model


def make_optimizer(model: nn.Module, optimizer: str, lr: float, mup: bool) -> torch.optim.Optimizer:
    groups = mt.param_groups(model, lr, optimizer) if mup else model.parameters()
    if optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr)
    return torch.optim.Adam(groups, lr=lr)


def coordinate_changes(
    model: nn.Module,
    modules: dict[str, nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: str,
    lr: float,
    mup: bool,
    steps: int = 3,
) -> dict[str, float]:
    """Mean |activation(t) − activation(0)| of each named module's output after `steps` steps."""
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda mod, a, out, n=n: captured.__setitem__(n, out.detach().clone()))
        for n, m in modules.items()
    ]
    opt = make_optimizer(model, optimizer, lr, mup)
    with torch.no_grad():
        model(x)
    start = dict(captured)
    for _ in range(steps):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return {n: (captured[n] - start[n]).abs().mean().item() for n in modules}


# The longest tests (seconds in the last fresh-clone CI run, 2-core CPU, pytest -n 2): they start first.
_LONGEST = (
    "test_demo_quick_reproduces_the_headline_result",  # 318 s
    "test_transformer_optimal_lr_stays_across_depth",  # 97 s
    "test_resnet_transfer_benchmark_quick",  # 71 s
)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped where this process sees no GPU. The slow tests run first, the
    longest of them at the very start: collected in file order, the 5-minute demo test started near
    the end of a 2-worker run and left the other worker idle for minutes; started first, the short
    tests fill in around it."""
    rank = {name: i for i, name in enumerate(_LONGEST)}
    items.sort(key=lambda it: (rank.get(it.originalname, len(rank)), 0 if "slow" in it.keywords else 1))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="cuda: needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_json(tmp_path):
    return tmp_path / "shapes.json"


Factory = Callable[[int], nn.Module]
