"""Reading the fm_data_tasks layout (Parquet and CSV), its errors, and the bundled data (no model)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.wrangle.data import WrangleInputError, load_split
from tests.pipeline.parquet_files import write_parquet

REPO = Path(__file__).resolve().parents[3]
BUNDLED = REPO / "examples" / "wrangle"


def write_csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def matching_folder(folder: Path, fmt: str = "parquet") -> Path:
    tables = {
        "tableA": [{"id": 1, "title": "Zorsa Kelcor ZO-679 Desk Lamp Red", "price": "20"},
                   {"id": 2, "title": "Pelpor Vehom PE-802 Desk Lamp Red", "price": ""}],
        "tableB": [{"id": 7, "title": "zorsa kelcor zo-679 desk", "price": "19"}],
        "train": [{"ltable_id": 2, "rtable_id": 7, "label": 0}],
        "test": [{"ltable_id": 1, "rtable_id": 7, "label": 1}, {"ltable_id": 2, "rtable_id": 7, "label": 0}],
    }
    for name, rows in tables.items():
        if fmt == "csv":
            write_csv(folder / f"{name}.csv", rows)
        else:
            columns = {c: [None if r[c] == "" else r[c] for r in rows] for c in rows[0]}
            write_parquet(folder / f"{name}.parquet", **columns)
    return folder


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_entity_matching_pairs_joined_with_their_tables(tmp_path, fmt):
    examples = load_split(matching_folder(tmp_path, fmt), "entity_matching", "test")
    assert [e.gold for e in examples] == [True, False]
    first = examples[0]
    assert first.rows == ((("title", "Zorsa Kelcor ZO-679 Desk Lamp Red"), ("price", "20")),
                          (("title", "zorsa kelcor zo-679 desk"), ("price", "19")))
    assert examples[1].rows[0] == (("title", "Pelpor Vehom PE-802 Desk Lamp Red"), ("price", "nan"))
    assert dict(first.keys) == {"ltable_id": "1", "rtable_id": "7"} and first.id == "test:0"
    assert load_split(tmp_path, "entity_matching", "valid") == []  # optional


def test_imputation_rows_lack_the_imputed_column(tmp_path):
    write_csv(tmp_path / "test.csv", [{"id": "4", "city": "Torwyn", "country": "Yarish"}])
    (example,) = load_split(tmp_path, "data_imputation", "test", "country")
    assert example.rows == ((("city", "Torwyn"),),) and example.gold == "Yarish"


def test_error_detection_cells_by_id_or_by_row_index(tmp_path):
    write_parquet(tmp_path / "table.parquet", title=["Zorsa Kelcor ZO-679 Desk Lamp Red"], code=["ZO-123"])
    write_parquet(tmp_path / "test.parquet", row_id=[0, 0], col_name=["code", "title"], is_clean=[0, 1])
    first, second = load_split(tmp_path, "error_detection", "test")
    assert first.cell == ("code", "ZO-123") and first.gold is True and second.gold is False
    assert first.rows == ((("title", "Zorsa Kelcor ZO-679 Desk Lamp Red"), ("code", "ZO-123")),)
    write_parquet(tmp_path / "table.parquet", id=[9], title=["T"], code=["ZO-123"])
    write_parquet(tmp_path / "test.parquet", row_id=[9], col_name=["code"], is_clean=[1])
    (only,) = load_split(tmp_path, "error_detection", "test")
    assert dict(only.keys) == {"row_id": "9", "col_name": "code"} and only.gold is False


def _error(folder, task, *fragments, split="test", column=None):
    with pytest.raises(WrangleInputError) as info:
        load_split(folder, task, split, column)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_input_errors_name_the_bad_value_and_the_fix(tmp_path):
    folder = matching_folder(tmp_path / "em")
    (folder / "tableB.parquet").unlink()
    _error(folder, "entity_matching", "table 'tableB' is missing", "add tableB.parquet or tableB.csv")
    _error(tmp_path / "nowhere", "entity_matching", "is not a folder")
    _error(folder, "matching", "--task 'matching' is unknown", "entity_matching, data_imputation, error_detection")
    bad = matching_folder(tmp_path / "bad")
    write_parquet(bad / "test.parquet", ltable_id=[1], rtable_id=[7])
    _error(bad, "entity_matching", "lacks the column(s) 'label'", "label (1 = the same entity)")
    write_parquet(bad / "test.parquet", ltable_id=[3], rtable_id=[7], label=[1])
    _error(bad, "entity_matching", "refers to id '3'", "tableA.parquet")
    write_parquet(bad / "test.parquet", ltable_id=[1], rtable_id=[7], label=["maybe"])
    _error(bad, "entity_matching", "label = 'maybe' is not a label", "write 1 or 0")


def test_imputation_and_detection_errors(tmp_path):
    write_parquet(tmp_path / "di" / "test.parquet", city=["Torwyn"], country=["Yarish"])
    _error(tmp_path / "di", "data_imputation", "pass --impute-column NAME")
    _error(tmp_path / "di", "data_imputation", "lacks the column(s) 'capital'", "['city', 'country']",
           column="capital")
    write_parquet(tmp_path / "ed" / "table.parquet", title=["T"])
    write_parquet(tmp_path / "ed" / "test.parquet", row_id=[0], col_name=["code"], is_clean=[1])
    _error(tmp_path / "ed", "error_detection", "col_name 'code' is not a column", "['title']")


def test_bundled_data_is_what_the_generator_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_wrangle_data", REPO / "scripts" / "make_wrangle_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--out", str(tmp_path)])
    bundled = sorted(p.relative_to(BUNDLED) for p in BUNDLED.rglob("*.parquet"))
    assert bundled == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.parquet"))
    for name in bundled:
        assert pq.read_table(BUNDLED / name).equals(pq.read_table(tmp_path / name)), name


def test_bundled_test_rows_are_held_out_of_the_demo_models_training():
    sys.path.insert(0, str(REPO / "scripts"))
    import demo_corpus

    tasks = demo_corpus.build_tasks(0)
    trained = {p.title() for p in tasks.train_products}
    for task in ("entity_matching", "error_detection"):
        examples = load_split(BUNDLED / task, task, "test")
        assert not {dict(e.rows[0])["title"] for e in examples} & trained
    city = next(r for r in tasks.relations if r.name == "city")
    held_out = {e: city.questions[k] for (e, _), k in zip(city.facts, city.held_out)}
    examples = load_split(BUNDLED / "data_imputation", "data_imputation", "test", "country")
    assert len(examples) == 12
    assert all(held_out[dict(e.rows[0])["city"]] == "Q: Where is the city of {e}? A:" for e in examples)
