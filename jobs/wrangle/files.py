"""The job's files: the prompt file (kept when a rerun resumes the same job), Parquet written atomically, and
the completions of a finished job by row id."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import JobSummary
from pipeline.errors import OutputFolderError
from pipeline.output.folder import JOB_FILE

COMPLETIONS_DIR = "completions"


def write_prompts(path: Path, ids: list[str], prompts: list[str], overwrite: bool) -> None:
    """Write the prompt file, unless it already holds these prompts (a rerun resumes the same job). Other
    prompts whose completions exist are replaced only with `overwrite`; refusing leaves that job resumable."""
    table = pa.table({"id": ids, "prompt": prompts})
    if path.is_file():
        try:
            if pq.read_table(path).equals(table):
                return
        except (OSError, pa.ArrowException):
            pass  # unreadable: written again below
        if not overwrite and (path.parent / COMPLETIONS_DIR / JOB_FILE).is_file():
            raise OutputFolderError(f"{path.parent} holds the completions of other prompts (other data, split or "
                                    f"prompt options); pass --overwrite to replace them, or choose another "
                                    f"--output")
    write_parquet(table, path)


def write_parquet(table: pa.Table, path: Path) -> None:
    """Written under a temporary name and renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def read_completions(summary: JobSummary) -> dict[str, dict]:
    out = {}
    columns = ["id", "completion", "finish_reason", "error", "prompt_tokens", "completion_tokens"]
    for part in summary.parts:
        for row in pq.read_table(part, columns=columns).to_pylist():
            out[row["id"]] = row
    return out
