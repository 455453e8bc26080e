"""The instruction sets the project's own kernels can run with on this CPU, and a fixture that pins one for a test
(the best set is chosen again afterwards)."""

import pytest

from engine.kernels import compiled


def isas() -> list[str]:
    mod = compiled.ops()
    best = mod.isa() if mod is not None else "none"
    return {"avx512": ["avx512", "avx2"], "avx2": ["avx2"]}.get(best, [])


@pytest.fixture
def pinned():
    mod = compiled.ops()
    yield lambda isa: mod.select_isa(isa)
    mod.select_isa("")
