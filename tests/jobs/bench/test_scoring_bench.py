"""`flexbatch bench score` on a tiny model: both lines score every token, and their scores agree."""

import pytest

from jobs.bench.scoring import ScoreConfig, run_score, table_text


def test_the_scoring_bench_runs_and_the_lines_agree(tmp_path):
    report = run_score(ScoreConfig(rows=6, length=16, preset="tiny", batch=4, repeats=1, cache_dir=str(tmp_path)))
    assert [ln["line"] for ln in report["lines"]] == ["flexbatch", "transformers"]
    assert all(ln["max_abs_diff"] < 1e-3 and ln["tokens_per_s"] > 0 for ln in report["lines"]), report["lines"]
    assert "6 rows x 16 tokens" in table_text(report)


def test_scoring_the_last_tokens_only_scores_them_in_every_line(tmp_path):
    """--score-last: every line scores each row's last 3 tokens (transformers keeping those logits only), and the
    scores agree; an int8 line is one more line, compared with the first."""
    report = run_score(ScoreConfig(rows=4, length=16, preset="tiny", batch=4, repeats=1, cache_dir=str(tmp_path),
                                   score_last=3, formats=("uncompressed", "int8")))
    lines = {ln["line"]: ln for ln in report["lines"]}
    assert list(lines) == ["flexbatch", "flexbatch int8", "transformers"]
    assert lines["transformers"]["max_abs_diff"] < 1e-3, report["lines"]
    assert all(ln["seconds"] * ln["tokens_per_s"] == pytest.approx(4 * 3) for ln in report["lines"])
    assert all(ln["tokens_per_cpu_s"] > 0 for ln in report["lines"])


def test_questions_share_all_but_their_last_token_and_score_alike():
    """--choices: rows come as questions of K rows sharing their context (all but the last token); the lines still
    agree on the scored continuation."""
    from jobs.bench.scoring import question_rows

    rows = question_rows(8, 12, 500, choices=4)
    assert all(r[:-1] == rows[i - i % 4][:-1] for i, r in enumerate(rows)) and rows[0][:-1] != rows[4][:-1]
    assert len({tuple(r) for r in rows}) == 8 and {len(r) for r in rows} == {12}


def test_the_scoring_bench_runs_questions(tmp_path):
    report = run_score(ScoreConfig(rows=8, length=40, preset="tiny", batch=8, repeats=1, cache_dir=str(tmp_path),
                                   score_last=1, choices=4))
    assert [ln["line"] for ln in report["lines"]] == ["flexbatch", "transformers"]
    assert report["lines"][1]["max_abs_diff"] < 1e-3, report["lines"]
