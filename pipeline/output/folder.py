"""The output folder and the job's records in it: `_job.json` (which job owns the folder, and when a run may write
into it), `_manifest.jsonl` (the shards the job committed) and `_SUCCESS` (its summary).

A folder is usable when it does not exist, is empty, or holds only what a job with the same config wrote
(its `_job.json`, its parts, temporaries of an interrupted run). Anything else is refused unless `overwrite`,
which removes only what the old job's records name (its job files, the parts of its `_job.json` shards and of
its manifest lines, temporaries of those) and leaves every other file alone, listing it in the log.

Only the driver writes the manifest: one JSON line per committed shard, appended, flushed and fsynced before the
shard counts as done. A part file that is not in the manifest does not count (it is redone), so a crash between
writing a part and recording it loses nothing and duplicates nothing. A torn last line (the driver killed
mid-write) is ignored."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass

from engine.kept_files import INT, NUMBER, TEXT, Needed, shape_problem
from pipeline.errors import OutputFolderError
from pipeline.output.lock import LEASE_FILE, LOCK_FILE
from pipeline.storage import Folder, temp_target

log = logging.getLogger(__name__)

JOB_FILE = "_job.json"
MANIFEST_FILE = "_manifest.jsonl"
# a manifest line as the driver writes it (pipeline/execution/driver.py `_commit`), what resuming reads of it
COMMIT_SHAPE = {"part": Needed(TEXT), "bytes": Needed(INT), "sha256": TEXT, "seconds": NUMBER} | {
    name: Needed(INT) for name in ("rows", "error_rows", "prompt_tokens", "completion_tokens")} | {
    name: INT for name in ("shared_tokens", "saved_tokens")}
SUCCESS_FILE = "_SUCCESS"
JOB_FILES = (JOB_FILE, MANIFEST_FILE, SUCCESS_FILE, LOCK_FILE, LEASE_FILE)


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def job_record(config: dict) -> dict:
    """The content of `_job.json`: the job config and its hash; the driver adds the shard list (`shards`, each
    with its `part_name`) once the shards are cut."""
    config = json.loads(json.dumps(config))  # tuples become lists, as they will read back from the file
    return {"config": config, "config_hash": config_hash(config), "shards": []}


@dataclass(frozen=True)
class OutputCheck:
    """What opening the folder will do: `create` it, `reuse` it (same job), or `replace` another job's output;
    and the names flexbatch wrote there, as found by the check (`owned_names`)."""

    folder: Folder  # where the output goes: a local folder or a URI
    action: str
    old_record: dict | None
    kept: tuple[str, ...] = ()
    owned: frozenset[str] = frozenset(JOB_FILES)


def check_output(folder: Folder, record: dict, overwrite: bool) -> OutputCheck:
    """Decide, without changing anything, whether this job may write to `folder`."""
    kind = folder.kind()
    if kind == "missing":
        return OutputCheck(folder, "create", None)
    if kind == "file":
        raise OutputFolderError(f"--output {folder} is a file; expected a folder (it is created if missing)")
    old = read_job_file(folder)
    entries = {n: f for n, f in folder.entries() if n not in (LOCK_FILE, LEASE_FILE)}  # the run's own lock
    names = sorted(entries)
    if not names:
        return OutputCheck(folder, "create", None)
    same_job = old is not None and old.get("config_hash") == record["config_hash"]
    owned = owned_names(folder, old)
    foreign = [n for n in names if not _written_by_job(n, owned, old)]
    if same_job and not foreign:
        return OutputCheck(folder, "reuse", old, tuple(n for n in _kept(old) if n in names), frozenset(owned))
    if not overwrite:
        raise OutputFolderError(_refusal(folder, record, old, foreign))
    kept = tuple(n for n in names if not (entries[n] and _owned(n, owned)))
    return OutputCheck(folder, "replace", old, kept, frozenset(owned))


def _refusal(folder: Folder, record: dict, old: dict | None, foreign: list[str]) -> str:
    fix = "pass --overwrite to replace it, or choose another --output"
    if old is not None and old.get("config_hash") != record["config_hash"]:
        old_config = old.get("config") if isinstance(old.get("config"), dict) else {}
        new_config = record["config"]
        changed = sorted(k for k in set(old_config) | set(new_config) if old_config.get(k) != new_config.get(k))
        return f"output folder {folder} holds another job's output (its {JOB_FILE} differs in {changed}); {fix}"
    shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
    return f"output folder {folder} holds files that flexbatch did not write ({shown}); {fix}"


def owned_names(folder: Folder, old: dict | None) -> set[str]:
    """The names flexbatch wrote in `folder` by its records: the job files, the parts of the old `_job.json`'s
    shards and the parts its manifest lines name (of any job). A file is never taken as flexbatch's by its
    name's pattern alone."""
    return set(JOB_FILES) | (_part_names(old) if old else set()) | manifest_parts(folder)


