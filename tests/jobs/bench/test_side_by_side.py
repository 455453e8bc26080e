"""jobs/bench/side_by_side.py, the one runner of the benchmarks' lines: warm-ups first and untimed, then the lines
interleaved round by round in their order, and per figure the median of the rounds (the largest for a peak)."""

import pytest

from jobs.bench.side_by_side import side_by_side, summarize


def test_warm_ups_come_first_then_every_round_runs_each_line_in_order():
    calls = []

    def line(name, seconds):
        figures = iter(seconds)
        return lambda: calls.append(name) or {"seconds": next(figures)}

    res = side_by_side({"a": line("a", [3.0, 1.0, 2.0]), "b": line("b", [9.0, 5.0, 4.0]), "c": line("c", [1, 1, 1])},
                       3, warm_up={"c": lambda: calls.append("warm c") or "warm", "a": lambda: calls.append("warm a")})
    assert calls == ["warm a", "warm c", "a", "b", "c", "a", "b", "c", "a", "b", "c"]
    assert [r["seconds"] for r in res["a"]["runs"]] == [3.0, 1.0, 2.0]  # the warm-up is not a round
    assert res["a"]["seconds"] == 2.0 and res["b"]["seconds"] == 5.0 and res["c"]["seconds"] == 1
    assert res["c"]["warm_up"] == "warm" and res["a"]["warm_up"] is None and res["b"]["warm_up"] is None


def test_a_warm_up_of_no_line_is_refused():
    with pytest.raises(AssertionError, match="warm-ups"):
        side_by_side({"a": dict}, 1, warm_up={"b": dict})


def test_each_figure_is_the_median_of_the_runs_that_give_it_and_a_peak_the_largest():
    runs = [{"seconds": 4.0, "peak_rss_bytes": 10, "cpu_s": None, "tokens": 8, "never": None, "command": ["x"]},
            {"seconds": 1.0, "peak_rss_bytes": 30, "cpu_s": 2.0, "tokens": 8, "never": None, "command": ["y"]},
            {"seconds": 2.0, "peak_rss_bytes": 20, "cpu_s": 3.0, "tokens": 8, "never": None},
            {"seconds": 5.0, "peak_rss_bytes": 5, "tokens": 8, "never": None, "ok": True}]
    got = summarize(runs)
    assert got["seconds"] == 3.0 and got["peak_rss_bytes"] == 30 and got["cpu_s"] == 2.5
    assert got["tokens"] == 8 and isinstance(got["tokens"], int)  # the same in every run: as given
    assert got["never"] is None and "command" not in got and "ok" not in got  # only numbers are figures
    assert got["runs"] is runs
