"""Output part names are unique and sort in input order for any set of inputs (the parts of a folder read in
name order give the rows in input order), and stay `<stem>.parquet` where those names already do so."""

import random
from pathlib import Path

from pipeline.input.parquet import InputFile, inspect_inputs, part_names, resolve_inputs
from pipeline.input.shards import make_shards
from tests.pipeline.parquet_files import write_parquet


def test_a_glob_over_repeated_stems_gives_parts_in_input_order(tmp_path):
    for where in ("a/p.parquet", "a/p-1.parquet", "b/p.parquet"):
        write_parquet(tmp_path / where, prompt=[where] * 3, id=[f"{where}#{i}" for i in range(3)])
    paths = resolve_inputs(str(tmp_path / "*" / "*.parquet"))
    files = inspect_inputs(paths, "prompt")
    shards = make_shards(files, shard_rows=2)
    names = [s.part_name for s in shards]
    assert len(set(names)) == len(names) and sorted(names) == names
    by_name = sorted(shards, key=lambda s: s.part_name)
    assert [(s.path, s.row_start) for s in by_name] == [(str(p), r) for p in paths for r in (0, 2)]


def test_names_that_already_sort_in_input_order_are_kept(tmp_path):
    paths = [tmp_path / "in" / n for n in ("a.parquet", "b-2.parquet", "b.parquet", "c.x.parquet")]
    assert part_names(paths) == ["a.parquet", "b-2.parquet", "b.parquet", "c.x.parquet"]
    assert part_names([tmp_path / "x.jsonl"], ".jsonl") == ["x.jsonl"]


def test_a_stem_that_a_shard_name_would_sort_around_is_numbered(tmp_path):
    """`x.parquet` < `x.q.parquet`, but x's shards (`x.rows-...`) sort after `x.q.parquet`."""
    names = part_names([tmp_path / "x.parquet", tmp_path / "x.q.parquet"])
    assert names == ["0-x.parquet", "1-x.q.parquet"]
    wide = part_names([tmp_path / f"d{i}" / "p.parquet" for i in range(11)])
    assert wide[0] == "00-p.parquet" and wide[10] == "10-p.parquet"


def test_any_inputs_give_unique_parts_in_input_order():
    """Random stems over the characters that decide the order ('-' < '.' < digits < letters), cut into random
    shards: every part name is unique and name order is shard order. The files are batch files (`.jsonl`) so
    that shards are cut by rows alone, with no file to read."""
    rng = random.Random(0)
    for _ in range(500):
        stems = {rng.choice("ab1") + "".join(rng.choice("ab.-1") for _ in range(rng.randint(0, 3)))
                 for _ in range(rng.randint(1, 6))}
        paths = sorted({Path(f"/d{rng.randint(0, 2)}/{s}.jsonl") for s in stems})
        files = [InputFile(path=p, part_name=n, num_rows=rng.randint(0, 5), columns=(), format="openai")
                 for p, n in zip(paths, part_names(paths, ".jsonl"))]
        names = [s.part_name for s in make_shards(files, shard_rows=rng.randint(1, 3))]
        assert len(set(names)) == len(names), paths
        assert sorted(names) == names, paths
