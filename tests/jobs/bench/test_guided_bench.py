"""`flexbatch bench guided` on a tiny model: both lines run with the same tokens per row, and every constrained
answer is one of the choices."""

from jobs.bench.guided import GuidedConfig, run_guided, table_text


def test_the_guided_bench_runs_both_lines(tmp_path):
    report = run_guided(GuidedConfig(rows=6, prompt_len=8, gen=5, preset="tiny", dtype="float32", gbs=6, num_gb=1,
                                     repeats=1, cache_dir=str(tmp_path)))
    assert report["answers_are_choices"]
    free, constrained = report["lines"]
    assert free["line"] == "unconstrained" and constrained["line"] == "choice of 4"
    assert all(ln["tokens_per_s"] > 0 and ln["decode_ms_per_row_step"] > 0 for ln in report["lines"])
    assert "6 x 8 gen 5" in table_text(report)
