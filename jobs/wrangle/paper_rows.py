"""A paper dataset's splits as fm_data_tasks makes its rows (its `data_utils.read_raw_data`): the CSV files read by
pandas (jobs/wrangle/data.py `read_csv_typed`: a year column with a blank reads `2003.0`), joined, and each row
serialized (`serialize_row`) with the dataset's question, and the answer `Yes`/`No` or the imputed value.

Two of the paper's pandas behaviours are reproduced on purpose:
- its pandas (^1.4) returned an inner merge's rows grouped by key, in the order each key first appears, not
  in the left table's order (pandas 2.2 changed this); the split's order, hence which rows `--num-run` keeps
  and which train rows a seed draws, follows the paper's;
- a blank cell is `nan` to the test `str(value) == "nan"`, and becomes `--nan-tok`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from jobs.wrangle.data import Format, WrangleInputError, read_csv_typed, serialize_row
from jobs.wrangle.datasets import Dataset

log = logging.getLogger(__name__)
SPLIT_FILES = {"train": "train.csv", "validation": "valid.csv", "test": "test.csv"}
_SKIP_IN_ROW = ("Unnamed: 0", "text", "col_name", "label_str", "is_clean")


@dataclass(frozen=True)
class PaperRow:
    """One example: its serialized text, the answer the paper appends (`label_str`, with its newline), the
    class the paper balances on, and the value that picks its manual prompt."""

    text: str
    label_str: str
    label: object = None
    key: str | None = None


def prepare(columns: list[str], rows: list[dict], dataset: Dataset, path: Path) -> tuple[list[str], list[dict]]:
    """Drop, then rename, the dataset's columns (DATA2DROPCOLS, DATA2COLREMAP)."""
    missing = [c for c in dataset.drop if c not in columns]
    if missing:
        raise WrangleInputError(f"{path} lacks the column(s) {missing} that the paper drops for {dataset.name}; "
                                f"use the dataset's original files")
    keep = [c for c in columns if c not in dataset.drop]
    names = [dataset.rename.get(c, c) for c in keep]
    return names, [{dataset.rename.get(c, c): r[c] for c in keep} for r in rows]


def grouped_join(left: list[dict], key: str, right: dict[object, list[dict]], where: Path | None = None
                 ) -> list[tuple[dict, dict]]:
    """An inner join of `left` rows with the `right` rows of the same key, in pandas 1.x's order: grouped by
    key, keys in order of first appearance in `left`, rows stable within a key. Rows without a match are
    dropped, as the paper's merge drops them, and counted in a warning."""
    order: dict[object, list[dict]] = {}
    for row in left:
        order.setdefault(row[key], []).append(row)
    unmatched = [k for k in order if k not in right]
    if unmatched:
        log.warning("%s: %d rows have a %s found in no table row (e.g. %r); the paper's merge drops them, and so "
                    "does this job", where, sum(len(order[k]) for k in unmatched), key, unmatched[0])
    return [(row, match) for rows in order.values() for row in rows for match in right.get(row[key], [])]


def _index(rows: list[dict], key: str) -> dict[object, list[dict]]:
    out: dict[object, list[dict]] = {}
    for row in rows:
        out.setdefault(row[key], []).append(row)
    return out


def _yes_no(yes: bool) -> str:
    return "Yes\n" if yes else "No\n"


def _matching(folder: Path, dataset: Dataset, split: Path, fmt: Format) -> list[PaperRow]:
    tables = [prepare(*read_csv_typed(folder / f"table{s}.csv"), dataset, folder / f"table{s}.csv") for s in "AB"]
    (cols_a, rows_a), (cols_b, rows_b) = tables
    labels = read_csv_typed(split)[1]
    for need in ("ltable_id", "rtable_id", "label"):
        if labels and need not in labels[0]:
            raise WrangleInputError(f"{split} lacks the column {need!r}; entity-matching pairs need ltable_id, "
                                    f"rtable_id and label")
    first = [{**p, "_a": a} for p, a in grouped_join(labels, "ltable_id", _index(rows_a, "id"), split)]
    out = []
    for pair, b in grouped_join(first, "rtable_id", _index(rows_b, "id"), split):
        a = pair["_a"]
        side_a = serialize_row([(c, a[c]) for c in cols_a if c != "id"], fmt)
        side_b = serialize_row([(c, b[c]) for c in cols_b if c != "id"], fmt)
        text = f"{dataset.prod_name} A is {side_a}. {dataset.prod_name} B is {side_b}.{dataset.suffix} "
        merged = {**{f"{c}_A": a[c] for c in cols_a}, **{f"{c}_B": b[c] for c in cols_b}}
        key = str(merged.get(dataset.manual_key)) if dataset.manual_key else None
        out.append(PaperRow(text, _yes_no(pair["label"] == 1), pair["label"], key))
    return out


