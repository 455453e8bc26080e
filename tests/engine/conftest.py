import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Small ops: one thread avoids OpenMP stalls when the 2 cores are shared with other jobs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
