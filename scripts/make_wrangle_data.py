"""Write the bundled data of `flexbatch wrangle` (examples/wrangle/), offline and deterministically, from the
demo model's corpus generator (scripts/demo_corpus.py) with the seed the model was trained with:

    python scripts/make_wrangle_data.py --out examples/wrangle --seed 0

- entity_matching/: tableA (canonical product titles), tableB (listings: the same or another product,
  abbreviated, words dropped, lowercased, as `demo_corpus.perturb` writes them), and train/valid/test pairs
  (ltable_id, rtable_id, label), Yes/No balanced. valid and test pairs use only the fifth of the products that
  the model's training never shows; train pairs use the others.
- data_imputation/: cities of the invented `city -> country` table (id, city, country). The model learnt these
  facts; each fact's question in one of four phrasings was held out of training. test holds the cities whose
  held-out phrasing is the `demo` template's ("Q: Where is the city of X? A:"), train the others.
- error_detection/: a product table (id, title, brand, code, type, color) and cells to check (row_id, col_name,
  is_clean): a dirty cell holds another product's value, so it disagrees with the row's title. test cells lie
  in rows of held-out products, train cells in rows of training products.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402

FACTS_PER_RELATION = 48  # as build_tasks makes them for the demo model
PRODUCTS = 300
DEMO_QUESTION = 1  # "Q: Where is the city of {e}? A:", the data_imputation demo template
CHECKED_COLUMNS = ("brand", "code", "type", "color")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("examples/wrangle"))
    p.add_argument("--seed", type=int, default=0, help="the demo model's training seed")
    p.add_argument("--test-pairs", type=int, default=120)
    p.add_argument("--valid-pairs", type=int, default=40)
    p.add_argument("--train-pairs", type=int, default=100)
    p.add_argument("--test-rows", type=int, default=60, help="error_detection: table rows of held-out products")
    p.add_argument("--train-rows", type=int, default=40, help="error_detection: table rows of training products")
    return p.parse_args(argv)


def demo_tables(seed: int):
    """The invented relations and the product table split as the demo model's training split them: the
    same random draws as `demo_corpus.build_tasks(seed)`, checked against it."""
    tasks = demo_corpus.build_tasks(seed, facts_per_relation=FACTS_PER_RELATION)
    rng, taken = random.Random(seed), set()
    relations = demo_corpus._relations(rng, taken, FACTS_PER_RELATION)
    products = demo_corpus._products(rng, taken, PRODUCTS)
    held_out, train = products[: PRODUCTS // 5], products[PRODUCTS // 5:]
    assert train == tasks.train_products and relations == tasks.relations, "demo_corpus draws changed"
    return relations, held_out, train


def write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / f"{name}.parquet")


# ---------------------------------------------------------------- entity matching


def _other(rng: random.Random, products: list, a):
    """A different product, of the same brand 70 % of the time (as `demo_corpus.match_example` picks it)."""
    pool = [p for p in products if p.brand == a.brand and p != a] if rng.random() < 0.7 else []
    return rng.choice(pool or [p for p in products if p != a])


def _pairs(rng, products, n, ids, listings, seen) -> list[dict]:
    """`n` pairs alternating match / no match; each adds its listing (a row of tableB)."""
    out = []
    while len(out) < n:
        same = len(out) % 2 == 0
        a = rng.choice(products)
        b = a if same else _other(rng, products, a)
        text = demo_corpus.perturb(rng, b) if rng.random() < 0.85 else b.title()
        if (a.code, text) in seen:
            continue
        seen.add((a.code, text))
        listings.append({"id": len(listings), "title": text})
        out.append({"ltable_id": ids[a.code], "rtable_id": len(listings) - 1, "label": int(same)})
    return out


def entity_matching(args, held_out, train, folder: Path) -> None:
    rng = random.Random(args.seed + 101)
    products = held_out + train
    ids = {p.code: i for i, p in enumerate(products)}
    listings: list[dict] = []
    seen: set = set()
    splits = {"test": _pairs(rng, held_out, args.test_pairs, ids, listings, seen),
              "valid": _pairs(rng, held_out, args.valid_pairs, ids, listings, seen),
              "train": _pairs(rng, train, args.train_pairs, ids, listings, seen)}
    write(folder, "tableA", [{"id": i, "title": p.title()} for i, p in enumerate(products)])
    write(folder, "tableB", listings)
    for name, rows in splits.items():
        write(folder, name, rows)


# ---------------------------------------------------------------- data imputation


def data_imputation(relations, folder: Path) -> None:
    city = next(r for r in relations if r.name == "city")
    assert city.questions[DEMO_QUESTION] == "Q: Where is the city of {e}? A:"
    rows = [{"id": i, "city": e, "country": v} for i, (e, v) in enumerate(city.facts)]
    write(folder, "test", [r for r, k in zip(rows, city.held_out) if k == DEMO_QUESTION])
    write(folder, "train", [r for r, k in zip(rows, city.held_out) if k != DEMO_QUESTION])


# ---------------------------------------------------------------- error detection


def _row(i: int, p) -> dict:
    return {"id": i, "title": p.title(), "brand": p.brand, "code": p.code, "type": p.kind, "color": p.color}


def _wrong_value(rng: random.Random, column: str, row: dict, products: list) -> str:
    """Another product's value of `column` (a code of the same brand, so that it looks plausible)."""
    if column == "code":
        choices = {p.code for p in products if p.brand == row["brand"]} or {p.code for p in products}
    elif column == "brand":
        choices = {p.brand for p in products}
    elif column == "type":
        choices = set(demo_corpus.PRODUCT_TYPES)
    else:
        choices = set(demo_corpus.PRODUCT_COLORS)
    return rng.choice(sorted(choices - {row[column]}))


def _dirty_rows(rng, products, first_id: int, cells_out: list[dict]) -> list[dict]:
    """One table row per product, two checked cells per row, half of all checked cells (at random) dirty."""
    flags = [k % 2 == 1 for k in range(2 * len(products))]
    rng.shuffle(flags)
    rows = []
    for i, p in enumerate(products, start=first_id):
        row = _row(i, p)
        for column in rng.sample(CHECKED_COLUMNS, 2):
            dirty = flags.pop()
            if dirty:
                row[column] = _wrong_value(rng, column, row, products)
            cells_out.append({"row_id": i, "col_name": column, "is_clean": int(not dirty)})
        rows.append(row)
    return rows


def error_detection(args, held_out, train, folder: Path) -> None:
    rng = random.Random(args.seed + 303)
    test_cells: list[dict] = []
    train_cells: list[dict] = []
    rows = _dirty_rows(rng, held_out[: args.test_rows], 0, test_cells)
    rows += _dirty_rows(rng, rng.sample(train, args.train_rows), len(rows), train_cells)
    write(folder, "table", rows)
    write(folder, "test", test_cells)
    write(folder, "train", train_cells)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    relations, held_out, train = demo_tables(args.seed)
    entity_matching(args, held_out, train, args.out / "entity_matching")
    data_imputation(relations, args.out / "data_imputation")
    error_detection(args, held_out, train, args.out / "error_detection")
    print(f"wrote {args.out}/entity_matching, data_imputation, error_detection")


if __name__ == "__main__":
    main()
