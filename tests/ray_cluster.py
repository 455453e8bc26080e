"""A Ray head on 127.0.0.1 with token authentication and its job server, started as `ray start --head` in a
process session of its own (so it outlives any one driver), and stopped by stopping that session's processes.
The suite starts one (`shared_ray` in tests/conftest.py) for the tests that only need a cluster; `flexbatch
submit`'s end-to-end test sends its job to it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.execution.ray_watchdog import stop_processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class RayHead:
    address: str  # the GCS, for --address / ray.init
    url: str  # the job server (dashboard), for `flexbatch submit --address`
    env: dict  # the environment of a process that joins it: RAY_AUTH_MODE=token, this Python's bin first
    token: str
    temp: Path


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies, which are gone but not yet reaped, left out)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if os.getsid(int(entry.name)) == sid and state != "Z":
                pids.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return pids


def job_driver_pids(temp: Path) -> list[int]:
    """Processes working in a submitted job's working_dir copy under `temp`: job drivers, which run in sessions
    of their own (after a failed test they could outlive the head by a minute)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(temp):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _wait_for_job_server(url: str, token: str, timeout_s: float = 60.0) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/api/jobs/", headers={"Authorization": f"Bearer {token}"}, timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the Ray job server at {url} did not come up in {timeout_s} s")


def start_head(num_cpus: int, token_path: Path) -> tuple[RayHead, int]:
    """A head with `num_cpus` CPUs on free ports and its own temp dir, authenticating with the token in
    `token_path` (which must exist: `ray start` turns token auth off when there is none). Returns the head and
    its session id (for `stop_head`)."""
    temp = Path(tempfile.mkdtemp(prefix="fb-ray-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    token = token_path.read_text().strip()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path), OMP_NUM_THREADS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")  # the jobs' `python`
    port, dashboard_port = free_port(), free_port()
    start = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
         f"--port={port}", f"--dashboard-port={dashboard_port}", "--dashboard-host=127.0.0.1",
         f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
         f"--num-cpus={num_cpus}", "--object-store-memory=200000000", f"--temp-dir={temp / 'ray'}",
         "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    head = RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", env, token, temp)
    try:
        out, _ = start.communicate(timeout=90)
        assert start.returncode == 0, out
        _wait_for_job_server(head.url, token)
    except BaseException:
        stop_head(start.pid, head)
        raise
    return head, start.pid


def stop_head(sid: int, head: RayHead, grace_s: float = 5.0) -> None:
    """SIGTERM the head's processes (its session) and any job driver left, then SIGKILL what is left after
    `grace_s`. Not `ray stop`: that stops every Ray process of the machine, other test runs' too."""
    def left():
        return session_pids(sid) + job_driver_pids(head.temp)

    try:
        stop_processes(left, grace_s)
        assert not left(), f"Ray processes left: {left()}"
    finally:
        shutil.rmtree(head.temp, ignore_errors=True)
