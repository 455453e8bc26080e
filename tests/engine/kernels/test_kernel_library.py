"""The kernel library is checked against the size and SHA-256 its build recorded before it is loaded: a library
cut short, emptied or replaced is never mapped (a bus error in every run, and the next), but moved aside and built
again, or, where it cannot be built, the PyTorch kernels run with one line saying why. A build killed before its
rename leaves a temporary folder that the next build removes."""

import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest

from engine.kernels import build_folder, compiled

pytestmark = pytest.mark.skipif(compiled.ops() is None, reason="the project's C++ kernels are not built here")


def test_the_built_library_matches_its_record():
    target = compiled.build_dir() / f"{compiled.NAME}.so"
    assert compiled.ops() is not None and build_folder.unsound(target) is None


@pytest.fixture
def library_copy(tmp_path, monkeypatch):
    """The built library and its record copied to a build folder of the test's own, as the loader's target."""
    real = compiled.build_dir()
    folder = tmp_path / "kernels" / real.name
    folder.mkdir(parents=True)
    for name in (f"{compiled.NAME}.so", build_folder.RECORD):
        shutil.copy(real / name, folder / name)
    monkeypatch.setattr(compiled, "build_dir", lambda: folder)
    monkeypatch.delitem(sys.modules, compiled.NAME)
    return folder / f"{compiled.NAME}.so"


def _damage(library, how: str) -> None:
    data = library.read_bytes()
    if how == "truncated":
        library.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        library.write_bytes(b"")
    elif how == "replaced":  # same size, other bytes
        library.write_bytes(data[:-64] + bytes(b ^ 0xFF for b in data[-64:]))
    else:
        (library.parent / build_folder.RECORD).unlink()


DAMAGE = {"truncated": "cut short", "empty": "is 0 bytes", "replaced": "does not match the SHA-256",
          "unrecorded": "has no readable record"}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_library_is_built_again_not_loaded(library_copy, monkeypatch, caplog, how):
    _damage(library_copy, how)
    built = []
    monkeypatch.setattr(compiled, "build", lambda: built.append(library_copy.exists()) or "built again")
    with caplog.at_level(logging.WARNING, logger="engine.kernels.compiled"):
        assert compiled.load(build_if_missing=True) == "built again"
    assert built == [False] and not library_copy.parent.exists()  # moved aside and removed before the build
    assert DAMAGE[how] in caplog.text and "building it again" in caplog.text
    assert not list(library_copy.parent.parent.iterdir())


@pytest.mark.parametrize("how", ["truncated", "empty"])
def test_a_damaged_library_that_is_not_to_be_built_is_refused(library_copy, how):
    _damage(library_copy, how)
    with pytest.raises(compiled.BuildError, match="not built"):
        compiled.load(build_if_missing=False)


@pytest.mark.parametrize("how", ["truncated", "empty"])
def test_a_damaged_library_without_a_compiler_runs_the_pytorch_kernels_with_one_line(library_copy, monkeypatch,
                                                                                     caplog, how):
    _damage(library_copy, how)
    monkeypatch.setattr(compiled, "_loaded", [])
    monkeypatch.delenv("FLEXBATCH_KERNELS", raising=False)
    monkeypatch.setattr(compiled, "compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="engine.kernels.compiled"):
        assert compiled.ops() is None and compiled.ops() is None
    unavailable = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert unavailable == ["the project's C++ kernels are unavailable, the PyTorch kernels run instead: no C++ "
                           "compiler found (install g++, or set CXX)"]


def test_a_damaged_library_crashes_no_process(library_copy):
    """In a process of its own, as a user's run meets it: the library cut short is not mapped (before, a bus
    error killed the process, and every run after it)."""
    _damage(library_copy, "truncated")
    code = ("import sys, logging; from engine.kernels import compiled; "
            f"compiled.build_dir = lambda: __import__('pathlib').Path({str(library_copy.parent)!r}); "
            "compiled.compiler = lambda: None; print(compiled.ops())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "None", (done.returncode, done.stderr[-2000:])
    assert "cut short" in done.stderr and "no C++ compiler found" in done.stderr


def test_folders_of_dead_builds_are_removed(tmp_path):
    key = "0123456789abcdef"
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    dead = tmp_path / f"{key}.tmp{gone.pid}@{host}"
    old_style = tmp_path / f"{key}.tmp{gone.pid}"
    alive = tmp_path / f"{key}.tmp{os.getppid()}@{host}"
    elsewhere = tmp_path / f"{key}.tmp{gone.pid}@another-host"
    old_elsewhere = tmp_path / f"{key}.tmp{gone.pid}@a-third-host"
    half_removed = tmp_path / f"{key}.bad{gone.pid}"
    finished = tmp_path / key
    for folder in (dead, old_style, alive, elsewhere, old_elsewhere, half_removed, finished):
        folder.mkdir()
    os.utime(old_elsewhere, (0, 0))
    build_folder.sweep_dead_builds(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, elsewhere, finished))
