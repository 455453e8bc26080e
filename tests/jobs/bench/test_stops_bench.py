"""`flexbatch bench stops`: both checks run over every token of every row, side by side."""

import json

from click.testing import CliRunner

from jobs.bench.stop_strings import stops_command


def test_bench_stops_reports_both_checks_per_length(tmp_path):
    out = tmp_path / "stops.json"
    res = CliRunner().invoke(stops_command, ["--length", "8", "--length", "32", "--rows", "1", "--repeats", "1",
                                             "--output", str(out)])
    assert res.exit_code == 0, res.output
    lines = json.loads(out.read_text())["lines"]
    assert [ln["tokens"] for ln in lines] == [8, 32]
    assert all(ln["full_us_per_token"] > 0 and ln["incremental_us_per_token"] > 0 for ln in lines)
    assert "speed-up" in res.output
