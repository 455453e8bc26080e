"""The instruction sets the project's own kernels can run with on this CPU (the `pinned` fixture of conftest.py pins
one for a test)."""

import pytest

from engine.kernels import compiled


def isas() -> list[str]:
    mod = compiled.ops()
    best = mod.isa() if mod is not None else "none"
    return {"avx512": ["avx512", "avx2"], "avx2": ["avx2"]}.get(best, [])


needs_both = pytest.mark.skipif("avx512" not in isas(), reason="needs an AVX-512 CPU to compare both sets")


def on_both(pinned, run):
    """run()'s results pinned to AVX2 and to AVX-512 (for tests marked needs_both)."""
    pinned("avx2")
    a = run()
    pinned("avx512")
    return a, run()
