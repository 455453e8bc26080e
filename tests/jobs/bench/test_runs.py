"""jobs/bench/runs.py: a timed call counts its process's CPU seconds beside its wall seconds; generations warm up on
2 tokens, then run the asked length round by round."""

import time

import pytest

from jobs.bench.runs import generations, timed
from jobs.bench.side_by_side import summarize


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


def test_generations_warm_up_on_two_tokens_then_time_the_asked_length_interleaved():
    calls = []

    def runner(name):
        def run(gen_len):
            calls.append((name, gen_len))
            return 3 * gen_len

        return run

    res = generations({"a": runner("a"), "b": runner("b")}, 5, 2)
    assert calls == [("a", 2), ("b", 2), ("a", 5), ("b", 5), ("a", 5), ("b", 5)]
    assert res["a"]["tokens"] == 15 and len(res["a"]["runs"]) == 2 and res["a"]["warm_up"] == 6
    calls.clear()
    generations({"a": runner("a")}, 5, 1, warm_up=False)
    assert calls == [("a", 5)]
