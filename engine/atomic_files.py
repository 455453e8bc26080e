"""Files written whole or not at all, and the clearing of what killed writers left behind.

A file flexbatch keeps is written under a temporary name beside it, `.<name>.<pid>@<host>~<random>.tmp`, then
renamed over its name: a reader sees the old file or the new one, never half of one. A writer killed before its
rename (a conversion, a profile's disk probe, a measurement) leaves its temporary behind; `sweep` removes, in a
folder, the temporaries whose writer is gone: a process of this host that is no longer alive, or any temporary a
day old (whatever host made it, for folders on shared storage). A live writer's temporary is never touched."""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)
STALE_S = 86400  # a temporary this old is a dead writer's, on any host
_TEMP = re.compile(r"^\..+\.(\d+)@([^~]*)~[A-Za-z0-9_]+\.tmp$")
_swept: set[Path] = set()


def _owner() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


def temp_path(path: Path) -> Path:
    """A fresh temporary name for `path`, in its folder, naming this process as its writer."""
    return path.with_name(f".{path.name}.{_owner()}~{secrets.token_hex(4)}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole (fsync'd, mode 0644) under a temporary name, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_owner()}~", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def writer_gone(pid: int, host: str, mtime: float) -> bool:
    """Whether the writer `pid`@`host` of something last changed at `mtime` is gone: a day old, or of this host
    and no process of that pid alive (this process's own are never gone)."""
    if time.time() - mtime > STALE_S:
        return True
    if host != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def sweep(folder: Path, once: bool = False) -> int:
    """Remove the temporaries of `folder` whose writer is gone (`writer_gone`); with `once`, only at the first call
    for this folder in this process. Returns how many were removed."""
    folder = Path(folder)
    if once and folder in _swept:
        return 0
    _swept.add(folder)
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        m = _TEMP.match(entry.name)
        try:
            if not m or not writer_gone(int(m.group(1)), m.group(2), entry.stat(follow_symlinks=False).st_mtime):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:  # removed by another process meanwhile, or not ours to remove
            continue
    if removed:
        log.info("removed %d temporary file(s) in %s left by writers that did not finish", removed, folder)
    return removed
