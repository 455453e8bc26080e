"""`flexbatch bench startup`: every phase of a real `flexbatch run --no-ray` process is marked and reported."""

import json

from click.testing import CliRunner

from jobs.bench.startup import startup_command


def test_bench_startup_marks_every_phase_of_a_real_run(tmp_path):
    out = tmp_path / "startup.json"
    res = CliRunner().invoke(startup_command, ["--repeats", "1", "--max-new-tokens", "2", "--output", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    r = report["rounds"][0]
    assert 0 < r["interpreter_s"] < r["first_shard_s"] < r["whole_process_s"]
    assert r["first_shard_s"] > r["plan_s"] + r["load_s"] + r["warm_up_s"] > 0
    assert r["startup_less_load_s"] == r["first_shard_s"] - r["load_s"]
    assert "avx" in report["cpu_flags"] and "process start to first shard" in res.output
