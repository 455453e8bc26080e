"""One writer per output folder: a flock for local folders, a lease object for object stores (tested through
`file://` URIs, which take the object-store path)."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from jobs import cli
from pipeline.output import lock as output_lock
from pipeline.output.lock import LEASE_FILE, LOCK_FILE, FolderLock, Lease, OutputLockedError, lock_output
from tests.pipeline.parquet_files import read_rows, write_parquet


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run_args(tmp_path, model, *extra):
    return ["run", "--no-ray", "--model", str(model), "--input", str(tmp_path / "in"), "--output",
            str(tmp_path / "out"), "--dtype", "float32", "--no-plan", "--gbs", "2", "--shard-rows", "2",
            "--max-new-tokens", "4", *extra]


def test_a_second_run_on_a_locked_folder_exits_2_naming_the_holder(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=["The quick brown fox", "hello", "Q: A:"])
    held = lock_output(tmp_path / "out")
    try:
        for extra in ((), ("--overwrite",)):
            result = CliRunner().invoke(cli.main, _run_args(tmp_path, tiny_llama_dir, *extra))
            assert result.exit_code == 2, result.output
            assert f"being written by pid {os.getpid()}" in result.stderr and socket.gethostname() in result.stderr
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_FILE]
    finally:
        held.release()
    result = CliRunner().invoke(cli.main, _run_args(tmp_path, tiny_llama_dir))
    assert result.exit_code == 0, result.output
    assert LOCK_FILE not in {p.name for p in (tmp_path / "out").iterdir()}  # released at the end


def test_two_identical_runs_at_once_write_every_shard_once(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in" / "a.parquet", prompt=[f"The quick brown fox {i}" for i in range(8)])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "jobs.cli", *_run_args(tmp_path, tiny_llama_dir)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes in ([0, 0], [0, 2]), outs  # the later run either waits for nothing (all committed) or is refused
    if codes == [0, 2]:
        # the holder named by pid, or, in the instant before it has written its name, as "another run"
        assert any("is being written by " in err for _, err in outs), outs
    manifest = [json.loads(line) for line in (tmp_path / "out" / "_manifest.jsonl").read_text().splitlines()]
    assert sorted(r["part"] for r in manifest) == sorted({r["part"] for r in manifest}) and len(manifest) == 4
    ids = [row["id"] for part in sorted((tmp_path / "out").glob("*.parquet")) for row in read_rows(part)]
    assert sorted(ids) == sorted(f"a:{i}" for i in range(8))


def test_a_lock_file_left_by_a_killed_run_is_taken_over_with_a_log_line(tmp_path, caplog):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 123, "host": "h", "owner": "u", "started": "then"}))
    with caplog.at_level("WARNING"):
        lock = lock_output(tmp_path)
    assert "pid 123 of u on h" in caplog.text and "taking it over" in caplog.text
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    with pytest.raises(OutputLockedError, match=f"pid {os.getpid()}"):
        FolderLock(tmp_path)
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


@pytest.fixture
def quick_lease(monkeypatch):
    monkeypatch.setattr(output_lock, "LEASE_SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(output_lock, "LEASE_HEARTBEAT_SECONDS", 0.05)


def _lease(folder, **holder):
    """Write a lease as another run would: one whole write that readers see before or after."""
    record = {"owner": "u", "host": "elsewhere", "pid": 1, "started": "then", "heartbeat": time.time(),
              "token": "t", **holder}
    tmp = folder / (LEASE_FILE + ".other")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / LEASE_FILE)


def _read_lease(folder) -> dict:
    """The lease as a reader sees it once a heartbeat's write is complete (a file:// write is not atomic)."""
    for _ in range(100):
        try:
            return json.loads((folder / LEASE_FILE).read_text())
        except ValueError:
            time.sleep(0.01)
    raise AssertionError("the lease never read as a whole record")


def test_a_live_lease_refuses_and_a_stale_one_is_taken_over(tmp_path, quick_lease, caplog):
    uri = f"file://{tmp_path}"
    _lease(tmp_path)
    with pytest.raises(OutputLockedError, match="being written by pid 1 of u on elsewhere"):
        lock_output(uri)
    for stale in ({"heartbeat": time.time() - 3600}, {"host": socket.gethostname(), "pid": _dead_pid()}):
        _lease(tmp_path, **stale)
        with caplog.at_level("WARNING"):
            lease = lock_output(uri)
        assert isinstance(lease, Lease) and "taking over the stale lease" in caplog.text
        assert json.loads((tmp_path / LEASE_FILE).read_text())["pid"] == os.getpid()
        lease.release()
        assert not (tmp_path / LEASE_FILE).exists()
        caplog.clear()


def test_a_lease_taken_over_while_running_stops_further_commits(tmp_path, quick_lease):
    lease = lock_output(f"file://{tmp_path}")
    time.sleep(0.2)
    assert _read_lease(tmp_path)["heartbeat"] > time.time() - 1  # renewed
    deadline = time.time() + 5
    while lease.lost is None and time.time() < deadline:
        # a heartbeat that confirmed just before the takeover may write over it once; the taker writes again
        _lease(tmp_path, token="someone else")
        time.sleep(0.05)
    with pytest.raises(OutputLockedError, match="pid 1 of u on elsewhere"):
        lease.check()
    lease.release()
    assert _read_lease(tmp_path)["token"] == "someone else"  # not ours to remove