def _owned(name: str, owned: set[str]) -> bool:
    return name in owned or temp_target(name) in owned


def _written_by_job(name: str, owned: set[str], old: dict | None) -> bool:
    return _owned(name, owned) or (old is not None and name in _kept(old))


def _part_names(record: dict) -> set[str]:
    shards = record.get("shards")
    if not isinstance(shards, list):
        return set()
    return {s["part_name"] for s in shards if isinstance(s, dict) and isinstance(s.get("part_name"), str)}


def _kept(record: dict) -> list[str]:
    kept = record.get("kept")
    return kept if isinstance(kept, list) else []


def read_job_file(folder: Folder) -> dict | None:
    """The folder's `_job.json`, or None if absent or unreadable (then the folder counts as foreign)."""
    try:
        record = json.loads(folder.read_text(JOB_FILE) or "")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def open_output(check: OutputCheck, record: dict) -> None:
    """Create or clean the folder as `check` decided, then write this job's `_job.json` atomically. Reusing
    the folder removes the temporaries and the `_SUCCESS` of an interrupted or earlier run. What flexbatch wrote
    there is as the check found it (the run holds the folder's lock from the check on)."""
    folder = check.folder
    folder.make()
    entries = folder.entries()
    owned = set(check.owned)
    clash = sorted(set(check.kept) & _part_names(record))
    if clash:
        raise OutputFolderError(f"output folder {check.folder} holds {', '.join(clash)}, which flexbatch did not "
                                f"write and this job would write a part of that name; choose another --output")
    if check.action == "replace":
        removable = [n for n, is_file in entries if is_file and _owned(n, owned) and n not in (LOCK_FILE, LEASE_FILE)]
    else:
        owned |= _part_names(record)
        removable = [n for n, is_file in entries if is_file and (temp_target(n) in owned or n == SUCCESS_FILE)]
    for name in removable:
        log.info("removing %s", folder.child(name))
        folder.delete(name)
    if check.action == "replace" and check.kept:
        log.warning("--overwrite left files it did not write in %s: %s", folder, ", ".join(check.kept))
    folder.write_json(JOB_FILE, {**record, "kept": list(check.kept)})


def read_manifest(where: Folder, job_hash: str) -> dict[str, dict]:
    """Committed shards of the job with config hash `job_hash`, by part name, whose part file still exists with the
    recorded size and SHA-256 (lines written before hashes were recorded are checked by size). Lines of other
    jobs and unreadable lines are skipped; a part that does not match is redone."""
    committed: dict[str, dict] = {}
    for part, record in manifest_records(where, job_hash).items():
        problem = part_problem(where, record)
        if problem:
            log.warning("%s is recorded as committed but %s; it will be redone", where.child(part), problem)
            continue
        committed[part] = record
    return committed


def manifest_records(where: Folder, job_hash: str) -> dict[str, dict]:
    """The manifest lines of the job with config hash `job_hash`, by part name (the last line of a part wins),
    unchecked."""
    records = {}
    for r in _manifest_lines(where, warn=True):
        if r.get("config_hash") != job_hash:
            continue
        problem = shape_problem(r, COMMIT_SHAPE, "the line")
        if problem:
            log.warning("%s holds a line of this job that is not a commit record (%s); ignored, its shard is redone",
                        where.child(MANIFEST_FILE), problem)
            continue
        records[r["part"]] = r
    return records


def _manifest_lines(folder: Folder, warn: bool):
    """The folder's manifest lines that read as JSON objects, in order; a line that does not (an interrupted
    write) is skipped, with a warning where `warn`."""
    for n, line in enumerate((folder.read_text(MANIFEST_FILE) or "").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            if warn:
                log.warning("%s line %d is not JSON (an interrupted write); ignored", folder.child(MANIFEST_FILE), n)
            continue
        if isinstance(record, dict):
            yield record


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
    return {r["part"] for r in _manifest_lines(folder, warn=False) if isinstance(r.get("part"), str)}


def append_manifest(folder: Folder, record: dict) -> None:
    """Append one commit record durably (see `Folder.append_line`)."""
    folder.append_line(MANIFEST_FILE, json.dumps(record, sort_keys=True) + "\n")


def write_success(folder: Folder, summary: dict) -> None:
    """`_SUCCESS`: the job summary, written atomically once every shard has committed or failed for good."""
    folder.write_json(SUCCESS_FILE, summary)
