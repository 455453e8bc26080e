"""A weight file's content digest is read once and kept against its inode, size and times; a file rewritten in
place, even with its size and times kept, is hashed again (its change time moved); a torn table costs a rehash."""

import hashlib
import os

from engine.memory import fingerprint


def _counting(monkeypatch):
    hashed = []
    real = fingerprint._hashed
    monkeypatch.setattr(fingerprint, "_hashed", lambda path: hashed.append(path.name) or real(path))
    return hashed


def test_an_unchanged_file_is_not_read_again_and_a_rewritten_one_is(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"x" * 1000)
    b.write_bytes(b"y" * 1000)
    hashed = _counting(monkeypatch)
    first = fingerprint.checkpoint_fingerprint(tmp_path, tmp_path)
    assert sorted(hashed) == ["a.safetensors", "b.safetensors"]
    table = tmp_path / fingerprint.TABLE
    assert list(fingerprint._read(table).values())[0]["sha256"] == hashlib.sha256(b"x" * 1000).hexdigest()
    hashed.clear()
    assert fingerprint.checkpoint_fingerprint(tmp_path, tmp_path) == first and hashed == []
    st = a.stat()
    with open(a, "r+b") as f:
        f.write(b"z")
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and times, new bytes
    assert fingerprint.checkpoint_fingerprint(tmp_path, tmp_path) != first and hashed == ["a.safetensors"]
    table.write_text('{"torn')
    hashed.clear()
    fingerprint.checkpoint_fingerprint(tmp_path, tmp_path)
    assert sorted(hashed) == ["a.safetensors", "b.safetensors"]


def test_config_json_is_part_of_the_fingerprint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "a.safetensors").write_bytes(b"x")
    first = fingerprint.checkpoint_fingerprint(tmp_path, tmp_path)
    (tmp_path / "config.json").write_text('{"rope_theta": 1}')
    assert fingerprint.checkpoint_fingerprint(tmp_path, tmp_path) != first
