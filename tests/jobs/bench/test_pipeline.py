import pyarrow.parquet as pq

from engine.policy import Policy
from jobs.bench.pipeline import PipelineBenchConfig, report, table_text, write_batch_file, write_rows
from jobs.bench.side_by_side import summarize


def _run(steady, e2e, same=1.0):
    return {"steady_s": steady, "end_to_end_s": e2e, "tokens": 100, "same_rows": same}


def test_report_quotes_medians_as_overheads_against_the_bare_engine():
    runs = {"engine": [_run(10.0, 11.0), _run(12.0, 13.0)],
            "pipeline 1x2": [_run(10.4, 20.0), _run(12.4, 22.0, 0.9)],
            "pipeline 2x1": [_run(5.5, 15.0), _run(6.5, 16.0)],
            "openai 1x2": [_run(10.6, 20.0), _run(12.8, 22.0)]}
    rep = report(PipelineBenchConfig(), Policy(gbs=8, num_gb=1), {k: summarize(v) for k, v in runs.items()})
    lines = {line["id"]: line for line in rep["lines"]}
    assert abs(lines["overhead-steady"]["overhead"] - (11.4 / 11.0 - 1)) < 1e-9
    assert lines["overhead-steady"]["met"] is True  # 3.6 % <= 5 %
    assert abs(lines["overhead-e2e"]["overhead"] - (21.0 / 12.0 - 1)) < 1e-9
    assert abs(lines["workers"]["overhead"] - (6.0 / 11.4 - 1)) < 1e-9
    assert abs(lines["batch-format"]["overhead"] - (11.7 / 11.4 - 1)) < 1e-9
    assert rep["same_rows_as_engine"] == {"pipeline 1x2": 0.9, "pipeline 2x1": 1.0, "openai 1x2": 1.0}
    assert "<=5% ok" in table_text(rep)


def test_bench_rows_are_distinct_prompts_with_ids(tmp_path):
    table = pq.read_table(write_rows(tmp_path, 40))
    assert table.num_rows == 40 and len(set(table.column("prompt").to_pylist())) == 40
    assert table.column("id").to_pylist()[:2] == ["r0", "r1"]
    lines = write_batch_file(tmp_path, tmp_path / "rows.parquet").read_text().splitlines()
    assert len(lines) == 40 and '"custom_id": "r0"' in lines[0] and '"url": "/v1/completions"' in lines[0]
