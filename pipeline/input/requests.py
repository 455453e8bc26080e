"""From input rows to engine requests: row ids, per-row parameter overrides, per-row seeds, and bad rows.

A bad row (null, empty or non-string prompt; text that is not UTF-8; an invalid per-row parameter) becomes a
failed `Completion` here and never reaches the engine; the other rows go on. What a prompt that passes here
still needs (a chat template that renders it, token ids inside the vocabulary) is the engine's prompt-ids rule
(engine/prompt_ids.py), which fails its row alone in the same way."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence

import pyarrow as pa

from engine.chat import messages_problem
from engine.errors import InvalidParamsError
from engine.request import Completion, Request, SamplingParams
from pipeline.input.ids import bad_id_rows, row_ids
from pipeline.input.parquet import MESSAGES_COLUMN
from pipeline.input.utf8 import NotUtf8, column_values

__all__ = ["ROW_PARAM_COLUMNS", "build_requests", "derive_seed", "prompt_problem", "row_ids", "row_params"]

# Optional input columns that override the job's options row by row; a null means "use the option".
# guided: the row's answer constraint, a struct or JSON text ({"choice": [...]}, {"regex": ...}, {"json_schema": ...},
# {"json_object": true}, {"grammar": ...}: engine/guided.py), read by SamplingParams
ROW_PARAM_COLUMNS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed", "guided")
_INT_PARAMS = ("max_new_tokens", "top_k", "seed")
_SEED_BITS = 63


def derive_seed(base_seed: int, row_id: str) -> int:
    """A seed per row that differs between rows and is identical across reruns (and across batchings)."""
    digest = hashlib.sha256(f"{base_seed}\x00{row_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - _SEED_BITS)


def build_requests(
    table: pa.Table, ids: Sequence[str], prompt_column: str, defaults: SamplingParams, chat: bool = False,
    unused: Sequence[str] = (),
) -> list[Request | Completion]:
    """One item per row, in row order: a `Request` to run, or a failed `Completion` for a bad row. Chat rows
    take their conversation from the `messages` column instead of the prompt column; the `unused` parameter
    columns are not read (a scoring job's `guided`)."""
    column = MESSAGES_COLUMN if chat else prompt_column
    prompts = column_values(table, column)
    overrides = {c: column_values(table, c) for c in ROW_PARAM_COLUMNS if c in table.column_names and c not in unused}
    bad_ids = bad_id_rows(table)
    items: list[Request | Completion] = []
    for i, (row_id, prompt) in enumerate(zip(ids, prompts)):
        if isinstance(prompt, NotUtf8):
            problem = prompt.problem(f"column {column!r}")
        else:
            problem = messages_problem(prompt) if chat else prompt_problem(prompt, prompt_column)
        problem = bad_ids.get(i) or problem
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
    bad = next((name for name, value in overrides.items() if isinstance(value, NotUtf8)), None)
    if bad:
        raise InvalidParamsError(overrides[bad].problem(f"column {bad!r}"))
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
