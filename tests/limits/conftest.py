"""The limits tests run their many small float64 ops on one thread: at these sizes a second
thread adds synchronisation, not speed, and on a loaded machine its spinning costs several-fold."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
