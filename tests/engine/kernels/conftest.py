import pytest

from engine.kernels import compiled


@pytest.fixture
def pinned():
    """Pin the own kernels to one instruction set for a test; the best set is chosen again afterwards."""
    mod = compiled.ops()
    yield lambda isa: mod.select_isa(isa)
    mod.select_isa("")
