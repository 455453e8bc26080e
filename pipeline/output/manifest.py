"""`_manifest.jsonl`: the commit record of a job. Only the driver writes it: one JSON line per committed shard,
appended, flushed and fsynced before the shard counts as done. A part file that is not in the manifest does
not count (it is redone), so a crash between writing a part and recording it loses nothing and duplicates
nothing. A torn last line (the driver killed mid-write) is ignored."""

from __future__ import annotations

import json
import logging

from pipeline.storage import Folder

log = logging.getLogger(__name__)

MANIFEST_FILE = "_manifest.jsonl"
SUCCESS_FILE = "_SUCCESS"


def read_manifest(where: Folder, config_hash: str) -> dict[str, dict]:
    """Committed shards of the job with `config_hash`, by part name, whose part file still exists with the
    recorded size and SHA-256 (lines written before hashes were recorded are checked by size). Lines of other
    jobs and unreadable lines are skipped; a part that does not match is redone."""
    committed: dict[str, dict] = {}
    for part, record in manifest_records(where, config_hash).items():
        problem = part_problem(where, record)
        if problem:
            log.warning("%s is recorded as committed but %s; it will be redone", where.child(part), problem)
            continue
        committed[part] = record
    return committed


def manifest_records(where: Folder, config_hash: str) -> dict[str, dict]:
    """The job's manifest lines by part name (the last line of a part wins), unchecked."""
    records: dict[str, dict] = {}
    for n, line in enumerate((where.read_text(MANIFEST_FILE) or "").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("%s line %d is not JSON (an interrupted write); ignored", where.child(MANIFEST_FILE), n)
            continue
        if isinstance(record, dict) and record.get("config_hash") == config_hash:
            records[str(record.get("part"))] = record
    return records


def part_problem(where: Folder, record: dict) -> str | None:
    """Why the part a manifest line records no longer matches it, or None if it does."""
    part = str(record.get("part"))
    size = where.size(part)
    if size is None:
        return "is missing"
    if size != record.get("bytes"):
        return f"has {size} bytes, not the {record.get('bytes')} recorded"
    if "sha256" in record and where.sha256(part) != record["sha256"]:
        return "its content changed (SHA-256 differs from the manifest)"
    return None


def manifest_parts(folder: Folder) -> set[str]:
    """Every part name the folder's manifest records, of any job (what flexbatch wrote there)."""
    names = set()
    for line in (folder.read_text(MANIFEST_FILE) or "").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("part"), str):
            names.add(record["part"])
    return names


def append_manifest(folder: Folder, record: dict) -> None:
    """Append one commit record durably (see `Folder.append_line`)."""
    folder.append_line(MANIFEST_FILE, json.dumps(record, sort_keys=True) + "\n")


def write_success(folder: Folder, summary: dict) -> None:
    """`_SUCCESS`: the job summary, written atomically once every shard has committed or failed for good."""
    folder.write_json(SUCCESS_FILE, summary)
