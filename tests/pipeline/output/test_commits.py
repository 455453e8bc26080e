"""Verified commits: the manifest records each part's size and SHA-256; a resumed job redoes a part that no
longer matches, and `verify_output` checks a finished job (every part, every id exactly once)."""

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.errors import OutputFolderError
from pipeline.output.verify import verify_output
from tests.pipeline.parquet_files import read_rows, write_parquet


def _config(tmp_path, model):
    return RunConfig(input=str(tmp_path / "in"), output=tmp_path / "out", model=model, dtype="float32",
                     use_ray=False, plan=False, pins={"gbs": 2, "num_gb": 1}, shard_rows=2,
                     params=SamplingParams(max_new_tokens=3))


@pytest.fixture
def finished_job(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=[f"The quick brown fox {i}" for i in range(6)])
    config = _config(tmp_path, tiny_llama_dir)
    summary = run_job(config)
    assert summary.ok and summary.shards == 3
    return config, summary


def _flip_a_byte(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_part_corrupted_in_place_is_redone_on_resume(finished_job, tmp_path):
    config, summary = finished_job
    part = summary.parts[1]
    before = read_rows(part)
    manifest = [json.loads(line) for line in (tmp_path / "out" / "_manifest.jsonl").read_text().splitlines()]
    assert all(len(r["sha256"]) == 64 and r["bytes"] > 0 for r in manifest)
    _flip_a_byte(part, len(part.read_bytes()) // 2)  # same size, other content
    problems = verify_output(config.output).problems
    assert len(problems) == 1 and part.name in problems[0] and "SHA-256" in problems[0]

    again = run_job(config)
    assert again.skipped_shards == 2 and again.ok
    assert read_rows(part) == before
    assert verify_output(config.output).ok


@pytest.mark.parametrize("change", [{"rows": None}, {"rows": "2"}, {"completion_tokens": [3]}, {"part": 1}])
def test_a_manifest_line_of_the_wrong_shape_is_redone_on_resume_not_a_traceback(finished_job, tmp_path, change):
    config, summary = finished_job
    manifest = tmp_path / "out" / "_manifest.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    for key, value in change.items():
        if value is None:
            del lines[1][key]
        else:
            lines[1][key] = value
    manifest.write_text("".join(json.dumps(r) + "\n" for r in lines))
    again = run_job(config)
    assert again.ok and again.skipped_shards == 2 and again.rows == 6


def test_verify_accepts_a_finished_job_and_names_a_lost_or_duplicated_row(finished_job, tmp_path):
    config, summary = finished_job
    good = verify_output(config.output)
    assert good.ok and good.rows == 6 and good.shards == 3 and not good.notes
    part = summary.parts[0]
    table = pq.read_table(part)
    ids = table.column("id").to_pylist()
    pq.write_table(table.set_column(0, "id", pa.array([ids[0], ids[0]])), part)
    bad = verify_output(config.output)
    assert any(part.name in p for p in bad.problems)  # the part no longer matches its manifest line
    manifest = tmp_path / "out" / "_manifest.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    for r in lines:  # a manifest rewritten to match: the ids are still checked against the input
        if r["part"] == part.name:
            r.update(bytes=part.stat().st_size, sha256=hashlib.sha256(part.read_bytes()).hexdigest())
    manifest.write_text("".join(json.dumps(r) + "\n" for r in lines))
    problems = verify_output(config.output).problems
    assert any(f"row 1 has id {ids[0]!r}, the input's is {ids[1]!r}" in p for p in problems)
    assert any("appear more than once" in p for p in problems)


def test_verify_refuses_a_folder_that_is_no_jobs_output(tmp_path):
    with pytest.raises(OutputFolderError, match="no readable _job.json"):
        verify_output(tmp_path)


def test_flexbatch_verify_exits_0_on_a_good_job_and_1_naming_a_corrupt_part(finished_job):
    from click.testing import CliRunner

    from jobs import cli

    config, summary = finished_job
    good = CliRunner().invoke(cli.main, ["verify", "--output", str(config.output)])
    assert good.exit_code == 0 and "3 shards, 6 rows: ok" in good.output
    _flip_a_byte(summary.parts[2], 40)
    bad = CliRunner().invoke(cli.main, ["verify", "--output", str(config.output)])
    assert bad.exit_code == 1 and f"problem: shard 2 ({summary.parts[2].name})" in bad.output
    missing = CliRunner().invoke(cli.main, ["verify", "--output", str(config.output / "nothing")])
    assert missing.exit_code == 2 and "flexbatch: error:" in missing.stderr
