"""How much CPU memory this process may still take: the smaller of the machine's MemAvailable and its memory
cgroup's limit less the cgroup's working set (cgroup v1 or v2, the tightest ancestor limit). The kernel
kills a process that passes its cgroup's limit however much memory the machine has free, so a plan that
reads /proc/meminfo alone can be killed. The working set is the cgroup's usage less its inactive page cache
(which the kernel reclaims before it kills); it already holds this process's own memory (the interpreter,
torch, the tokenizer: its baseline, reported as `process_bytes`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages)


@dataclass(frozen=True)
class MemoryRoom:
    available_bytes: float | None  # what this process may still take; None when nothing could be read
    mem_available_bytes: float | None  # /proc/meminfo MemAvailable
    cgroup_limit_bytes: float | None  # None without a memory limit
    cgroup_used_bytes: float | None  # the cgroup's working set (usage less inactive page cache)
    process_bytes: float | None  # this process's resident memory now (its measured baseline)

    @property
    def limit_binds(self) -> bool:
        """Whether the memory cgroup's room, not MemAvailable, is what this process may take: then the page cache
        of its disk-tier scratch files (engine/memory/offload.py) is charged to the group, which kills at its limit
        rather than writing the pages back (cgroup v1), so that scratch is memory the plan must count."""
        return (self.cgroup_limit_bytes is not None and self.available_bytes is not None
                and self.available_bytes < (self.mem_available_bytes or float("inf")))

    def describe(self) -> str:
        parts = []
        if self.mem_available_bytes is not None:
            parts.append(f"MemAvailable {_mb(self.mem_available_bytes)}")
        if self.cgroup_limit_bytes is not None:
            parts.append(f"memory cgroup limit {_mb(self.cgroup_limit_bytes)} less its use "
                         f"{_mb(self.cgroup_used_bytes or 0)}")
        if self.process_bytes is not None:
            parts.append(f"this process already holds {_mb(self.process_bytes)}")
        return "; ".join(parts)


def _mb(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def memory_room(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> MemoryRoom:
    mem_available = _meminfo(proc / "meminfo", "MemAvailable")
    limit, used = cgroup_memory(proc / "self" / "cgroup", cgroup_root)
    rss = _meminfo(proc / "self" / "status", "VmRSS")
    candidates = [x for x in (mem_available, None if limit is None else max(0.0, limit - (used or 0.0)))
                  if x is not None]
    return MemoryRoom(min(candidates) if candidates else None, mem_available, limit, used, rss)


def _meminfo(path: Path, key: str) -> float | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_memory(self_cgroup: Path, root: Path) -> tuple[float | None, float | None]:
    """(limit, working set) of this process's memory cgroup, v1 or v2; (None, None) without a limit."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _v1(_folder(root / "memory", path))
    for line in lines:
        if line.startswith("0::"):
            return _v2(_folder(root, line[3:]), root)
    return None, None


def _folder(mount: Path, path: str) -> Path:
    """The cgroup's folder under its mount. Inside a container the mount is often the container's own cgroup
    while /proc/self/cgroup names the host's path: then the deepest existing suffix is it (else the mount)."""
    parts = [p for p in path.strip("/").split("/") if p]
    for i in range(len(parts)):
        candidate = mount.joinpath(*parts[i:])
        if candidate.is_dir():
            return candidate
    return mount


def _read_int(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.lstrip("-").isdigit() else float(text)


def _stat(path: Path) -> dict[str, float]:
    try:
        return {k: float(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.strip())}
    except (OSError, ValueError):
        return {}


def _v1(folder: Path) -> tuple[float | None, float | None]:
    stat = _stat(folder / "memory.stat")
    limit = stat.get("hierarchical_memory_limit", _read_int(folder / "memory.limit_in_bytes"))
    if limit is None or limit >= _NO_LIMIT:
        return None, None
    usage = _read_int(folder / "memory.usage_in_bytes") or 0.0
    return limit, max(0.0, usage - stat.get("total_inactive_file", stat.get("inactive_file", 0.0)))


def _v2(folder: Path, root: Path) -> tuple[float | None, float | None]:
    limits, at = [], folder
    while True:  # a parent's memory.max limits its children too
        value = _read_int(at / "memory.max")
        if value is not None:
            limits.append(value)
        if at == root or root not in at.parents:
            break
        at = at.parent
    if not limits:
        return None, None
    usage = _read_int(folder / "memory.current") or 0.0
    return min(limits), max(0.0, usage - _stat(folder / "memory.stat").get("inactive_file", 0.0))


def oom_kills(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """How many processes the kernel has killed for memory in this process's memory cgroup (v1
    `memory.oom_control`, v2 `memory.events`, both `oom_kill N`), or None where it cannot be read."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _counter(_folder(cgroup_root / "memory", path) / "memory.oom_control", "oom_kill")
    for line in lines:
        if line.startswith("0::"):
            return _counter(_folder(cgroup_root, line[3:]) / "memory.events", "oom_kill")
    return None


def _counter(path: Path, key: str) -> int | None:
    value = _stat(path).get(key)
    return None if value is None else int(value)


def oom_kills_here(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The kernel's OOM kills seen from this process: its memory cgroup's count (`oom_kills`), else the
    machine's (/proc/vmstat `oom_kill`); None where neither can be read."""
    kills = oom_kills(proc, cgroup_root)
    if kills is not None:
        return kills
    try:
        return next(int(line.split()[1]) for line in (proc / "vmstat").read_text().splitlines()
                    if line.startswith("oom_kill "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
