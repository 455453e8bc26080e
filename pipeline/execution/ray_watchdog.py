"""Stops the local Ray a driver started when that driver dies, however it dies (SIGKILL included).

Ray ties its head processes (GCS, raylet) to the driver that started them, but the agents and workers the raylet
starts poll for their parent and outlive a killed driver by minutes. The watchdog is a small process that holds
the read end of a pipe whose write end only the driver holds: the kernel closes it when the driver ends. Until
then the watchdog notes, every second, the processes under the Ray head (pid and start time, so that a reused
pid is never taken for one of them); at the end it sends SIGTERM to those still running, and SIGKILL to those
left after KILL_AFTER_SECONDS."""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time

log = logging.getLogger(__name__)

KILL_AFTER_SECONDS = 3.0
_pipes: list[int] = []  # the write ends this process keeps open until it exits


def start_watchdog(head_pids: list[int]) -> int | None:
    """Watch the local Ray whose head processes are `head_pids`; returns the watchdog's pid."""
    if not head_pids:
        return None
    read_end, write_end = os.pipe()  # neither end is inherited by processes started later
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.execution.ray_watchdog", *map(str, head_pids)], stdin=read_end,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(read_end)
    _pipes.append(write_end)
    log.debug("watchdog pid %d stops the local Ray (head pids %s) when this process ends", proc.pid, head_pids)
    return proc.pid


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(parent, []).append(int(name))
    return out


def _note_tree(known: dict[int, int]) -> None:
    """Add every live descendant of the known processes (those still the same process) to `known`."""
    children, todo = _children(), [p for p, t in known.items() if _start_time(p) == t]
    while todo:
        for child in children.get(todo.pop(), []):
            started = _start_time(child)
            if child not in known and started is not None and child != os.getpid():
                known[child] = started
                todo.append(child)


def stop_processes(alive, grace_s: float) -> None:
    """SIGTERM the processes `alive()` lists, then SIGKILL those it still lists after `grace_s` seconds; wait
    up to `grace_s` for them to go."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)


def _stop(known: dict[int, int]) -> None:
    stop_processes(lambda: [p for p, t in known.items() if _start_time(p) == t], KILL_AFTER_SECONDS)


def main(head_pids: list[int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the driver's terminal is the driver's to handle
    known = {p: t for p in head_pids if (t := _start_time(p)) is not None}
    while True:
        _note_tree(known)
        ready, _, _ = select.select([0], [], [], 1.0)
        if ready and not os.read(0, 1):  # end of file: the driver has ended
            break
    _note_tree(known)
    _stop(known)


if __name__ == "__main__":
    main([int(p) for p in sys.argv[1:]])
