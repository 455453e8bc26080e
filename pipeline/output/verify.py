"""`flexbatch verify`: a finished job's output folder checked against its own records. Every shard of
`_job.json` is committed in the manifest, every part has the size and SHA-256 recorded there and one row per
input row, and every id appears exactly once: the ids equal the input's (when the input files are still
those the job read), else they are at least unique. An OpenAI Batch job's JSONL parts are checked by their
line count and the uniqueness of their line ids."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import OutputFolderError
from pipeline.input.parquet import ID_COLUMN
from pipeline.input.requests import row_ids
from pipeline.input.shards import Shard, read_shard
from pipeline.output.folder import JOB_FILE, read_job_file
from pipeline.output.manifest import SUCCESS_FILE, manifest_records, part_problem
from pipeline.storage import Folder, file_identity, open_parquet


@dataclass(frozen=True)
class Verification:
    folder: str
    shards: int
    rows: int
    problems: tuple[str, ...]  # each names the part or shard and what is wrong
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_output(folder: Path | str) -> Verification:
    record = read_job_file(folder)
    if record is None:
        raise OutputFolderError(f"{folder} has no readable {JOB_FILE}; expected the --output folder of a flexbatch run")
    where = Folder(folder)
    shards = [Shard.from_dict(d) for d in record.get("shards") or []]
    committed = manifest_records(folder, record.get("config_hash"))
    jsonl = (record.get("config") or {}).get("format") == "openai"
    unchanged = set() if jsonl else _unchanged_inputs(record)
    problems, notes, seen, rows = [], [], Counter(), 0
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
    if where.size(SUCCESS_FILE) is None:
        problems.append(f"no {SUCCESS_FILE}: the job has not finished; rerun the same command to complete it")
    if not jsonl and len(unchanged) < len({s.path for s in shards}):
        notes.append("some input files changed or are gone since the run: their ids were checked for uniqueness "
                     "and count only")
    return Verification(str(folder), len(shards), rows, tuple(problems), tuple(notes))


def _unchanged_inputs(record: dict) -> set[str]:
    """The input files whose path, size and mtime are still those the job recorded."""
    out = set()
    for known in (record.get("config") or {}).get("input_files") or []:
        try:
            if file_identity(known["path"]) == known:
                out.add(known["path"])
        except (OSError, KeyError, TypeError):
            continue
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


