"""jobs/bench/runs.py: a timed call counts its process's CPU seconds beside its wall seconds."""

import time

import pytest

from jobs.bench.runs import summarize, timed


def test_cpu_seconds_count_work_not_waiting():
    def sleeping(gen_len):
        time.sleep(0.3)
        return gen_len

    def working(gen_len):
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        return gen_len

    slept, worked = timed(sleeping, 6), timed(working, 6)
    assert slept["seconds"] >= 0.3 and slept["cpu_seconds"] < 0.1
    assert worked["cpu_seconds"] == pytest.approx(0.3, abs=0.05)
    assert worked["tokens_per_cpu_s"] == pytest.approx(6 / worked["cpu_seconds"])
    assert summarize([slept, worked, worked])["tokens_per_cpu_s"] == worked["tokens_per_cpu_s"]
