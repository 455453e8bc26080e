"""`_manifest.jsonl`: the commit record of a job. Only the driver writes it: one JSON line per committed shard,
appended, flushed and fsynced before the shard counts as done. A part file that is not in the manifest does
not count (it is redone), so a crash between writing a part and recording it loses nothing and duplicates
nothing. A torn last line (the driver killed mid-write) is ignored."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST_FILE = "_manifest.jsonl"
SUCCESS_FILE = "_SUCCESS"


def read_manifest(folder: Path, config_hash: str) -> dict[str, dict]:
    """Committed shards of the job with `config_hash`, by part name, whose part file still exists with the
    recorded size. Lines of other jobs and unreadable lines are skipped."""
    path = folder / MANIFEST_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    committed: dict[str, dict] = {}
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("%s line %d is not JSON (an interrupted write); ignored", path, n)
            continue
        if not isinstance(record, dict) or record.get("config_hash") != config_hash:
            continue
        part = folder / str(record.get("part"))
        if not part.is_file() or part.stat().st_size != record.get("bytes"):
            log.warning("%s is recorded as committed but is missing or changed; it will be redone", part)
            continue
        committed[record["part"]] = record
    return committed


def append_manifest(folder: Path, record: dict) -> None:
    """Append one commit record durably (write, flush, fsync). A previous torn line is terminated first so
    that it cannot swallow this one."""
    path = folder / MANIFEST_FILE
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def write_success(folder: Path, summary: dict) -> None:
    """`_SUCCESS`: the job summary, written atomically once every shard has committed or failed for good."""
    from pipeline.output_dir import write_json_atomic

    write_json_atomic(folder, SUCCESS_FILE, summary)
