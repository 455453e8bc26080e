"""A machine's first run builds the own kernels: the build logs its own time, and the planner's search, during which
the build used to start, no longer counts it as its own."""

import logging
import time

from engine.kernels import compiled
from planner.search import search
from tests.planner.specs import LLAMA_300M, server_cpu
from tests.planner.test_search import WORK

BUILD_S = 1.5


def test_the_search_does_not_count_a_kernel_build_as_its_own_time(monkeypatch):
    built = []

    def first_use():  # the build of a machine's first run, done once per process
        if not built:
            built.append(1)
            time.sleep(BUILD_S)

    monkeypatch.setattr(compiled, "ops", first_use)
    started = time.perf_counter()
    plan = search(LLAMA_300M, server_cpu(), WORK)
    assert built == [1] and time.perf_counter() - started >= BUILD_S
    assert plan.seconds < BUILD_S


def test_a_kernel_build_logs_its_own_time(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(compiled, "build_dir", lambda: tmp_path / "0123456789abcdef")
    monkeypatch.setattr(compiled, "compiler", lambda: "g++")
    monkeypatch.setattr(compiled, "_compile", lambda cxx, work: "module")
    monkeypatch.setattr(compiled, "write_record", lambda library: None)
    with caplog.at_level(logging.WARNING, logger="engine.kernels.compiled"):
        assert compiled.build() == "module"
    assert "(2-5 minutes on 2 cores)" in caplog.text and "built the project's C++ kernels in 0 s" in caplog.text
