"""The instruction sets the project's own kernels can run with on this CPU (the `pinned` fixture of conftest.py pins
one for a test)."""

from engine.kernels import compiled


def isas() -> list[str]:
    mod = compiled.ops()
    best = mod.isa() if mod is not None else "none"
    return {"avx512": ["avx512", "avx2"], "avx2": ["avx2"]}.get(best, [])
