"""Row ids: every row carries one from input to output, and no two rows of a job share one.

A row's id is its `id` column's value as text where present and not null, else `<file stem>:<row index>`. A job
whose rows would share an id is refused before any model loads (the ids are read from the `id` columns alone):
its output could not be matched back to its input, and `flexbatch verify` would reject it. The fix is to make
the column unique, or to drop it so that every row gets its made id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.errors import InputError
from pipeline.input.utf8 import NotUtf8, column_values
from pipeline.storage import open_parquet

if TYPE_CHECKING:
    from pipeline.input.parquet import InputFile

ID_COLUMN = "id"
_SHOWN = 3  # repeated ids named in the refusal


def row_ids(table: pa.Table, stem: str, offset: int = 0) -> list[str]:
    """One id per row: the `id` column cast to string where present and not null, else `<stem>:<row index>`,
    the index counted from the file's first row (`table` starts at row `offset` of its file). A binary id, or a
    string id whose bytes are not UTF-8 (a row error, `bad_id_rows`), becomes text one to one (see `id_text`),
    so distinct ids stay distinct."""
    made = [f"{stem}:{offset + i}" for i in range(table.num_rows)]
    if ID_COLUMN not in table.column_names:
        return made
    given = column_values(table, ID_COLUMN)
    return [made[i] if v is None or (isinstance(v, NotUtf8) and v.raw is None) else id_text(v)
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


def check_unique_ids(files: Sequence[InputFile]) -> None:
    """Refuse a job in which two rows would get the same id (given ids, or a given id equal to a made one),
    naming the first repeated ids, where they are, and the fix."""
    first: dict[str, tuple[str, int]] = {}  # id -> (file, row) where it first appears
    repeated: dict[str, list[tuple[str, int]]] = {}
    for f in files:
        if ID_COLUMN in f.columns:
            for row, row_id in _file_ids(f):
                if row_id in first:
                    repeated.setdefault(row_id, [first[row_id]]).append((str(f.path), row))
                else:
                    first[row_id] = (str(f.path), row)
    made = {f.part_stem: f for f in files if ID_COLUMN not in f.columns}  # their made ids are distinct among them
    for row_id, where in first.items():
        stem, _, row = row_id.rpartition(":")
        if stem in made and row.isdigit() and str(int(row)) == row and int(row) < made[stem].num_rows:
            repeated.setdefault(row_id, [where]).append((str(made[stem].path), int(row)))
    if repeated:
        shown = "; ".join(f"{i!r} ({_places(places)})" for i, places in list(repeated.items())[:_SHOWN])
        more = f"; and {len(repeated) - _SHOWN} more" if len(repeated) > _SHOWN else ""
        raise InputError(f"{len(repeated)} ids appear on more than one row: {shown}{more}; each row needs its own "
                         f"id: make the {ID_COLUMN!r} column unique, or drop it (each row then gets the id <file "
                         "stem>:<row index>)")


def _file_ids(f: InputFile):
    """(row, id) of each row of a Parquet file, one row group at a time, only its id column read."""
    with open_parquet(f.path) as pf:
        offset = 0
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g, columns=[ID_COLUMN])
            yield from enumerate(row_ids(table, f.part_stem, offset), start=offset)
            offset += table.num_rows


def _places(places: list[tuple[str, int]]) -> str:
    rows = ", ".join(f"{path.rsplit('/', 1)[-1]} row {row}" for path, row in places[:_SHOWN])
    return rows + (f" and {len(places) - _SHOWN} more" if len(places) > _SHOWN else "")
