"""`flexbatch bench score` on a tiny model: both lines score every token, and their scores agree."""

from jobs.bench.scoring import ScoreConfig, run_score, table_text


def test_the_scoring_bench_runs_and_the_lines_agree(tmp_path):
    report = run_score(ScoreConfig(rows=6, length=16, preset="tiny", batch=4, repeats=1, cache_dir=str(tmp_path)))
    assert [ln["line"] for ln in report["lines"]] == ["flexbatch", "transformers"]
    assert all(ln["max_abs_diff"] < 1e-3 and ln["tokens_per_s"] > 0 for ln in report["lines"]), report["lines"]
    assert "6 rows x 16 tokens" in table_text(report)
