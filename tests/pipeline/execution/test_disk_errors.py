"""Faults of the output's filesystem and of the input's types are one line, before any model load where they
are knowable then; a full disk fails a shard once, naming the path and the free space. The full and read-only
filesystems are small tmpfs mounts (root only; skipped elsewhere)."""

import json
import os
import subprocess

import pyarrow as pa
import pytest
from click.testing import CliRunner

from jobs import cli
from pipeline.errors import OutputWriteError
from pipeline.output.verify import verify_output
from pipeline.storage import Folder
from tests.jobs.test_cli import assert_user_error
from tests.pipeline.parquet_files import write_parquet


def _run(tmp_path, model, output, *extra):
    return CliRunner().invoke(cli.main, ["run", "--no-ray", "--model", str(model), "--input", str(tmp_path / "in"),
                                         "--output", str(output), "--dtype", "float32", "--no-plan", "--gbs", "2",
                                         "--max-new-tokens", "2", *map(str, extra)])


@pytest.fixture
def tmpfs(tmp_path):
    """`tmpfs(size, *options)`: a small tmpfs mounted in tmp_path (unmounted at the end)."""
    mounted = []

    def mount(size: str, *options: str):
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        opts = ",".join((f"size={size}", *options))
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


def test_an_output_under_a_file_is_one_line_before_the_model_loads(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["x"])
    (tmp_path / "notes.txt").write_text("mine")
    assert_user_error(_run(tmp_path, tiny_llama_dir, tmp_path / "notes.txt" / "out"), "cannot write there",
                      "Not a directory")


def test_a_read_only_output_filesystem_is_one_line_before_the_model_loads(tmp_path, tiny_llama_dir, tmpfs,
                                                                          no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["x"])
    ro = tmpfs("64k", "ro")
    assert_user_error(_run(tmp_path, tiny_llama_dir, ro / "out"), "cannot write there", "Read-only file system")


def test_a_prompt_column_that_is_not_text_is_refused_from_the_footer(tmp_path, tiny_llama_dir, no_model_load):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=pa.array([1, 2], pa.int64()))
    assert_user_error(_run(tmp_path, tiny_llama_dir, tmp_path / "out"), "prompt column 'prompt' holds int64",
                      "cast it to string")


def test_a_full_output_disk_fails_a_shard_once_naming_the_path_and_free_space(tmp_path, tiny_llama_dir, tmpfs):
    prompts = [os.urandom(600).hex() for _ in range(8)]  # incompressible: each part holds about 2.4 KB of it
    write_parquet(tmp_path / "in" / "a.parquet", prompt=prompts)
    sizing = _run(tmp_path, tiny_llama_dir, tmp_path / "sizing", "--shard-rows", 2, "--truncate", "left")
    assert sizing.exit_code == 0, sizing.output
    part = max(p.stat().st_size for p in (tmp_path / "sizing").glob("*.parquet"))
    disk = tmpfs("1m")
    job_files = sum((tmp_path / "sizing" / n).stat().st_size for n in ("_job.json", "_SUCCESS", "_manifest.jsonl"))
    room = 2 * job_files + part + part // 2 + 8192  # the job files, one part and half of the next
    (disk / "filler").write_bytes(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - room))
    result = _run(tmp_path, tiny_llama_dir, disk / "out", "--shard-rows", 2, "--truncate", "left")
    assert result.exit_code == 1, result.output
    summary = json.loads((disk / "out" / "_SUCCESS").read_text())
    tried = [f for f in summary["failed_shards"] if f["tries"]]
    assert len(tried) == 1 and tried[0]["tries"] == 1 and "No space left on device" in tried[0]["error"]
    assert str(disk / "out") in tried[0]["error"] and "MiB free of" in tried[0]["error"]
    assert all(f["error"].startswith("not started: ") for f in summary["failed_shards"] if not f["tries"])
    assert summary["new_shards"] + len(summary["failed_shards"]) == 4
    (disk / "filler").unlink()  # space freed: the rerun does only what is missing
    again = _run(tmp_path, tiny_llama_dir, disk / "out", "--shard-rows", 2, "--truncate", "left")
    assert again.exit_code == 0, again.output
    assert verify_output(disk / "out").ok


def test_a_full_disk_during_the_manifest_append_is_a_write_error_naming_it(tmpfs):
    disk = tmpfs("64k")
    (disk / "filler").write_bytes(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize))
    with pytest.raises(OutputWriteError, match=r"cannot write .*_manifest.jsonl: No space left on device \(0.0 MiB "):
        Folder(disk).append_line("_manifest.jsonl", json.dumps({"part": "a.parquet"}) + "\n")
