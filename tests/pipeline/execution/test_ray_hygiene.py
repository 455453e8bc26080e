"""The local Ray flexbatch starts: its token file is private, every port of it (its unauthenticated metrics
endpoints included) listens on 127.0.0.1 only, and it is stopped when its driver is SIGKILLed."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pipeline.execution.ray_runtime import secure_token_file

DRIVER = """
import json, os, time
import ray
from pipeline.execution.ray_runtime import connect
connect(None)
print(json.dumps({"worker": ray.get(ray.remote(lambda: os.getpid()).remote())}), flush=True)
time.sleep(600)
"""


def _stat(pid, field):
    """A number from /proc/PID/stat, counted from the state (field 0: 1 is the parent, 19 the start time)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[field])
    except (OSError, ValueError):
        return None


def _start_time(pid):
    return _stat(pid, 19)


def _tree(root):
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (parent := _stat(name, 1)) is not None:
            children.setdefault(parent, []).append(int(name))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if (t := _start_time(pid)) is not None:
            out[pid] = t
            todo += children.get(pid, [])
    return out


def _listening_beyond_loopback(pids):
    """TCP ports that `pids` listen on at an address other than 127.0.0.1 (IPv4, or IPv4-mapped IPv6)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, port = fields[1].split(":")
                if fields[3] == "0A" and fields[9] in inodes and not address.endswith("0100007F"):
                    ports.append((address, int(port, 16)))
    return ports


@pytest.mark.slow
def test_a_local_ray_is_private_and_stopped_when_its_driver_is_killed(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 180
    while not any(line.startswith('{"worker"') for line in lines) and time.monotonic() < deadline:
        assert proc.poll() is None, "".join(lines)
        time.sleep(0.2)
    assert any(line.startswith('{"worker"') for line in lines), "".join(lines)
    time.sleep(3)  # the agents start after the first task
    token = home / ".ray" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    ray_processes = _tree(proc.pid)
    worker = json.loads(next(line for line in lines if line.startswith('{"worker"')))["worker"]
    assert worker in ray_processes and len(ray_processes) >= 4  # driver, GCS, raylet, agents, a worker
    assert _listening_beyond_loopback(ray_processes) == []

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [p for p, t in ray_processes.items() if _start_time(p) == t]
        if not left:
            break
        time.sleep(0.5)
    assert not left, [open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:80] for p in left if _start_time(p)]


def test_a_token_file_readable_by_others_is_made_private_with_a_warning(tmp_path, monkeypatch, caplog):
    token = tmp_path / "token"
    token.write_text("x" * 64)
    token.chmod(0o644)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with caplog.at_level("WARNING"):
        assert secure_token_file(create=False) == token
    assert token.stat().st_mode & 0o777 == 0o600 and "was readable by others (mode 0644)" in caplog.text
    made = tmp_path / "dir" / "made"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(made))
    assert secure_token_file(create=True) == made and made.stat().st_mode & 0o777 == 0o600
