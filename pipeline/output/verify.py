"""`flexbatch verify`: a finished job's output folder checked against its own records and its input.

`_job.json` must describe the input: its config matches its hash, it names the input files, and its shards cover
each file's rows [0, rows) once, in order, with the row count read from the file itself (the Parquet footer, a
batch file's requests) while the file is the one the job read. Every shard is committed in the manifest, every
part has the size and SHA-256 recorded there and one row per input row, and every id appears exactly once: the
ids equal the input's (when the input files are still those the job read), else they are at least unique. A
file that a reader of the folder would read (a name not starting with `.` or `_`) and that is no shard's part
is a problem too: a stray copy of a part duplicates its rows. An OpenAI Batch job's JSONL parts are checked by
their line count and the uniqueness of their line ids."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError, OutputFolderError
from pipeline.input.ids import ID_COLUMN
from pipeline.input.parquet import read_footer
from pipeline.input.requests import row_ids
from pipeline.input.shards import Shard, read_shard
from pipeline.output.folder import (
    JOB_FILE,
    JOB_FILES,
    SUCCESS_FILE,
    config_hash,
    manifest_records,
    part_problem,
    read_job_file,
)
from pipeline.storage import Folder, file_identity, open_parquet

# A damaged `_job.json` no longer says which rows each part holds; only a new run can say it again.
REWRITE = ("the parts cannot be checked against the input; write the output again (rerun the job into a new "
           "--output folder, or delete this one and rerun)")


@dataclass(frozen=True)
class Verification:
    folder: str
    shards: int
    rows: int
    problems: tuple[str, ...]  # each names the part, shard or file and what is wrong
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_output(folder: Path | str) -> Verification:
    where = Folder(folder)
    record = read_job_file(where)
    if record is None:
        raise OutputFolderError(f"{folder} has no readable {JOB_FILE}; expected the --output folder of a flexbatch run")
    damage = record_problems(record)
    if damage:
        return Verification(str(folder), 0, 0, tuple(f"{JOB_FILE} {d}: {REWRITE}" for d in damage))
    config = record["config"]
    shards = [Shard.from_dict(d) for d in record["shards"]]
    jsonl = config.get("format") == "openai"
    inputs = input_rows(config["input_files"], jsonl)
    problems, notes = layout_problems(shards, inputs)
    unchanged = set() if jsonl else {path for path, n in inputs.items() if n is not None}  # ids: Parquet only
    rows = _check_parts(where, shards, record["config_hash"], jsonl, unchanged, problems)
    problems += stray_files(where, shards, record)
    if where.size(SUCCESS_FILE) is None:
        problems.append(f"no {SUCCESS_FILE}: the job has not finished; rerun the same command to complete it")
    if any(n is None for n in inputs.values()):
        notes.append("some input files changed or are gone since the run: their row counts and ids could not be "
                     "read from them; the parts were checked for count and uniqueness only")
    return Verification(str(folder), len(shards), rows, tuple(problems), tuple(notes))


def _check_parts(where: Folder, shards: list[Shard], job_hash: str, jsonl: bool, unchanged: set[str],
                 problems: list[str]) -> int:
    """Each shard's part against its manifest line and its input rows; appends the problems, returns the rows."""
    committed = manifest_records(where, job_hash)
    seen, rows = Counter(), 0
    for s in shards:
        entry = committed.get(s.part_name)
        problem = "not committed in the manifest" if entry is None else part_problem(where, entry)
        if problem is None:
            ids = _jsonl_ids(where, s.part_name) if jsonl else _part_ids(where.child(s.part_name))
            problem = _ids_problem(s, ids, unchanged)
            seen.update(ids)
            rows += len(ids)
        if problem:
            problems.append(f"shard {s.index} ({s.part_name}): {problem}")
    repeated = sorted(i for i, n in seen.items() if n > 1)
    if repeated:
        problems.append(f"{len(repeated)} ids appear more than once, e.g. {repeated[:3]}")
    return rows


def record_problems(record: dict) -> list[str]:
    """What makes `_job.json` unfit to check the folder by: each item reads after "_job.json"."""
    config = record.get("config")
    if not isinstance(config, dict):
        return ["has no job config (no \"config\" object): it is not the record flexbatch writes"]
    if record.get("config_hash") != config_hash(config):
        return ["does not match its own config_hash: it was edited after the run"]
    files = config.get("input_files")
    if not isinstance(files, list) or not files or not all(isinstance(f, dict) and "path" in f for f in files):
        return ["names no input files (config.input_files is empty or damaged)"]
    shards = record.get("shards")
    if not isinstance(shards, list) or not shards:
        return ["lists no shards: which part holds which rows is lost"]
    for at, entry in enumerate(shards):
        problem = _shard_entry_problem(entry, at)
        if problem:
            return [problem]
    names = Counter(d["part_name"] for d in shards)
    clash = sorted(n for n, k in names.items() if k > 1)
    return [f"gives the parts {clash[:3]} to more than one shard"] if clash else []


