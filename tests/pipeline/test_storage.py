"""Inputs and outputs as URIs of pyarrow filesystems. `file://` takes the object-store path (parts written once
under their final key, the manifest rewritten whole) on the local disk."""

import json

import pytest

from engine.request import SamplingParams
from pipeline import RunConfig, run_job
from pipeline.errors import InputError, OutputFolderError
from pipeline.input.parquet import resolve_inputs
from pipeline.output.folder import MANIFEST_FILE, SUCCESS_FILE
from pipeline.storage import Folder
from tests.pipeline.parquet_files import read_rows, write_parquet


def test_a_job_reads_and_writes_uris_and_resumes(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["one two", "three", "four five six"])
    write_parquet(tmp_path / "in" / "b.parquet", prompt=["seven"], id=["x"])
    (tmp_path / "in" / "_hidden.parquet").write_bytes(b"not read")
    config = RunConfig(input=f"file://{tmp_path}/in", output=f"file://{tmp_path}/out/", model=tiny_llama_dir,
                       dtype="float32", params=SamplingParams(max_new_tokens=3), use_ray=False, shard_rows=2,
                       plan=False)
    summary = run_job(config)
    out = tmp_path / "out"
    assert summary.ok and summary.shards == 3 and summary.parts[0] == f"file://{tmp_path}/out/a.rows-000000000-000000002.parquet"
    rows = [r for p in sorted(out.glob("*.parquet")) for r in read_rows(p)]
    assert [r["id"] for r in rows] == ["a:0", "a:1", "a:2", "x"]
    assert len((out / MANIFEST_FILE).read_text().splitlines()) == 3
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert json.loads((out / SUCCESS_FILE).read_text())["rows"] == 4

    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    again = run_job(config)
    assert again.skipped_shards == 3 and {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet")} == before
    with pytest.raises(OutputFolderError, match=r"\['params'\]"):
        run_job(RunConfig(**{**config.__dict__, "params": SamplingParams(max_new_tokens=4)}))


def test_uri_inputs_are_listed_and_globs_refused(tmp_path):
    write_parquet(tmp_path / "b.parquet", prompt=["x"])
    write_parquet(tmp_path / "a.parquet", prompt=["y"])
    assert resolve_inputs(f"file://{tmp_path}") == [f"file://{tmp_path}/a.parquet", f"file://{tmp_path}/b.parquet"]
    assert resolve_inputs(f"file://{tmp_path}/a.parquet") == [f"file://{tmp_path}/a.parquet"]
    with pytest.raises(InputError, match="globs work on local paths only"):
        resolve_inputs(f"file://{tmp_path}/*.parquet")
    with pytest.raises(InputError, match="does not exist"):
        resolve_inputs(f"file://{tmp_path}/missing")


def test_object_store_appends_rewrite_the_manifest_whole(tmp_path):
    folder = Folder(f"file://{tmp_path}")
    folder.append_line(MANIFEST_FILE, '{"a": 1}\n')
    folder.write_bytes("x", (tmp_path / MANIFEST_FILE).read_bytes() + b'{"torn"')
    (tmp_path / MANIFEST_FILE).write_bytes((tmp_path / "x").read_bytes())
    folder.append_line(MANIFEST_FILE, '{"b": 2}\n')
    assert (tmp_path / MANIFEST_FILE).read_text().splitlines() == ['{"a": 1}', '{"torn"', '{"b": 2}']
