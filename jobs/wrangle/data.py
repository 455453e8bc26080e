"""Data-wrangling inputs in the layout of fm_data_tasks (Narayan et al., "Can Foundation Models Wrangle Your
Data?"), read into `Example`s: one per pair to match, row to impute or cell to check.

- entity_matching: `tableA`, `tableB` (each with an `id` column) and the splits `train`, `valid`, `test` of
  pairs `ltable_id`, `rtable_id`, `label` (1 = the same entity).
- data_imputation: the splits `train`, `valid`, `test` of one table; the column to impute holds the answer.
- error_detection: `table` and the splits `train`, `valid`, `test` of cells `row_id`, `col_name`, `is_clean`
  (0 = the cell holds an error). `row_id` names the table's `id` value, or its 0-based row index without one.

Every file is `<name>.parquet` or `<name>.csv` (read as strings). `valid` is optional everywhere.

The paper's datasets (`--data-dir`, jobs/wrangle/paper_rows.py) are read here too, as fm_data_tasks reads them:
CSV typed by pandas (`read_csv_typed`). Both modes serialize a row with `serialize_row`, the paper's rule.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from engine.errors import FlexbatchError

TASKS = ("entity_matching", "data_imputation", "error_detection")
SPLITS = ("train", "valid", "test")
SUFFIXES = (".parquet", ".csv")
_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}

Row = tuple[tuple[str, str], ...]  # (column, value) in table order; a missing value is "nan", as in the paper


@dataclass(frozen=True)
class Format:
    """How a row is serialized: the separator of its `attr: value` pairs and the text of a missing value (the
    paper's --sep-tok and --nan-tok)."""

    sep_tok: str = "."
    nan_tok: str = "nan"

    @property
    def separator(self) -> str:
        """What ends a pair before the space: `sep_tok`, after a space unless it is "." (or empty)."""
        return f" {self.sep_tok}" if self.sep_tok and self.sep_tok != "." else self.sep_tok


PAPER_FORMAT = Format()


class WrangleInputError(FlexbatchError):
    """A data-wrangling input is missing, unreadable, or lacks a table, column or value the task needs."""


@dataclass(frozen=True)
class Table:
    name: str
    path: Path
    columns: tuple[str, ...]
    rows: tuple[dict, ...]  # column -> str or None


@dataclass(frozen=True)
class Example:
    """One thing to predict. `rows`: (A, B) for matching, else the one row (without the imputed column);
    `cell`: the (column, value) to check; `gold`: True/False for matching and detection (True = a match, an
    error), the value for imputation; `keys`: columns carried to the predictions to name the source."""

    id: str
    rows: tuple[Row, ...]
    gold: bool | str
    cell: tuple[str, str] | None = None
    keys: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError(f"example {self.id} has no rows")


def check_task(task: str) -> str:
    if task not in TASKS:
        raise WrangleInputError(f"--task {task!r} is unknown: expected one of {', '.join(TASKS)}")
    return task


def find_table(folder: Path, name: str, required: bool = True) -> Path | None:
    """`folder/name.parquet` or `folder/name.csv`; None for a missing optional table."""
    if not folder.is_dir():
        raise WrangleInputError(f"--data {folder} is not a folder; pass the folder that holds the task's tables")
    for suffix in SUFFIXES:
        if (path := folder / f"{name}{suffix}").is_file():
            return path
    if required:
        present = sorted(p.name for p in folder.iterdir() if p.suffix in SUFFIXES)
        raise WrangleInputError(f"table {name!r} is missing from {folder} (it holds {present or 'no tables'}); "
                                f"add {name}.parquet or {name}.csv")
    return None


def read_table(folder: Path, name: str, required: bool = True) -> Table | None:
    """A table as strings (None for a missing value); CSV is converted on read."""
    path = find_table(folder, name, required)
    if path is None:
        return None
    try:
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                columns = tuple(reader.fieldnames or ())
                rows = tuple({c: (r.get(c) or None) for c in columns} for r in reader)
        else:
            data = pq.read_table(path)
            columns = tuple(data.column_names)
            rows = tuple({c: _text(v) for c, v in r.items()} for r in data.to_pylist())
    except (OSError, ValueError, UnicodeDecodeError, csv.Error) as e:
        raise WrangleInputError(f"table {path} cannot be read ({e}); write it as Parquet or UTF-8 CSV") from e
    return Table(name, path, columns, rows)


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_csv_typed(path: Path) -> tuple[list[str], list[dict]]:
    """A CSV file's columns and rows, typed as pandas types them."""
    import pandas as pd  # imported here: only the paper's datasets need it

    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise WrangleInputError(f"{path} is missing: the paper's layout needs it; add it or fix --data-dir") from None
    except (OSError, ValueError) as e:
        raise WrangleInputError(f"{path} cannot be read as CSV ({e}); fix the file") from None
    return [str(c) for c in frame.columns], frame.to_dict("records")


def require_columns(table: Table, columns: tuple[str, ...], hint: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise WrangleInputError(f"table {table.path} lacks the column(s) {', '.join(map(repr, missing))} "
                                f"(it has {list(table.columns)}); {hint}")


def as_bool(value, table: Table, column: str, index: int) -> bool:
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise WrangleInputError(f"table {table.path} row {index}: {column} = {value!r} is not a label; "
                            f"write 1 or 0 (true/false, yes/no)")


def row_of(record: dict, columns: tuple[str, ...], skip: tuple[str, ...] = ("id",)) -> Row:
    return tuple((c, "nan" if record.get(c) is None else record[c].strip()) for c in columns if c not in skip)


def cell(value, fmt: Format) -> str:
    """A value as serialized: a missing one (pandas' `nan`, or "nan" as read here) becomes the format's nan_tok."""
    return fmt.nan_tok if str(value) == "nan" else str(value).strip()


def serialize_row(pairs: Iterable[tuple[str, object]], fmt: Format = PAPER_FORMAT, style: str = "attr") -> str:
    """`name: value` per column, joined by the separator (fm_data_tasks' serialize_row); style "values": the
    values only, joined by spaces."""
    if style == "values":
        return " ".join(cell(value, fmt) for _, value in pairs)
    return f"{fmt.separator} ".join(f"{name}: {cell(value, fmt)}".lstrip() for name, value in pairs)


def load_split(folder: Path, task: str, split: str, impute_column: str | None = None) -> list[Example]:
    """The examples of one split; an empty list for a missing optional `valid` split."""
    check_task(task)
    if split not in SPLITS:
        raise WrangleInputError(f"split {split!r} is unknown: expected one of {', '.join(SPLITS)}")
    pairs = read_table(folder, split, required=split != "valid")
    if pairs is None:
        return []
    if task == "entity_matching":
        return _matching(folder, pairs)
    if task == "data_imputation":
        return _imputation(pairs, impute_column)
    return _detection(folder, pairs)


def _index(table: Table) -> dict[str, dict]:
    require_columns(table, ("id",), "each row needs an id that the pairs refer to")
    return {str(r["id"]).strip(): r for r in table.rows}


def _lookup(index: dict[str, dict], key, table: Table, where: str) -> dict:
    row = index.get(str(key).strip())
    if row is None:
        raise WrangleInputError(f"{where} refers to id {key!r}, which {table.path} does not hold; "
                                f"fix the id or add that row")
    return row


def _matching(folder: Path, pairs: Table) -> list[Example]:
    a, b = read_table(folder, "tableA"), read_table(folder, "tableB")
    index_a, index_b = _index(a), _index(b)
    require_columns(pairs, ("ltable_id", "rtable_id", "label"), "entity-matching pairs need ltable_id, "
                    "rtable_id (ids of tableA and tableB) and label (1 = the same entity)")
    out = []
    for i, p in enumerate(pairs.rows):
        where = f"{pairs.path} row {i}"
        left = _lookup(index_a, p["ltable_id"], a, where)
        right = _lookup(index_b, p["rtable_id"], b, where)
        out.append(Example(f"{pairs.name}:{i}", (row_of(left, a.columns), row_of(right, b.columns)),
                           as_bool(p["label"], pairs, "label", i),
                           keys=(("ltable_id", str(p["ltable_id"])), ("rtable_id", str(p["rtable_id"])))))
    return out


def _imputation(table: Table, column: str | None) -> list[Example]:
    if not column:
        raise WrangleInputError("data_imputation needs the column to impute; pass --impute-column NAME")
    require_columns(table, (column,), "pass --impute-column with one of its columns")
    out = []
    for i, r in enumerate(table.rows):
        if r[column] is None or not r[column].strip():
            raise WrangleInputError(f"table {table.path} row {i}: the column to impute, {column!r}, is empty; "
                                    f"every row needs its true value to be scored")
        rid = r.get("id")
        out.append(Example(f"{table.name}:{i}", (row_of(r, table.columns, ("id", column)),), r[column].strip(),
                           keys=(("row_id", str(rid if rid is not None else i)),)))
    return out


def _detection(folder: Path, cells: Table) -> list[Example]:
    table = read_table(folder, "table")
    require_columns(cells, ("row_id", "col_name", "is_clean"), "error-detection cells need row_id, col_name "
                    "and is_clean (1 = the cell is right, 0 = it holds an error)")
    index = _index(table) if "id" in table.columns else {str(i): r for i, r in enumerate(table.rows)}
    out = []
    for i, c in enumerate(cells.rows):
        record = _lookup(index, c["row_id"], table, f"{cells.path} row {i}")
        column = str(c["col_name"]).strip()
        if column not in table.columns or column == "id":
            raise WrangleInputError(f"{cells.path} row {i}: col_name {column!r} is not a column of {table.path} "
                                    f"(it has {[x for x in table.columns if x != 'id']}); fix col_name")
        row = row_of(record, table.columns)
        out.append(Example(f"{cells.name}:{i}", (row,), not as_bool(c["is_clean"], cells, "is_clean", i),
                           cell=(column, dict(row)[column]),
                           keys=(("row_id", str(c["row_id"])), ("col_name", column))))
    return out