def _imputation(dataset: Dataset, split: Path, fmt: Format) -> list[PaperRow]:
    cols, rows = prepare(*read_csv_typed(split), dataset, split)
    if dataset.impute_col not in cols:
        raise WrangleInputError(f"{split} lacks the imputed column {dataset.impute_col!r}; use the dataset's files")
    shown = [c for c in cols if c not in ("id", dataset.impute_col)]
    return [PaperRow(f"{serialize_row([(c, r[c]) for c in shown], fmt)}{fmt.separator}{dataset.suffix} ",
                     f"{r[dataset.impute_col]}\n") for r in rows]


def _spelling(folder: Path, dataset: Dataset, split: Path, fmt: Format) -> list[PaperRow]:
    """Hospital: one cell per prompt, `Is there a x spelling error in col: value?` (the row is not shown)."""
    table = read_csv_typed(folder / "table.csv")
    cols, rows = prepare(*table, dataset, folder / "table.csv")
    by_position = {i: [r] for i, r in enumerate(rows)}
    out = []
    for i, (label, row) in enumerate(grouped_join(read_csv_typed(split)[1], "row_id", by_position, split)):
        column = label["col_name"]
        if column not in cols:
            raise WrangleInputError(f"{split} row {i}: col_name {column!r} is not a column of table.csv; fix it")
        text = f"Is there a x spelling error in {serialize_row([(column, row[column])], fmt)}{dataset.suffix} "
        out.append(PaperRow(text, _yes_no(label["is_clean"] != 1), label["is_clean"], str(column)))
    return out


def _detection(folder: Path, dataset: Dataset, fmt: Format) -> list[PaperRow]:
    """Adult: the paper's code evaluates table.csv's own rows (each with col_name and is_clean) in every split."""
    cols, rows = prepare(*read_csv_typed(folder / "table.csv"), dataset, folder / "table.csv")
    out = []
    for r in rows:
        whole = serialize_row([(c, r[c]) for c in cols if c not in _SKIP_IN_ROW], fmt)
        column = r["col_name"]
        text = f"{whole}\n\nIs there an error in {serialize_row([(column, r[column])], fmt)}{dataset.suffix} "
        out.append(PaperRow(text, _yes_no(r["is_clean"] != 1), r["is_clean"], str(column)))
    return out


def _schema(dataset: Dataset, split: Path) -> list[PaperRow]:
    _, rows = prepare(*read_csv_typed(split), dataset, split)
    return [PaperRow(f"A is {r['left']}. B is {r['right']}. {dataset.suffix} ", _yes_no(r["label"] != 0),
                     r["label"], str(r["left"])) for r in rows]


def read_split(folder: Path, dataset: Dataset, split: str, fmt: Format) -> list[PaperRow]:
    """The rows of one split (train, validation or test), in the paper's order."""
    path = Path(folder) / SPLIT_FILES[split]
    if not path.is_file():
        raise WrangleInputError(f"{path} is missing: the {split} split of {dataset.name} is needed "
                                f"({'drop --do-test' if split == 'test' else 'pass --do-test'} or add the file)")
    if dataset.task == "entity_matching":
        return _matching(Path(folder), dataset, path, fmt)
    if dataset.task == "data_imputation":
        return _imputation(dataset, path, fmt)
    if dataset.task == "error_detection_spelling":
        return _spelling(Path(folder), dataset, path, fmt)
    if dataset.task == "error_detection":
        read_csv_typed(path)  # the paper's code reads (and requires) the split file, then uses table.csv
        return _detection(Path(folder), dataset, fmt)
    if (Path(folder) / "table.csv").is_file() is False:
        raise WrangleInputError(f"{Path(folder) / 'table.csv'} is missing: the paper's code reads it for "
                                f"{dataset.name}; add it")
    return _schema(dataset, path)
