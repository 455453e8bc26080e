"""`flexbatch verify` checks the folder against `_job.json` and `_job.json` against the input: a stray part, a
damaged `_job.json` or shards that no longer cover the input's rows are problems (exit 1), never "ok"."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.input.shards import Shard
from pipeline.output.verify import input_rows, layout_problems, verify_output
from pipeline.storage import file_identity
from tests.pipeline.parquet_files import write_parquet

ROWS, SHARD_ROWS = 8, 2


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_llama_dir):
    """A finished job of 8 rows in 4 shards; each test damages its own copy of the output."""
    base = tmp_path_factory.mktemp("verify")
    write_parquet(base / "in" / "a.parquet", prompt=[f"The quick brown fox {i}" for i in range(ROWS)])
    config = RunConfig(input=str(base / "in"), output=base / "out", model=tiny_llama_dir, dtype="float32",
                       use_ray=False, plan=False, pins={"gbs": 2, "num_gb": 1}, shard_rows=SHARD_ROWS,
                       params=SamplingParams(max_new_tokens=1))
    assert run_job(config).ok
    return config


@pytest.fixture
def job(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished.output, out)
    return replace(finished, output=out)


def _record(out: Path) -> dict:
    return json.loads((out / "_job.json").read_text())


def _write_record(out: Path, record: dict) -> None:
    (out / "_job.json").write_text(json.dumps(record))


def _verify_cli(out: Path):
    from jobs import cli

    return CliRunner().invoke(cli.main, ["verify", "--output", str(out)])


def test_the_copy_of_a_good_job_is_ok(job):
    result = _verify_cli(job.output)
    assert result.exit_code == 0 and f"4 shards, {ROWS} rows: ok" in result.output


def test_a_copy_of_a_part_or_a_foreign_file_is_a_problem(job):
    out = job.output
    first = _record(out)["shards"][0]["part_name"]
    shutil.copy(out / first, out / "a copy.parquet")
    (out / "notes.txt").write_text("mine")
    (out / ".hidden").write_text("readers skip it")
    (out / "_meta").write_text("readers skip it")
    problems = verify_output(out).problems
    assert len(problems) == 2
    assert "a copy.parquet is a file that no shard" in problems[0] and "notes.txt" in problems[1]
    result = _verify_cli(out)
    assert result.exit_code == 1 and "problem: a copy.parquet" in result.output


@pytest.mark.parametrize("damage", ["not a job record", "no shards", "edited config", "no input files"])
def test_a_damaged_job_record_is_a_problem_that_names_the_fix(job, damage):
    record = _record(job.output)
    if damage == "not a job record":
        record = {"x": 1}
    elif damage == "no shards":
        record["shards"] = []
    elif damage == "edited config":
        record["config"]["input_files"] = []
    else:
        record["config"]["input_files"] = []
        _rehash(job.output, record)
    _write_record(job.output, record)
    result = _verify_cli(job.output)
    assert result.exit_code == 1 and "problem: _job.json" in result.output
    assert "write the output again" in result.output and ": ok" not in result.output


def test_a_dropped_last_shard_is_found_from_the_footer_and_a_rerun_completes_it(job):
    out = job.output
    record = _record(out)
    last = record["shards"].pop()
    _write_record(out, record)
    (out / last["part_name"]).unlink()
    manifest = out / "_manifest.jsonl"
    manifest.write_text("".join(line + "\n" for line in manifest.read_text().splitlines()
                                if json.loads(line)["part"] != last["part_name"]))
    result = _verify_cli(out)
    assert result.exit_code == 1
    assert f"cover rows 0-{ROWS - SHARD_ROWS} and the file has {ROWS} rows" in result.output
    assert "rerun the same command" in result.output
    again = run_job(job)
    assert again.skipped_shards == 3 and verify_output(out).ok


def test_a_changed_input_is_a_note_and_its_parts_are_still_counted(job, tmp_path):
    """The input rewritten after the run: its row count and ids are unknown, so the parts are checked for count
    and uniqueness only, and the report says so."""
    record = _record(job.output)
    copy = tmp_path / "a.parquet"
    shutil.copy(record["config"]["input_files"][0]["path"], copy)
    record["config"]["input_files"] = [file_identity(copy)]
    for shard in record["shards"]:
        shard["path"] = str(copy)
    _rehash(job.output, record)
    assert verify_output(job.output).ok and not verify_output(job.output).notes
    write_parquet(copy, prompt=["other"] * (ROWS + 5))
    report = verify_output(job.output)
    assert report.ok and report.rows == ROWS and "changed or are gone" in report.notes[0]


def _rehash(out: Path, record: dict) -> None:
    """Write an edited `_job.json` with its hash recomputed, and its manifest lines moved to that hash."""
    from pipeline.output.folder import config_hash

    old, record["config_hash"] = record["config_hash"], config_hash(record["config"])
    _write_record(out, record)
    manifest = out / "_manifest.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    manifest.write_text("".join(json.dumps({**r, "config_hash": record["config_hash"]} if r["config_hash"] == old
                                           else r) + "\n" for r in lines))


def _shard(index, start, stop, path="/in/a.parquet", name=None):
    return Shard(index, path, "a", start, stop, name or f"a.rows-{start:09d}-{stop:09d}.parquet")


def test_layout_names_gaps_overlaps_foreign_paths_and_misordered_names():
    inputs = {"/in/a.parquet": 10, "/in/b.parquet": None}
    good = [_shard(0, 0, 5), _shard(1, 5, 10), _shard(2, 0, 3, "/in/b.parquet", "b.parquet")]
    assert layout_problems(good, inputs) == ([], [])
    gap = [_shard(0, 0, 4), _shard(1, 5, 10), good[2]]
    assert "rows 4-5 of /in/a.parquet are in no part" in layout_problems(gap, inputs)[0][0]
    overlap = [_shard(0, 0, 6), _shard(1, 5, 10), good[2]]
    assert "rows 5-6 of /in/a.parquet are in two parts" in layout_problems(overlap, inputs)[0][0]
    foreign = good + [_shard(3, 0, 1, "/in/c.parquet", "c.parquet")]
    assert "not among the job's input files" in layout_problems(foreign, inputs)[0][0]
    missing = layout_problems(good[:2], inputs)[0]
    assert missing == [missing[0]] and "/in/b.parquet is in no shard" in missing[0]
    misnamed = [_shard(0, 0, 10, name="z.parquet"), good[2]]
    problems, notes = layout_problems(misnamed, inputs)
    assert not problems and "do not sort in input order" in notes[0]


def test_row_counts_come_from_the_files_while_they_are_unchanged(tmp_path):
    table = write_parquet(tmp_path / "a.parquet", prompt=["x"] * 7)
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"custom_id": "1"}\n\n{"custom_id": "2"}\nnot json\n')
    known = [file_identity(table)]
    assert input_rows(known, jsonl=False) == {str(table): 7}
    assert input_rows([file_identity(batch)], jsonl=True) == {str(batch): 3}
    write_parquet(table, prompt=["x"] * 9)  # rewritten: another size
    assert input_rows(known, jsonl=False) == {str(table): None}
