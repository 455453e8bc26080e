import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.request import Completion
from pipeline import storage
from pipeline.output.parts import output_table, write_part_atomic
from pipeline.storage import Folder


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
