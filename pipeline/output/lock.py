"""One writer per output folder: a run holds the folder's lock from its check of the folder to `_SUCCESS`.

A local folder is locked with an exclusive `flock` on `_lock` (its content names the holder: user, host, pid,
start). The kernel drops the lock when the holder dies, however it dies, so a lock is never stale; the file is
removed when the run ends, and one found with a holder in it was left by a run that was killed (logged).

An object store has no locks: the run writes a lease object, `_lease.json` (owner, host, pid, a random token
and a heartbeat time refreshed every LEASE_HEARTBEAT_SECONDS), and checks after LEASE_SETTLE_SECONDS that the
lease still holds its token. Where the filesystem can create a file only if it is absent (a local path reached
by a `file://` URI) the lease is taken that way; on S3, GCS and HDFS through pyarrow it cannot, so two runs
that start within the settle time of each other are told apart only by who wrote last (the other exits). A
lease whose heartbeat is older than LEASE_STALE_SECONDS, or whose holder on this host is dead, is taken over
(logged). A holder paused for longer than that (a stopped VM) can lose its lease: it notices at its next
heartbeat or commit and stops, committing nothing more."""

from __future__ import annotations

import fcntl
import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.errors import OutputFolderError
from pipeline.storage import Folder, is_uri

log = logging.getLogger(__name__)

LOCK_FILE = "_lock"
LEASE_FILE = "_lease.json"
LEASE_HEARTBEAT_SECONDS = 30.0
LEASE_STALE_SECONDS = 300.0
LEASE_SETTLE_SECONDS = 2.0


class OutputLockedError(OutputFolderError):
    """Another run holds the output folder."""


def holder_record() -> dict:
    return {"owner": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "heartbeat": time.time(),
            "token": uuid.uuid4().hex}


def describe(holder: dict | None) -> str:
    if not holder:
        return "another run (it has not written its name yet)"
    return (f"pid {holder.get('pid')} of {holder.get('owner')} on {holder.get('host')}, started "
            f"{holder.get('started')}")


def lock_output(folder: Path | str):
    """The folder's lock, held until `release()`; raises OutputLockedError naming the holder, and
    OutputFolderError where the folder cannot be made or written (under a file, a read-only filesystem)."""
    try:
        return Lease(folder) if is_uri(folder) else FolderLock(Path(folder))
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise OutputFolderError(f"--output {folder}: cannot write there: {e.strerror or e}{where}; choose a folder "
                                f"on a writable filesystem") from e


def _refused(folder, holder: dict | None) -> OutputLockedError:
    return OutputLockedError(f"output folder {folder} is being written by {describe(holder)}; wait for that run to "
                             f"end or stop it, or choose another --output")


class FolderLock:
    """An exclusive flock on `folder/_lock` (the folder is made if missing)."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK_FILE
        folder.mkdir(parents=True, exist_ok=True)
        for _ in range(10):  # the file can be removed by its holder between our open and our flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _parse(os.pread(fd, 4096, 0))
                os.close(fd)
                raise _refused(folder, holder) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)
        else:
            raise OutputLockedError(f"cannot lock {self.path}: it keeps being replaced; is another run starting?")
        self.fd = fd
        earlier = _parse(os.pread(fd, 4096, 0))
        if earlier:
            log.warning("%s names %s, which ended without releasing it (killed?); taking it over", self.path,
                        describe(earlier))
        data = json.dumps(holder_record()).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    def check(self) -> None:
        """Nothing to check: the kernel holds the lock for as long as this process lives."""

    def release(self) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still holding it: a waiting run then finds the file gone
        os.close(self.fd)
        self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except FileNotFoundError:
        return False


def _parse(data: bytes | str | None) -> dict | None:
    try:
        record = json.loads(data or b"")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class Lease:
    """A lease object in an object-store folder, kept alive by a heartbeat thread."""

    def __init__(self, folder: str):
        self.folder, self.where = folder, Folder(folder)
        self.where.make()
        self.lost: str | None = None
        current = _parse(self.where.read_text(LEASE_FILE))
        if current and not _stale(current):
            raise _refused(folder, current)
        if current:
            log.warning("taking over the stale lease of %s in %s (heartbeat %.0f s ago)", describe(current), folder,
                        time.time() - float(current.get("heartbeat") or 0))
            self.where.delete(LEASE_FILE)
        self.record = holder_record()
        if not self._create(json.dumps(self.record).encode()):
            raise _refused(folder, _parse(self.where.read_text(LEASE_FILE)))
        time.sleep(LEASE_SETTLE_SECONDS)
        self._confirm()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="flexbatch-lease", daemon=True)
        self._thread.start()

    def _create(self, data: bytes) -> bool:
        """Create the lease if absent where the filesystem can; elsewhere write it (see the module doc)."""
        if isinstance(self.where.fs, pafs.LocalFileSystem):
            try:
                fd = os.open(self.where.fs_path(LEASE_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        self.where.write_bytes(LEASE_FILE, data)
        return True

    def _confirm(self) -> None:
        current = _parse(self.where.read_text(LEASE_FILE))
        if not current or current.get("token") != self.record["token"]:
            raise _refused(self.folder, current)

    def _beat(self) -> None:
        while not self._stop.wait(LEASE_HEARTBEAT_SECONDS):
            try:
                self._confirm()
                self.record["heartbeat"] = time.time()
                self.where.write_bytes(LEASE_FILE, json.dumps(self.record).encode())
            except OutputLockedError as e:
                self.lost = str(e)
                log.error("lost the lease of %s: %s", self.folder, e)
                return
            except OSError as e:  # a transient store error: try again at the next beat
                log.warning("could not renew the lease of %s: %s", self.folder, e)

    def check(self) -> None:
        """Raise if the lease was lost (taken over while this run was paused): nothing more may be committed."""
        if self.lost:
            raise OutputLockedError(self.lost)

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        current = _parse(self.where.read_text(LEASE_FILE))
        if current and current.get("token") == self.record["token"]:
            self.where.delete(LEASE_FILE)


def _stale(holder: dict) -> bool:
    """A lease whose heartbeat is old, or whose holder on this host is no longer running."""
    if time.time() - float(holder.get("heartbeat") or 0) > LEASE_STALE_SECONDS:
        return True
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, someone else's
            return False
    return False
