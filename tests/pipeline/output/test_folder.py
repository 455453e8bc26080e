import json

import pytest

from pipeline.errors import OutputFolderError
from pipeline.output.folder import JOB_FILE, MANIFEST_FILE, check_output, job_record, open_output
from pipeline.storage import Folder

SHARDS = [{"index": 0, "path": "/in/a.parquet", "part_stem": "a", "row_start": 0, "row_stop": 3,
           "part_name": "a.parquet"}]


def _record(**config):
    return {**job_record({"model": "/m", "params": {"stop": ("x",)}, **config}), "shards": SHARDS}


def _open(folder, record, overwrite=False):
    check = check_output(Folder(folder), record, overwrite)
    open_output(check, record)
    return check


def test_a_missing_folder_is_created_with_a_job_file(tmp_path):
    out = tmp_path / "a" / "out"
    assert _open(out, _record()).action == "create"
    written = json.loads((out / JOB_FILE).read_text())
    assert written["config_hash"] == _record()["config_hash"] and written["shards"] == SHARDS
    assert written["config"]["params"]["stop"] == ["x"]


def test_the_same_job_may_rewrite_its_folder_and_stale_temporaries_go(tmp_path):
    _open(tmp_path, _record())
    (tmp_path / "a.parquet").write_bytes(b"part")
    (tmp_path / ".a.parquet.123.tmp").write_bytes(b"half")
    assert _open(tmp_path, _record()).action == "reuse"
    assert sorted(p.name for p in tmp_path.iterdir()) == [JOB_FILE, "a.parquet"]


def test_another_jobs_folder_is_refused_naming_what_differs(tmp_path):
    _open(tmp_path, _record(dtype="float32"))
    (tmp_path / "a.parquet").write_bytes(b"part")
    with pytest.raises(OutputFolderError, match=r"another job's output .*\['dtype'\].*--overwrite"):
        check_output(Folder(tmp_path), _record(dtype="bfloat16"), overwrite=False)
    assert (tmp_path / "a.parquet").exists()


def test_overwrite_replaces_another_jobs_parts_and_only_those(tmp_path):
    _open(tmp_path, _record(dtype="float32"))
    (tmp_path / "a.parquet").write_bytes(b"part")
    (tmp_path / "b.parquet").write_bytes(b"part")
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"part": "b.parquet"}) + "\n")
    (tmp_path / ".a.parquet.77.tmp").write_bytes(b"half")
    (tmp_path / "mine.parquet").write_bytes(b"the user's")
    (tmp_path / ".mine.parquet.5.tmp").write_bytes(b"the user's")
    check = _open(tmp_path, _record(dtype="bfloat16"), overwrite=True)
    assert check.action == "replace"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mine.parquet.5.tmp", JOB_FILE, "mine.parquet"]
    assert (tmp_path / "mine.parquet").read_bytes() == b"the user's"
    assert json.loads((tmp_path / JOB_FILE).read_text())["config"]["dtype"] == "bfloat16"


def test_overwrite_keeps_a_users_parquet_file_and_logs_it(tmp_path, caplog):
    (tmp_path / "mine.parquet").write_bytes(b"the user's")
    with pytest.raises(OutputFolderError, match=r"did not write \(mine.parquet\).*--overwrite"):
        check_output(Folder(tmp_path), _record(), overwrite=False)
    with caplog.at_level("WARNING"):
        check = _open(tmp_path, _record(), overwrite=True)
    assert check.kept == ("mine.parquet",) and "mine.parquet" in caplog.text
    assert (tmp_path / "mine.parquet").read_bytes() == b"the user's"


def test_a_users_file_named_like_a_part_of_the_job_is_refused_not_replaced(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"the user's")
    with pytest.raises(OutputFolderError, match="holds a.parquet, which flexbatch did not write"):
        _open(tmp_path, _record(), overwrite=True)
    assert (tmp_path / "a.parquet").read_bytes() == b"the user's"


def test_files_flexbatch_did_not_write_are_refused(tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n")
    with pytest.raises(OutputFolderError, match=r"did not write \(results.csv\)"):
        check_output(Folder(tmp_path), _record(), overwrite=False)


def test_an_unknown_file_next_to_our_own_job_is_refused(tmp_path):
    _open(tmp_path, _record())
    (tmp_path / "someone_else.parquet").write_bytes(b"x")
    with pytest.raises(OutputFolderError, match="someone_else.parquet"):
        check_output(Folder(tmp_path), _record(), overwrite=False)


def test_overwrite_keeps_files_and_folders_it_did_not_write(tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "x.parquet").write_bytes(b"x")
    check = _open(tmp_path, _record(), overwrite=True)
    assert check.kept == ("results.csv", "sub", "x.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == [JOB_FILE, "results.csv", "sub", "x.parquet"]
    assert _open(tmp_path, _record()).action == "reuse"  # what --overwrite kept is no longer foreign


def test_a_corrupt_job_file_counts_as_foreign(tmp_path):
    (tmp_path / JOB_FILE).write_text("{not json")
    (tmp_path / "a.parquet").write_bytes(b"x")
    with pytest.raises(OutputFolderError, match="did not write"):
        check_output(Folder(tmp_path), _record(), overwrite=False)


def test_output_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    with pytest.raises(OutputFolderError, match="is a file"):
        check_output(Folder(f), _record(), overwrite=True)


def test_an_empty_folder_is_used_as_is(tmp_path):
    assert check_output(Folder(tmp_path), _record(), overwrite=False).action == "create"
