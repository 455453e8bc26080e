"""Where inputs and outputs live: a local path, or a URI of any filesystem pyarrow understands (`s3://`, `gs://`,
`hdfs://`, `file://`, ...).

A local output folder commits a file by writing a temporary name, fsyncing and renaming. An object store has no
rename: a part is written once under its final key, and only the driver's manifest line makes it count; the
manifest and the job files are small and rewritten whole. A `file://` URI takes the object-store path on the
local disk, which is how that path is tested."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import posixpath
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from engine.errors import one_line
from pipeline.errors import InputError, OutputWriteError

_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def is_uri(location: str | os.PathLike) -> bool:
    return "://" in str(location)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of `uri` and the path within it; a URI pyarrow cannot open is an InputError."""
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as e:
        raise InputError(f"{uri}: not a filesystem URI pyarrow can open ({one_line(e)}); use a local path or "
                         f"s3://, gs://, hdfs://, file:// (with the filesystem's credentials set)") from e


def open_parquet(location: str | os.PathLike) -> pq.ParquetFile:
    """A Parquet file at a local path or URI, opened for its footer and row groups."""
    if is_uri(location):
        fs, path = filesystem(str(location))
        return pq.ParquetFile(fs.open_input_file(path))
    return pq.ParquetFile(location)


def file_identity(location: str | os.PathLike) -> dict:
    """An input file's path, size and mtime: a file replaced or changed in place gets another identity."""
    if is_uri(location):
        fs, path = filesystem(str(location))
        info = fs.get_file_info(path)
        mtime = info.mtime_ns if info.mtime is not None else None
        return {"path": str(location), "bytes": info.size, "mtime_ns": mtime}
    st = os.stat(location)
    return {"path": str(location), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def list_parquet(uri: str, suffix: str = ".parquet") -> list[str]:
    """The input files a URI names: the file itself, or the visible `*<suffix>` in a folder, sorted."""
    if any(c in uri for c in "*?["):
        raise InputError(f"--input {uri}: globs work on local paths only; name the folder that holds the files")
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [uri]
    if info.type != pafs.FileType.Directory:
        raise InputError(f"no input files matched: {uri} does not exist; expected a Parquet file or a folder")
    base = uri.rstrip("/")
    found = sorted(f"{base}/{i.base_name}" for i in fs.get_file_info(pafs.FileSelector(path))
                   if i.type == pafs.FileType.File and i.base_name.endswith(suffix)
                   and not i.base_name.startswith((".", "_")))
    if not found:
        raise InputError(f"no input files matched: folder {uri} holds no *{suffix} files")
    return found


def stem(location: str | os.PathLike) -> str:
    return posixpath.splitext(posixpath.basename(str(location).rstrip("/")))[0]



class Folder:
    """An output folder: local (`Path`) or on a pyarrow filesystem (URI)."""

    def __init__(self, location: str | os.PathLike):
        self.location = str(location)
        self.remote = is_uri(location)
        if self.remote:
            self.fs, self.path = filesystem(self.location)
        else:
            self.fs, self.path = pafs.LocalFileSystem(), str(Path(location))

    def __str__(self) -> str:
        return self.location

    def write_json(self, name: str, record: dict) -> None:
        """`record` as indented JSON in `name`, replaced atomically (see `write_bytes`)."""
        self.write_bytes(name, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())

    def child(self, name: str) -> str:
        """The location of `name` in this folder (a path or a URI, as the folder is)."""
        return f"{self.location.rstrip('/')}/{name}" if self.remote else str(Path(self.location) / name)

    def fs_path(self, name: str) -> str:
        """`name`'s path within the folder's pyarrow filesystem."""
        return self._p(name)

    def _p(self, name: str) -> str:
        return posixpath.join(self.path, name) if self.remote else str(Path(self.path) / name)

    def kind(self) -> str:
        """'missing', 'file' or 'dir'."""
        t = self.fs.get_file_info(self.path).type
        return {pafs.FileType.File: "file", pafs.FileType.Directory: "dir"}.get(t, "missing")

    def entries(self) -> list[tuple[str, bool]]:
        """(name, is_file) of each entry, sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path))
        return sorted((i.base_name, i.type == pafs.FileType.File) for i in infos)

    def size(self, name: str) -> int | None:
        info = self.fs.get_file_info(self._p(name))
        return info.size if info.type == pafs.FileType.File else None

    def read_text(self, name: str) -> str | None:
        try:
            with self.fs.open_input_stream(self._p(name)) as f:
                return f.read().decode()
        except (FileNotFoundError, pa.ArrowException, OSError):
            return None

    def make(self) -> None:
        self.fs.create_dir(self.path, recursive=True)

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(self._p(name))
        except FileNotFoundError:
            pass

    def write_bytes(self, name: str, data: bytes) -> None:
        """Whole-file write that readers see either before or after: tmp + fsync + rename locally, one PUT on
        an object store."""
        with self._writing(name):
            if self.remote:
                with self.fs.open_output_stream(self._p(name)) as f:
                    f.write(data)
                return
            _write_local_atomic(Path(self.path), name, lambda f: f.write(data))

    @contextlib.contextmanager
    def _writing(self, name: str):
        """A full or read-only filesystem becomes an OutputWriteError naming the file and the free space: it is
        no fault of the shard, and retrying it would only redo the work."""
        try:
            yield
        except OSError as e:
            if e.errno not in _NO_ROOM:
                raise
            raise OutputWriteError(f"cannot write {self.child(name)}: {e.strerror}{self._free()}; free space there "
                                   f"(or choose another --output) and rerun the same command: committed shards "
                                   f"are kept") from e

    def _free(self) -> str:
        if self.remote:
            return ""
        try:
            usage = shutil.disk_usage(self.path)
        except OSError:
            return ""
        return f" ({usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB on its filesystem)"

    def write_table(self, name: str, table: pa.Table) -> tuple[int, str]:
        """A Parquet part, written as `write_bytes` does; returns its size in bytes and SHA-256 (of the bytes
        written, so that a later change to the stored file is seen)."""
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        self.write_bytes(name, data)
        return len(data), hashlib.sha256(data).hexdigest()

    def sha256(self, name: str) -> str | None:
        """The SHA-256 of a file's content, or None if it cannot be read."""
        h = hashlib.sha256()
        try:
            with self.fs.open_input_stream(self._p(name)) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except (FileNotFoundError, pa.ArrowException, OSError):
            return None
        return h.hexdigest()

    def append_line(self, name: str, line: str) -> None:
        """Append one line durably. Locally: append + fsync (a torn previous line is terminated first); on an
        object store: the object is rewritten whole."""
        if self.remote:
            old = self.read_text(name) or ""
            self.write_bytes(name, (old + ("" if not old or old.endswith("\n") else "\n") + line).encode())
            return
        with self._writing(name), open(Path(self.path) / name, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())


def temp_name(name: str) -> str:
    return f".{name}.{os.getpid()}.tmp"


def temp_target(name: str) -> str | None:
    """The file a temporary named by `temp_name` was to become, or None if `name` is not such a temporary."""
    m = _TEMP.fullmatch(name)
    return m.group(1) if m else None


_TEMP = re.compile(r"\.(.+)\.\d+\.tmp")


def _write_local_atomic(folder: Path, name: str, write) -> None:
    final, tmp = folder / name, folder / temp_name(name)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (the directory entry itself must reach the disk)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
