"""From input rows to engine requests: row ids, per-row parameter overrides, per-row seeds, and bad rows.

A bad row (null, empty or non-string prompt; an invalid per-row parameter) becomes a failed `Completion` here
and never reaches the engine; the other rows go on."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence

import pyarrow as pa

from engine.chat import messages_problem
from engine.errors import InvalidParamsError
from engine.request import Completion, Request, SamplingParams
from pipeline.input.parquet import ID_COLUMN, MESSAGES_COLUMN

# Optional input columns that override the job's options row by row; a null means "use the option".
ROW_PARAM_COLUMNS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed")
_INT_PARAMS = ("max_new_tokens", "top_k", "seed")
_SEED_BITS = 63


def row_ids(table: pa.Table, stem: str, offset: int = 0) -> list[str]:
    """One id per row: the `id` column cast to string where present and not null, else `<stem>:<row index>`,
    the index counted from the file's first row (`table` starts at row `offset` of its file). A binary id
    becomes text one to one (see `_id_text`), so distinct ids stay distinct."""
    made = [f"{stem}:{offset + i}" for i in range(table.num_rows)]
    if ID_COLUMN not in table.column_names:
        return made
    given = table.column(ID_COLUMN).to_pylist()
    return [made[i] if v is None else _id_text(v) for i, v in enumerate(given)]


def _id_text(value) -> str:
    """Binary ids: valid UTF-8 reads as itself; each byte that is not is written `\\xNN`, and a backslash is
    doubled, so that two distinct byte strings never give the same text (a lossy decode would merge them)."""
    if isinstance(value, bytes):
        return value.replace(b"\\", b"\\\\").decode("utf-8", errors="backslashreplace")
    return str(value)


def derive_seed(base_seed: int, row_id: str) -> int:
    """A seed per row that differs between rows and is identical across reruns (and across batchings)."""
    digest = hashlib.sha256(f"{base_seed}\x00{row_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - _SEED_BITS)


def build_requests(
    table: pa.Table, ids: Sequence[str], prompt_column: str, defaults: SamplingParams, chat: bool = False
) -> list[Request | Completion]:
    """One item per row, in row order: a `Request` to run, or a failed `Completion` for a bad row. Chat rows
    take their conversation from the `messages` column instead of the prompt column."""
    prompts = table.column(MESSAGES_COLUMN if chat else prompt_column).to_pylist()
    overrides = {c: table.column(c).to_pylist() for c in ROW_PARAM_COLUMNS if c in table.column_names}
    items: list[Request | Completion] = []
    for i, (row_id, prompt) in enumerate(zip(ids, prompts)):
        problem = messages_problem(prompt) if chat else prompt_problem(prompt, prompt_column)
        if problem:
            items.append(Completion.failed(row_id, problem))
            continue
        try:
            params = row_params(defaults, {c: values[i] for c, values in overrides.items()}, row_id)
        except InvalidParamsError as e:
            items.append(Completion.failed(row_id, f"per-row parameter: {e}"))
            continue
        if chat:
            items.append(Request(id=row_id, prompt="", params=params, messages=tuple(prompt)))
        else:
            items.append(Request(id=row_id, prompt=prompt, params=params))
    return items


def prompt_problem(prompt, prompt_column: str) -> str | None:
    """Why this prompt cannot run, or None if it can."""
    if prompt is None:
        return f"prompt column {prompt_column!r} is null in this row; expected a non-empty string"
    if not isinstance(prompt, str):
        return f"prompt column {prompt_column!r} holds a {type(prompt).__name__} in this row; expected a string"
    if prompt == "":
        return f"prompt column {prompt_column!r} is empty in this row; expected a non-empty string"
    return None


def row_params(defaults: SamplingParams, overrides: dict, row_id: str) -> SamplingParams:
    """`defaults` with this row's non-null overrides applied. Without a row seed, the seed is derived from the
    job seed and the row id. Raises `InvalidParamsError` for a bad value (SamplingParams checks it)."""
    changes = {name: _coerce(name, value) for name, value in overrides.items() if not _missing(value)}
    if "seed" not in changes:
        changes["seed"] = derive_seed(defaults.seed, row_id)
    if "stop" in changes and isinstance(changes["stop"], str):
        changes["stop"] = (changes["stop"],)
    if "stop" in changes and not isinstance(changes["stop"], (list, tuple)):
        raise InvalidParamsError(f"stop={changes['stop']!r} is invalid: expected a list of strings")
    return dataclasses.replace(defaults, **changes)


def _missing(value) -> bool:
    """Null, or NaN, which dataframe libraries write for a missing float."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _coerce(name: str, value):
    """Integer parameters often arrive as floats (a pandas int column with nulls becomes float64)."""
    if name in _INT_PARAMS and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
