import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.errors import InputError
from pipeline.input.parquet import inspect_inputs
from pipeline.input.shards import cut_points, make_shards, read_shard
from pipeline.output.folder import MANIFEST_FILE, SUCCESS_FILE, append_manifest, read_manifest
from pipeline.storage import Folder
from tests.pipeline.parquet_files import read_rows, write_parquet


@pytest.mark.parametrize(
    ("bounds", "shard_rows", "cuts"),
    [([0, 8], 4, [0, 4, 8]),  # one big row group is sliced
     ([0, 10], 4, [0, 4, 8, 10]),
     ([0, 3, 6, 9, 12], 4, [0, 6, 12]),  # small row groups stay whole
     ([0, 2, 12, 13], 4, [0, 2, 6, 10, 12, 13]),
     ([0, 3], 4, [0, 3])],
)
def test_cut_points_cover_every_row_once(bounds, shard_rows, cuts):
    assert cut_points(bounds, shard_rows) == cuts


def _file_with_groups(path, groups):
    """A Parquet file whose row groups hold `groups` rows each; prompts are their row numbers."""
    rows = [f"row {i}" for i in range(sum(groups))]
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, pa.schema([("prompt", pa.string())])) as w:
        start = 0
        for n in groups:
            w.write_table(pa.table({"prompt": rows[start : start + n]}))
            start += n
    return path


def test_shards_read_exactly_their_rows(tmp_path):
    a = _file_with_groups(tmp_path / "a.parquet", [3, 3, 10])
    b = _file_with_groups(tmp_path / "b.parquet", [2])
    shards = make_shards(inspect_inputs([a, b], "prompt"), shard_rows=4)
    assert [(s.path.endswith("a.parquet"), s.row_start, s.row_stop) for s in shards] == [
        (True, 0, 6), (True, 6, 10), (True, 10, 14), (True, 14, 16), (False, 0, 2)]
    assert shards[-1].part_name == "b.parquet" and shards[0].part_name == "a.rows-000000000-000000006.parquet"
    read = [row for s in shards[:-1] for row in read_shard(s).column("prompt").to_pylist()]
    assert read == [f"row {i}" for i in range(16)]
    with pytest.raises(InputError, match="--shard-rows 0"):
        make_shards(inspect_inputs([a], "prompt"), shard_rows=0)


COUNTS = {"rows": 1, "error_rows": 0, "prompt_tokens": 4, "completion_tokens": 2}  # a commit record's counts


def test_manifest_ignores_a_torn_line_other_jobs_and_changed_parts(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"12345")
    (tmp_path / "b.parquet").write_bytes(b"123")
    append_manifest(Folder(tmp_path), {"config_hash": "h", "part": "a.parquet", "bytes": 5, **COUNTS})
    append_manifest(Folder(tmp_path), {"config_hash": "other", "part": "b.parquet", "bytes": 3, **COUNTS})
    with open(tmp_path / MANIFEST_FILE, "a") as f:
        f.write('{"config_hash": "h", "part": "b.parq')  # the driver died mid-line
    assert list(read_manifest(Folder(tmp_path), "h")) == ["a.parquet"]
    append_manifest(Folder(tmp_path), {"config_hash": "h", "part": "b.parquet", "bytes": 3, **COUNTS})
    assert sorted(read_manifest(Folder(tmp_path), "h")) == ["a.parquet", "b.parquet"]
    (tmp_path / "a.parquet").write_bytes(b"1234")  # changed after it was committed: redone
    assert list(read_manifest(Folder(tmp_path), "h")) == ["b.parquet"]


def test_a_shard_that_keeps_failing_is_reported_and_the_others_complete(tmp_path, tiny_llama_dir, monkeypatch):
    write_parquet(tmp_path / "in" / "good.parquet", prompt=["a b c", "d e"])
    write_parquet(tmp_path / "in" / "bad.parquet", prompt=["x y"])
    import pipeline.execution.worker

    real = pipeline.execution.worker.read_shard
    tries = []

    def flaky(shard):
        if shard.path.endswith("bad.parquet"):
            tries.append(shard.index)
            raise OSError("disk read error")
        return real(shard)

    monkeypatch.setattr(pipeline.execution.worker, "read_shard", flaky)
    config = RunConfig(input=str(tmp_path / "in"), output=tmp_path / "out", model=tiny_llama_dir, dtype="float32",
                       params=SamplingParams(max_new_tokens=2), use_ray=False, max_shard_retries=1, plan=False)
    summary = run_job(config)
    assert not summary.ok and len(tries) == 2
    assert [f["part"] for f in summary.failed_shards] == ["bad.parquet"]
    assert "disk read error" in summary.failed_shards[0]["error"]
    assert [r["id"] for r in read_rows(tmp_path / "out" / "good.parquet")] == ["good:0", "good:1"]
    assert not (tmp_path / "out" / "bad.parquet").exists()
    success = json.loads((tmp_path / "out" / SUCCESS_FILE).read_text())
    assert not success["ok"] and success["failed_shards"][0]["tries"] == 2 and success["rows"] == 2

    monkeypatch.setattr(pipeline.execution.worker, "read_shard", real)  # the fault is gone: a rerun completes the job
    again = run_job(config)
    assert again.ok and again.skipped_shards == 1 and again.rows == 3