def _shard_entry_problem(entry, at: int) -> str | None:
    try:
        s = Shard.from_dict(entry)
    except (KeyError, TypeError):
        return f"shard entry {at} is damaged ({str(entry)[:80]})"
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (s.index, s.row_start, s.row_stop)):
        return f"shard entry {at} has rows or an index that are not integers"
    if not all(isinstance(v, str) and v for v in (s.path, s.part_stem, s.part_name)) or "/" in s.part_name:
        return f"shard entry {at} has a path or part name that is not a plain name"
    if s.index != at or not 0 <= s.row_start <= s.row_stop:
        return f"shard entry {at} has index {s.index} and rows {s.row_start}-{s.row_stop}"
    return None


def input_rows(files: Sequence[dict], jsonl: bool) -> dict[str, int | None]:
    """Each input file's row count by path (in the job's file order), read from the file while its path, size
    and mtime are still those the job recorded; None for a file that changed or is gone."""
    out: dict[str, int | None] = {}
    for known in files:
        path = str(known["path"])
        try:
            same = file_identity(path) == known
        except (OSError, TypeError, ValueError):
            same = False
        out[path] = _row_count(path, jsonl) if same else None
    return out


def _row_count(path: str, jsonl: bool) -> int | None:
    try:
        if jsonl:
            from pipeline.input.openai_batch import scan_batch_file

            return scan_batch_file(path)[0]
        return read_footer(path)[1]
    except (InputError, OSError):
        return None


def layout_problems(shards: list[Shard], inputs: dict[str, int | None]) -> tuple[list[str], list[str]]:
    """Whether the shards cover every input file's rows [0, rows) once, in the job's file order; and a note
    where the part names do not sort in the order of the rows they hold."""
    problems = [f"shard {s.index} ({s.part_name}) reads {s.path}, which is not among the job's input files"
                for s in shards if s.path not in inputs]
    order = list(inputs)
    positions = [order.index(s.path) for s in shards if s.path in inputs]
    if positions != sorted(positions):
        problems.append(f"the shards of {JOB_FILE} are not in the order of the input files: {REWRITE}")
    for path, rows in inputs.items():
        problems += _coverage_problems(path, rows, [s for s in shards if s.path == path])
    notes = []
    names = [s.part_name for s in shards]
    if names != sorted(names):
        notes.append(f"the part names do not sort in input order (as older versions named the parts of "
                     f"inputs from several folders); read the parts in the order of the shards in {JOB_FILE}")
    return problems, notes


def _coverage_problems(path: str, rows: int | None, shards: list[Shard]) -> list[str]:
    if not shards:
        return [f"input file {path} is in no shard: its rows are in no part; {REWRITE}"]
    problems, at = [], 0
    for s in shards:
        if s.row_start != at:
            what = "are in no part" if s.row_start > at else "are in two parts"
            problems.append(f"rows {min(at, s.row_start)}-{max(at, s.row_start)} of {path} {what} (shard "
                            f"{s.index} starts at row {s.row_start}); {REWRITE}")
        at = s.row_stop
    if rows is not None and at != rows:
        what = f"rows {at}-{rows} are in no part" if at < rows else f"the shards claim rows up to {at}"
        problems.append(f"the shards of {path} cover rows 0-{at} and the file has {rows} rows: {what}; "
                        f"rerun the same command to complete the job")
    return problems


def stray_files(where: Folder, shards: list[Shard], record: dict) -> list[str]:
    """Entries a reader of the folder would read (names not starting with `.` or `_`) that no shard owns."""
    parts = {s.part_name for s in shards} | set(JOB_FILES)
    kept = set(record.get("kept") or []) if isinstance(record.get("kept"), list) else set()
    out = []
    for name, is_file in where.entries():
        if name in parts or name.startswith((".", "_")):
            continue
        what = "a file" if is_file else "a folder"
        why = "left by --overwrite: flexbatch did not write it" if name in kept else (
            "a copy of a part or a file flexbatch did not write")
        out.append(f"{name} is {what} that no shard of {JOB_FILE} owns ({why}); a reader of the folder would read "
                   f"it with the parts: move it out of {where.location}")
    return out


def _part_ids(location: str) -> list[str]:
    with open_parquet(location) as pf:
        return pf.read(columns=[ID_COLUMN]).column(0).to_pylist()


def _jsonl_ids(where: Folder, name: str) -> list[str]:
    lines = [line for line in (where.read_text(name) or "").splitlines() if line.strip()]
    return [str(json.loads(line).get("id")) for line in lines]


def _ids_problem(shard: Shard, ids: list[str], unchanged: set[str]) -> str | None:
    if len(ids) != shard.num_rows:
        return f"holds {len(ids)} rows for the shard's {shard.num_rows} input rows"
    if shard.path not in unchanged:
        return None
    expected = row_ids(read_shard(shard), shard.part_stem, offset=shard.row_start)
    wrong = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), None)
    if wrong is None:
        return None
    return f"row {shard.row_start + wrong} has id {ids[wrong]!r}, the input's is {expected[wrong]!r}"
