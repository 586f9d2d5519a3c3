"""The suite's fixtures and collection order (the shared helpers live in tests/model_helpers.py: a module
named conftest is ambiguous — tests/limits has its own, and `from conftest import` took whichever
was imported first).

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
from torch import nn

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


@pytest.fixture(autouse=True)
def _no_leaked_torch_state():
    """A test that leaves a torch function mode on the stack (a `with torch.device("meta")`, an FP8
    simulation or a probe not exited) or a default device set changes what every later test of its
    process builds — a flake that depends on the order xdist runs the tests in. The test that leaks
    fails here, named; the state is reset so that the next test runs clean."""
    depth = torch._C._len_torch_function_stack()
    yield
    leaked = []
    while torch._C._len_torch_function_stack() > depth:
        leaked.append(type(torch._C._pop_torch_function_stack()).__name__)
    device = torch.get_default_device()
    if device.type != "cpu":
        torch.set_default_device("cpu")
        leaked.append(f"default device {device}")
    if leaked:
        pytest.fail(f"the test left torch state behind: {', '.join(leaked)}", pytrace=False)


# Muon's Newton–Schulz in float32 on CPU: see tests/muon_fp32.py.
import muon_fp32  # noqa: E402, F401
import zoo  # noqa: E402

# The longest tests (seconds in the last fresh-clone CI run, 2-core CPU, pytest -n 2): they start first.
_LONGEST = (
    "test_demo_quick_reproduces_the_headline_result",  # 318 s
    "test_transformer_optimal_lr_stays_across_depth",  # 97 s
    "test_resnet_transfer_benchmark_quick",  # 71 s
)


# {test function: zoo entries it did not collect}, recorded at collection for
# tests/core/test_zoo_collected.py; None where the run selected single tests (node ids, --lf, --sw).
ZOO_UNCOLLECTED = pytest.StashKey[dict | None]()


def _whole_files(config) -> bool:
    """Whether this run collects whole test files (no node ids, no last-failed or stepwise filter)."""
    if any("::" in str(a) for a in config.args):
        return False
    return not any(config.getoption(o, False) for o in ("lf", "stepwise", "stepwise_skip"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped where this process sees no GPU. The slow tests run first, the
    longest of them at the very start: collected in file order, the 5-minute demo test started near
    the end of a 2-worker run and left the other worker idle for minutes; started first, the short
    tests fill in around it. The zoo tests' coverage is recorded here, before `-m`/`-k` deselect any."""
    config.stash[ZOO_UNCOLLECTED] = zoo.uncollected(items) if _whole_files(config) else None
    rank = {name: i for i, name in enumerate(_LONGEST)}
    items.sort(key=lambda it: (rank.get(it.originalname, len(rank)), 0 if "slow" in it.keywords else 1))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="cuda: needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def zoo_uncollected(request) -> dict | None:
    """{test function: zoo entries it did not collect} for this run (None: it selected single tests)."""
    return request.config.stash.get(ZOO_UNCOLLECTED, None)


@pytest.fixture
def tmp_json(tmp_path):
    return tmp_path / "shapes.json"


Factory = Callable[[int], nn.Module]
