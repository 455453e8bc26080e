"""Row ids: every row carries one from input to output, and no two rows of a job share one.

A row's id is its `id` column's value as text where present and not null, else `<file stem>:<row index>`. A job
whose rows would share an id is refused before any model loads (the ids are read from the `id` columns alone):
its output could not be matched back to its input, and `flexbatch verify` would reject it. The fix is to make
the column unique, or to drop it so that every row gets its made id."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import pyarrow as pa

from pipeline.errors import InputError
from pipeline.input.utf8 import NotUtf8, column_values
from pipeline.storage import open_parquet

ID_COLUMN = "id"
_SHOWN = 3  # repeated ids named in the refusal


def row_ids(table: pa.Table, stem: str, offset: int = 0) -> list[str]:
    """One id per row: the `id` column cast to string where present and not null, else `<stem>:<row index>`,
    the index counted from the file's first row (`table` starts at row `offset` of its file). A binary id, or a
    string id whose bytes are not UTF-8 (a row error, `bad_id_rows`), becomes text one to one (see `id_text`),
    so distinct ids stay distinct."""
    if ID_COLUMN not in table.column_names:
        return [f"{stem}:{offset + i}" for i in range(table.num_rows)]
    column = table.column(ID_COLUMN)
    if column.null_count == 0 and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        try:  # the common case, without a test per row
            return column.to_pylist()
        except UnicodeDecodeError:
            pass
    given = column_values(table, ID_COLUMN)
    return [f"{stem}:{offset + i}" if v is None or (isinstance(v, NotUtf8) and v.raw is None) else id_text(v)
            for i, v in enumerate(given)]


def id_text(value) -> str:
    """Binary ids: valid UTF-8 reads as itself; each byte that is not is written `\\xNN`, and a backslash is
    doubled, so that two distinct byte strings never give the same text (a lossy decode would merge them)."""
    if isinstance(value, NotUtf8):
        value = value.raw
    if isinstance(value, bytes):
        return value.replace(b"\\", b"\\\\").decode("utf-8", errors="backslashreplace")
    return str(value)


def bad_id_rows(table: pa.Table) -> dict[int, str]:
    """Rows (of `table`) whose string id is not UTF-8, with that row's error."""
    if ID_COLUMN not in table.column_names:
        return {}
    return {i: v.problem(f"id column {ID_COLUMN!r}") + " (the row keeps the id written with \\xNN escapes)"
            for i, v in enumerate(column_values(table, ID_COLUMN)) if isinstance(v, NotUtf8)}


def check_unique_ids(files: Sequence) -> None:
    """Refuse a job in which two rows of `files` (pipeline.input.parquet.InputFile) would get the same id (given
    ids, or a given id equal to a made one), naming the first repeated ids, where they are, and the fix. The ids are first checked in bulk (one set); only
    a job that has repeats is read again to say where they are."""
    seen: set[str] = set()
    for f in files:
        for _, ids in _file_ids(f) if ID_COLUMN in f.columns else ():
            size = len(seen)
            seen.update(ids)
            if len(seen) < size + len(ids):
                raise InputError(_refusal(files))
    made = _made_stems(files)
    if made and any(_made_position(row_id, made) for row_id in seen):
        raise InputError(_refusal(files))


def _made_stems(files: Sequence) -> dict[str, tuple[int, int]]:
    """(file index, rows) by stem, of the files without an id column: their rows get made ids."""
    return {f.part_stem: (k, f.num_rows) for k, f in enumerate(files) if ID_COLUMN not in f.columns}


def _made_position(row_id: str, made: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """(file index, row) of the row whose made id `<stem>:<row>` is `row_id`, or None."""
    stem, _, row = row_id.rpartition(":")
    if stem not in made or not row.isdigit() or str(int(row)) != row or int(row) >= made[stem][1]:
        return None
    return made[stem][0], int(row)


def _repeats(files: Sequence) -> tuple[dict[str, list[int]], list[int]]:
    """Each repeated id with the job-wide positions of its rows, and each file's first position."""
    starts = list(itertools.accumulate((f.num_rows for f in files), initial=0))
    first: dict[str, int] = {}
    repeated: dict[str, list[int]] = {}
    for f, start in zip(files, starts):
        for offset, ids in _file_ids(f) if ID_COLUMN in f.columns else ():
            for at, row_id in enumerate(ids, start=start + offset):
                if row_id in first:
                    repeated.setdefault(row_id, [first[row_id]]).append(at)
                else:
                    first[row_id] = at
    made = _made_stems(files)
    for row_id, at in first.items() if made else ():
        position = _made_position(row_id, made)
        if position is not None:
            repeated.setdefault(row_id, [at]).append(starts[position[0]] + position[1])
    return repeated, starts


def _refusal(files: Sequence) -> str:
    """The refusal naming the first repeated ids and their rows (the files read again, to find them)."""
    repeated, starts = _repeats(files)

    def place(at: int) -> str:
        k = bisect.bisect_right(starts, at) - 1  # the last file starting at or before `at` (empty ones skipped)
        return f"{str(files[k].path).rsplit('/', 1)[-1]} row {at - starts[k]}"

    def places(ats: list[int]) -> str:
        return ", ".join(place(at) for at in ats[:_SHOWN]) + (f" and {len(ats) - _SHOWN} more" if len(ats) > _SHOWN
                                                             else "")

    shown = "; ".join(f"{i!r} ({places(ats)})" for i, ats in list(repeated.items())[:_SHOWN])
    more = f"; and {len(repeated) - _SHOWN} more" if len(repeated) > _SHOWN else ""
    return (f"{len(repeated)} ids appear on more than one row: {shown}{more}; each row needs its own id: make the "
            f"{ID_COLUMN!r} column unique, or drop it (each row then gets the id <file stem>:<row index>)")


def _file_ids(f):
    """(first row, ids) of each row group of a Parquet file, only its id column read."""
    with open_parquet(f.path) as pf:
        offset = 0
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g, columns=[ID_COLUMN])
            yield offset, row_ids(table, f.part_stem, offset)
            offset += table.num_rows
