"""The kernel library's build folders (engine/kernels/compiled.py): what makes a finished build trustworthy, and the
clearing of what dead builds left.

A finished build holds the library and its record `flexbatch_kernels.json` (the library's size and SHA-256),
written in the build's temporary folder before that is renamed into place. A loader checks the library against
the record before it is mapped: a library cut short (a full disk, a copy that stopped) or replaced would otherwise
crash every run with a bus error when the loader reads past its end, and crash the next run again. A library
that does not match is moved aside and removed, and built anew.

A build runs in `<key>.tmp<pid>@<host>`; one killed before its rename leaves that folder behind, which the next
build on the same host removes once no process of that pid is alive (and any such folder a day old, whatever
host made it)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from engine.atomic_files import STALE_S, writer_gone
from engine.kept_files import INT, TEXT, parse

log = logging.getLogger(__name__)
RECORD_SHAPE = {"bytes": INT, "sha256": TEXT}  # engine/kept_files.py
RECORD = "flexbatch_kernels.json"


def work_folder(final: Path) -> Path:
    """Where this process builds the library that is renamed to `final` once finished."""
    return final.with_name(f"{final.name}.tmp{os.getpid()}@{socket.gethostname()}")


def write_record(library: Path) -> None:
    """Record the library's size and SHA-256 beside it."""
    record = {"bytes": library.stat().st_size, "sha256": _sha256(library)}
    (library.parent / RECORD).write_text(json.dumps(record))


def unsound(library: Path) -> str | None:
    """Why the library at `library` must not be loaded (it does not match its record, or has none), or None."""
    try:
        record, problem = parse((library.parent / RECORD).read_text(), RECORD_SHAPE, "the record")
        size, digest = record["bytes"], record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):  # missing, not text, or not of its shape (`problem`)
        return "has no readable record of its build (size and SHA-256)"
    actual = library.stat().st_size
    if actual != size:
        return f"is {actual:,} bytes where its build wrote {size:,} (cut short or replaced)"
    if _sha256(library) != digest:
        return "does not match the SHA-256 its build recorded (changed or replaced)"
    return None


def discard(folder: Path) -> None:
    """Move a build folder aside (loaders then no longer find it) and remove it."""
    aside = folder.with_name(f"{folder.name}.bad{os.getpid()}")
    try:
        folder.rename(aside)
    except OSError:  # gone already (another process discarded it), or cannot be renamed: removed in place
        aside = folder
    shutil.rmtree(aside, ignore_errors=True)


def sweep_dead_builds(home: Path) -> None:
    """Remove the temporary folders of builds that died before their rename, and discarded folders left half
    removed."""
    if not home.is_dir():
        return
    for folder in home.iterdir():
        if ".bad" in folder.name or (".tmp" in folder.name and _dead_build(folder)):
            log.info("removing %s, left by a kernel build that did not finish", folder)
            shutil.rmtree(folder, ignore_errors=True)


def _dead_build(folder: Path) -> bool:
    owner = folder.name.rsplit(".tmp", 1)[1]
    pid, _, host = owner.partition("@")
    try:
        mtime = folder.stat().st_mtime
    except OSError:
        return False
    if not pid.isdigit():
        return time.time() - mtime > STALE_S
    return writer_gone(int(pid), host or socket.gethostname(), mtime)  # no host: an older build's, of this host


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
