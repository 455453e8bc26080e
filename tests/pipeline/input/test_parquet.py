import pytest

from pipeline.errors import InputError
from pipeline.input.parquet import inspect_inputs, part_names, read_footer, resolve_inputs
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
