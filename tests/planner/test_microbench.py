"""The matmul-path microbenchmarks the profiler and `bench engine` build on."""

import pytest
import torch

from planner.microbench import layer_report, timed_call, timings

pytestmark = pytest.mark.usefixtures("one_thread")


def test_microbench_reports_every_path():
    report = layer_report(n=64, k=128, rows=(1, 16), repeats=1, dtype=torch.float32)
    assert report["packed_bytes"] < report["weight_bytes"] / 4
    assert [r["rows"] for r in report["by_rows"]] == [1, 16]
    for r in report["by_rows"]:
        assert all(r[key] > 0 for key in ("gemm_gflops", "dequant_gemm_gflops", "int4pack_gflops"))


def test_the_one_timer_returns_what_it_timed_and_times_each_repeat():
    calls = []
    result, seconds = timed_call(lambda: calls.append(1) or "done")
    assert result == "done" and seconds >= 0 and calls == [1]
    assert len(timings(lambda: calls.append(1), repeats=3, warmup=2)) == 3 and len(calls) == 6
