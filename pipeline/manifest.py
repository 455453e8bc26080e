"""`_manifest.jsonl`: the commit record of a job. Only the driver writes it: one JSON line per committed shard,
appended, flushed and fsynced before the shard counts as done. A part file that is not in the manifest does
not count (it is redone), so a crash between writing a part and recording it loses nothing and duplicates
nothing. A torn last line (the driver killed mid-write) is ignored."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.storage import Folder

log = logging.getLogger(__name__)

MANIFEST_FILE = "_manifest.jsonl"
SUCCESS_FILE = "_SUCCESS"


def read_manifest(folder: Path | str, config_hash: str) -> dict[str, dict]:
    """Committed shards of the job with `config_hash`, by part name, whose part file still exists with the
    recorded size. Lines of other jobs and unreadable lines are skipped."""
    where = Folder(folder)
    lines = (where.read_text(MANIFEST_FILE) or "").splitlines()
    committed: dict[str, dict] = {}
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("%s line %d is not JSON (an interrupted write); ignored", where.child(MANIFEST_FILE), n)
            continue
        if not isinstance(record, dict) or record.get("config_hash") != config_hash:
            continue
        part = str(record.get("part"))
        if where.size(part) != record.get("bytes"):
            log.warning("%s is recorded as committed but is missing or changed; it will be redone", where.child(part))
            continue
        committed[part] = record
    return committed


def manifest_parts(folder: Path | str) -> set[str]:
    """Every part name the folder's manifest records, of any job (what flexbatch wrote there)."""
    names = set()
    for line in (Folder(folder).read_text(MANIFEST_FILE) or "").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("part"), str):
            names.add(record["part"])
    return names


def append_manifest(folder: Path | str, record: dict) -> None:
    """Append one commit record durably (see `Folder.append_line`)."""
    Folder(folder).append_line(MANIFEST_FILE, json.dumps(record, sort_keys=True) + "\n")


def write_success(folder: Path | str, summary: dict) -> None:
    """`_SUCCESS`: the job summary, written atomically once every shard has committed or failed for good."""
    from pipeline.output_dir import write_json_atomic

    write_json_atomic(folder, SUCCESS_FILE, summary)
