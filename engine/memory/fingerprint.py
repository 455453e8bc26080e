"""What a checkpoint's bytes are: the content fingerprint that keys its converted layers (engine/memory/converted.py).

A weight file is known by the SHA-256 of all its bytes (its safetensors header, then its data), not by its name,
size or modification time: a checkpoint replaced in place by files of the same size with their times kept (what
`cp -p`, `rsync -a` and `tar x` do) must not be served the layers converted from the old one. Hashing a large
checkpoint takes a while (about a second per GB and core), so each file's digest is kept in a small JSON table
beside the converted layers, against what the file system says of it: device, inode, size, modification time
and change time. Nothing can write a file without changing its change time (no tool sets it back), so a file
whose entry matches is the file that was hashed, and is not read again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.atomic_files import write_atomic
from engine.kept_files import INT, TEXT, Table, read_kept

log = logging.getLogger(__name__)
TABLE = "fingerprints.json"  # in the offload folder: {absolute path: {"stat": [...], "sha256": ...}}
TABLE_SHAPE = Table({"stat": [INT], "sha256": TEXT})  # engine/kept_files.py


def checkpoint_fingerprint(model_dir: Path, table_dir: Path) -> str:
    """A SHA-256 over config.json's bytes and each weight file's name and content digest (`file_digest`)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    digests = file_digests(files, table_dir / TABLE)
    h = hashlib.sha256((Path(model_dir) / "config.json").read_bytes())
    for f in files:
        h.update(f"\0{f.name}\0{digests[f]}".encode())
    return h.hexdigest()


def file_digests(files: list[Path], table_path: Path) -> dict[Path, str]:
    """The SHA-256 of each file, from the table where the file is unchanged since it was hashed, else read now
    (files in parallel: hashlib lets other threads run) and recorded in the table."""
    table = _read(table_path)
    out, todo = {}, []
    for f in files:
        entry = table.get(str(f.resolve()))
        if entry is not None and entry.get("stat") == _stat_key(f) and "sha256" in entry:
            out[f] = entry["sha256"]
        else:
            todo.append(f)
    if todo:
        log.info("hashing %d weight file(s) of %s once, to key the converted layers by their content", len(todo),
                 todo[0].parent)
        with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            for f, (stat, digest) in zip(todo, pool.map(_hashed, todo)):
                out[f] = digest
                table[str(f.resolve())] = {"stat": stat, "sha256": digest}
        _write(table_path, _read(table_path) | {str(f.resolve()): table[str(f.resolve())] for f in todo})
    return out


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _hashed(path: Path) -> tuple[list[int], str]:
    """(the file's stat key, its SHA-256): the key taken before the read, so that a change during the read
    leaves a key that the next look no longer matches."""
    stat = _stat_key(path)
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # a memory cgroup would charge the pages read
    return stat, digest


def _read(path: Path) -> dict:
    """The table, {} where it is missing, unreadable or not of TABLE_SHAPE (then set aside): every file is hashed
    again."""
    return read_kept(path, TABLE_SHAPE, "the weight files' digests", "the weight files are hashed again") or {}


def _write(path: Path, table: dict) -> None:
    """Written whole under a temporary name, then renamed: a reader sees the old table or the new one."""
    try:
        write_atomic(path, json.dumps(table).encode())
    except OSError as e:  # a read-only folder: the files are hashed again next time
        log.warning("could not record the weight files' digests in %s (%s): later runs will hash them again",
                    path, e)
