"""`flexbatch bench prefix` on a tiny model: both lines run, the tokens are the same with and without sharing, the
shared prefix was computed once per block, and a block holds more rows per GiB with it."""

from jobs.bench.shared_prefix import PrefixConfig, run_prefix, table_text


def test_the_prefix_bench_runs_and_compares(tmp_path):
    report = run_prefix(PrefixConfig(workloads=("W5",), rows=8, preset="tiny1k", dtype="float32", gbs=8, num_gb=1,
                                     repeats=1, cache_dir=str(tmp_path)))
    (w5,) = report["workloads"]
    assert w5["same_tokens"] and w5["counts"]["shared_tokens"] >= 512, w5
    on, off = w5["lines"]
    assert on["rows_per_gib"] > 4 * off["rows_per_gib"], (on, off)
    assert "W5 8 x (512 shared + 64) gen 8" in table_text(report)
