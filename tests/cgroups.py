"""Memory cgroups for tests (cgroup v1, as root): made fresh, a command run inside, removed. Tests that need
one skip with the reason where the hierarchy is missing or not writable."""

import os
import subprocess
import time
from pathlib import Path

import pytest

CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def memory_cgroup(name: str, limit_bytes: int) -> Path:
    """A fresh cgroup v1 memory group (root only); the caller removes it. Skips where that is not possible."""
    if not (CGROUP_V1 / "cgroup.procs").exists() or not os.access(CGROUP_V1, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory (root)")
    group = CGROUP_V1 / f"{name}-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup at {group}: {e}")
    return group


def run_in_cgroup(group: Path, args: list[str], **kw) -> subprocess.CompletedProcess:
    script = f'echo $$ > {group}/cgroup.procs && exec "$@"'
    return subprocess.run(["sh", "-c", script, "sh", *args], capture_output=True, text=True, **kw)


def remove_cgroup(group: Path, timeout: float = 30.0) -> None:
    """Remove the group once the processes started in it have ended (a group with members cannot go)."""
    deadline = time.monotonic() + timeout
    while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
        time.sleep(0.2)
    group.rmdir()
