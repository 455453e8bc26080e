"""The output parts: each shard's input table with the completion columns added, row for row, written atomically
(temporary name in the same folder, fsync, rename)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from engine.request import Completion
from pipeline.input.ids import ID_COLUMN
from pipeline.input.scoring import SCORE_COLUMNS
from pipeline.storage import Folder

log = logging.getLogger(__name__)

# Columns the job appends; an input that already has one of them would be silently clobbered.
OUTPUT_COLUMNS = ("completion", "prompt_tokens", "completion_tokens", "finish_reason", "error", "logprobs",
                  "token_ids", *SCORE_COLUMNS)


def output_table(table: pa.Table, completions: Sequence[Completion], ids: Sequence[str], logprobs: bool,
                 scores: dict[str, pa.Array] | None = None) -> pa.Table:
    """The input table plus the completion columns, row for row, and `scores` (a scoring job's columns,
    pipeline/input/scoring.py) after them. The `id` column holds `ids` as strings: it replaces an input `id`
    column in place (filling its nulls with made ids) or becomes the first column."""
    if not len(completions) == len(ids) == table.num_rows:
        raise RuntimeError(f"{len(completions)} completions and {len(ids)} ids for {table.num_rows} input rows")
    id_array = pa.array(ids, pa.string())
    if ID_COLUMN in table.column_names:
        out = table.set_column(table.column_names.index(ID_COLUMN), ID_COLUMN, id_array)
    else:
        out = table.add_column(0, ID_COLUMN, id_array)
    columns = {
        "completion": pa.array([c.text for c in completions], pa.string()),
        "prompt_tokens": pa.array([c.prompt_tokens for c in completions], pa.int32()),
        "completion_tokens": pa.array([c.completion_tokens for c in completions], pa.int32()),
        "finish_reason": pa.array([c.finish_reason for c in completions], pa.string()),
        "error": pa.array([c.error for c in completions], pa.string()),
    }
    if logprobs:  # the ids let a reader name each scored token (HELM's `tokens`)
        columns["logprobs"] = pa.array([c.logprobs for c in completions], pa.list_(pa.float32()))
        columns["token_ids"] = pa.array([c.token_ids if c.logprobs is not None else None for c in completions],
                                        pa.list_(pa.int32()))
    columns.update(scores or {})
    for name, values in columns.items():
        out = out.append_column(name, values)
    return out


def write_part_atomic(table: pa.Table, folder: Folder, name: str) -> tuple[int, str]:
    """Write `folder/name` so that readers see either the old file or the whole new one, never a partial one;
    returns the part's size in bytes and its SHA-256."""
    size, sha256 = folder.write_table(name, table)
    log.info("wrote %s (%d rows)", folder.child(name), table.num_rows)
    return size, sha256
