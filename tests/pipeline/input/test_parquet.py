import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.request import Completion
from pipeline import storage
from pipeline.errors import InputError
from pipeline.input.parquet import (
    inspect_inputs,
    output_table,
    part_names,
    read_footer,
    resolve_inputs,
    write_part_atomic,
)
from pipeline.storage import Folder
from tests.pipeline.parquet_files import write_corrupt, write_parquet


def test_resolve_one_file(tmp_path):
    f = write_parquet(tmp_path / "a.parquet", prompt=["x"])
    assert resolve_inputs(str(f)) == [f.resolve()]


def test_resolve_folder_is_sorted_and_skips_hidden_and_other_files(tmp_path):
    for name in ("b.parquet", "a.parquet", "_meta.parquet", ".x.parquet.1.tmp", "notes.txt"):
        write_parquet(tmp_path / name, prompt=["x"])
    assert [p.name for p in resolve_inputs(tmp_path)] == ["a.parquet", "b.parquet"]


def test_resolve_glob_recursive(tmp_path):
    write_parquet(tmp_path / "d1" / "x.parquet", prompt=["x"])
    write_parquet(tmp_path / "d2" / "x.parquet", prompt=["y"])
    write_parquet(tmp_path / "d2" / "y.csv", prompt=["y"])
    found = resolve_inputs(f"{tmp_path}/**/*.parquet")
    assert [p.parent.name for p in found] == ["d1", "d2"]


@pytest.mark.parametrize("spec", ["missing.parquet", "empty_dir", "*.nothing"])
def test_resolve_no_match_is_an_input_error(tmp_path, spec):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match="no input files matched"):
        resolve_inputs(str(tmp_path / spec))


def test_missing_prompt_column_names_file_and_columns(tmp_path):
    f = write_parquet(tmp_path / "a.parquet", text=["x"], id=[1])
    with pytest.raises(InputError) as e:
        inspect_inputs([f], "prompt")
    message = str(e.value)
    assert str(f) in message and "'prompt'" in message and "['text', 'id']" in message
    assert "--prompt-column" in message


def test_corrupt_file_names_the_file(tmp_path):
    good = write_parquet(tmp_path / "a.parquet", prompt=["x"])
    bad = write_corrupt(tmp_path / "b.parquet")
    with pytest.raises(InputError, match=str(bad)):
        inspect_inputs([good, bad], "prompt")


def test_truncated_file_is_an_input_error(tmp_path):
    f = write_parquet(tmp_path / "a.parquet", prompt=["x"] * 100)
    f.write_bytes(f.read_bytes()[:-20])
    with pytest.raises(InputError, match="not a readable Parquet file"):
        read_footer(f)


def test_input_with_an_output_column_is_refused(tmp_path):
    f = write_parquet(tmp_path / "a.parquet", prompt=["x"], completion=["y"])
    with pytest.raises(InputError, match=r"\['completion'\].*rename or drop"):
        inspect_inputs([f], "prompt")


def test_inspect_reads_row_counts_and_part_names(tmp_path):
    a = write_parquet(tmp_path / "d1" / "x.parquet", prompt=["a", "b"])
    b = write_parquet(tmp_path / "d2" / "x.parquet", prompt=["c"])
    files = inspect_inputs([a, b], "prompt")
    assert [(f.part_name, f.num_rows) for f in files] == [("0-x.parquet", 2), ("1-x.parquet", 1)]
    assert files[1].part_stem == "1-x"


def test_part_names_disambiguate_repeated_stems(tmp_path):
    paths = [tmp_path / d / n for d, n in [("a", "x.parquet"), ("b", "x.parquet"), ("c", "x-1.parquet"), ("d", "x.parquet")]]
    names = part_names(paths)
    assert len(set(names)) == 4 and names == sorted(names) and names[:2] == ["0-x.parquet", "1-x.parquet"]


def _completions(n, logprobs=None):
    return [Completion(id=str(i), text=f"t{i}", prompt_tokens=3, completion_tokens=2, finish_reason="length",
                       token_ids=[5, 6], logprobs=logprobs) for i in range(n)]


def test_output_table_adds_columns_with_types_and_ids_first():
    table = pa.table({"prompt": ["a", "b"], "extra": [1, 2]})
    out = output_table(table, _completions(2), ["f:0", "f:1"], logprobs=False)
    assert out.column_names == ["id", "prompt", "extra", "completion", "prompt_tokens", "completion_tokens",
                                "finish_reason", "error"]
    assert out.schema.field("prompt_tokens").type == pa.int32()
    assert out.schema.field("error").type == pa.string()
    assert out.column("id").to_pylist() == ["f:0", "f:1"]


def test_output_table_casts_an_input_id_column_to_string_in_place():
    table = pa.table({"prompt": ["a", "b"], "id": [7, None]})
    out = output_table(table, _completions(2, logprobs=[-0.5, -1.0]), ["7", "f:1"], logprobs=True)
    assert out.column_names[:2] == ["prompt", "id"]
    assert out.column("id").to_pylist() == ["7", "f:1"]
    assert out.schema.field("logprobs").type == pa.list_(pa.float32())
    assert out.schema.field("token_ids").type == pa.list_(pa.int32())


def test_output_table_refuses_a_row_count_mismatch():
    with pytest.raises(RuntimeError, match="1 completions"):
        output_table(pa.table({"prompt": ["a", "b"]}), _completions(1), ["a", "b"], logprobs=False)


def test_write_part_atomic_leaves_only_the_part(tmp_path):
    write_part_atomic(pa.table({"x": [1, 2]}), Folder(tmp_path), "p.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["p.parquet"]
    assert pq.read_table(tmp_path / "p.parquet").num_rows == 2


def test_failed_write_keeps_the_old_part_and_no_temporary(tmp_path, monkeypatch):
    write_part_atomic(pa.table({"x": [1]}), Folder(tmp_path), "p.parquet")

    def broken_write(table, where, **kwargs):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(storage.pq, "write_table", broken_write)
    with pytest.raises(OSError, match="disk full"):
        write_part_atomic(pa.table({"x": [5, 6, 7]}), Folder(tmp_path), "p.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["p.parquet"]
    assert pq.read_table(tmp_path / "p.parquet").column("x").to_pylist() == [1]
