import pytest
import torch


@pytest.fixture
def one_thread():
    """Benchmarks may set torch's thread count; give it back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield 1
    torch.set_num_threads(before)
