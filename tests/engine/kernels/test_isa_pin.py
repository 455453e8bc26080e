"""FLEXBATCH_ISA and FLEXBATCH_KERNELS are checked as options are: a bad value is one EnvSettingError naming it and
the values taken (not a traceback from the kernels' C++); a pin above what the CPU has is logged once, naming the
set that runs."""

import logging

import pytest

from engine.env_settings import EnvSettingError
from engine.kernels import compiled


@pytest.fixture
def fresh(monkeypatch):
    """ops() tried anew in this test (and as it was afterwards)."""
    monkeypatch.setattr(compiled, "_loaded", [])
    monkeypatch.delenv("FLEXBATCH_KERNELS", raising=False)
    return monkeypatch


@pytest.mark.parametrize("value", ["bogus", "AVX2", "avx-512"])
def test_a_bad_pin_is_one_error_naming_the_accepted_sets(fresh, value):
    fresh.setenv("FLEXBATCH_ISA", value)
    with pytest.raises(EnvSettingError) as e:
        compiled.ops()
    assert str(e.value) == (f"FLEXBATCH_ISA={value!r} is invalid: expected one of avx512, avx2, scalar, or unset "
                            "(the best set this CPU runs)")


def test_a_bad_kernels_switch_is_one_error(fresh):
    fresh.setenv("FLEXBATCH_KERNELS", "of")
    with pytest.raises(EnvSettingError, match="FLEXBATCH_KERNELS='of' is invalid: expected one of on, off"):
        compiled.ops()


class _CpuWithAvx2:
    """The compiled module's instruction-set choice on a CPU with AVX2 and no AVX-512."""

    def __init__(self):
        self.pins = []

    def select_isa(self, pin):
        self.pins.append(pin)
        return "none" if pin == "scalar" else "avx2"


@pytest.mark.parametrize(("pin", "runs", "warned"), [("avx512", "avx2", True), ("avx2", "avx2", False),
                                                     ("scalar", "scalar", False), ("", "avx2", False)])
def test_a_pin_above_the_cpu_is_logged_once_naming_the_set_that_runs(fresh, caplog, pin, runs, warned):
    fresh.setenv("FLEXBATCH_ISA", pin)
    fake = _CpuWithAvx2()
    fresh.setattr(compiled, "load", lambda build_if_missing: fake)
    with caplog.at_level(logging.INFO, logger="engine.kernels.compiled"):
        assert compiled.ops() is fake and compiled.ops() is fake
    assert fake.pins == [pin]
    lines = [r.getMessage() for r in caplog.records if r.name == "engine.kernels.compiled"]
    if warned:
        assert lines == [f"FLEXBATCH_ISA={pin} asks for more than this CPU has: the own kernels run with {runs}"]
    else:
        assert len(lines) == 1 and lines[0].startswith(f"own kernels: instruction set {runs}")
