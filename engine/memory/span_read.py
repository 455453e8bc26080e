"""Reading one byte span of a file into a given place in memory, bypassing the page cache where the file allows.

O_DIRECT moves whole 4 KiB blocks into 4 KiB-aligned memory. A span whose destination address and file offset
agree modulo 4 KiB is read straight into place, all but its partial first and last blocks; those blocks, and
spans that do not agree, pass through a small aligned scratch buffer and are copied into place. Where O_DIRECT
is refused (tmpfs) the files are read buffered and their pages dropped after, as `DirectReader` does; where the
caller wants the page cache (`direct` false) they are read buffered and kept."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.memory.disk_read import ALIGN, aligned_empty, aligned_size

SCRATCH_BYTES = 1 << 20  # what one bounced read moves at most


class OpenFiles:
    """The files one layer read touches, each opened once: with O_DIRECT when `direct` and the filesystem takes
    it, else buffered; the scratch buffer for blocks that cannot be read in place is made on first need."""

    def __init__(self, direct: bool):
        self.direct = direct
        self._open: dict[Path, tuple[int, bool]] = {}
        self._scratch: torch.Tensor | None = None

    def fd(self, path: Path) -> tuple[int, bool]:
        """The descriptor of `path` and whether it reads with O_DIRECT."""
        if path not in self._open:
            self._open[path] = _open(path, self.direct)
        return self._open[path]

    def scratch(self) -> torch.Tensor:
        if self._scratch is None:
            self._scratch = aligned_empty(SCRATCH_BYTES)
        return self._scratch

    def __enter__(self) -> OpenFiles:
        return self

    def __exit__(self, *exc) -> None:
        for fd, direct in self._open.values():
            try:
                if self.direct and not direct:  # refused O_DIRECT: do not leave the file in the page cache
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        self._open.clear()


def _open(path: Path, direct: bool) -> tuple[int, bool]:
    if direct:
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC), True
        except OSError:  # e.g. tmpfs
            pass
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False


def read_span(files: OpenFiles, path: Path, offset: int, dest: torch.Tensor) -> int:
    """Fill `dest` (contiguous uint8) with the bytes of `path` from `offset`; returns the bytes read from the
    file, whole blocks counted with O_DIRECT."""
    fd, direct = files.fd(path)
    lo, hi = offset, offset + dest.numel()
    if not direct:
        _pread_exact(fd, dest, lo)
        return hi - lo
    i0, i1 = aligned_size(lo), _down(hi)
    if (dest.data_ptr() - lo) % ALIGN or i0 >= i1:
        return _bounce(fd, lo, hi, dest, files.scratch())
    _pread_exact(fd, dest[i0 - lo : i1 - lo], i0)
    head = _bounce(fd, lo, i0, dest[: i0 - lo], files.scratch()) if lo < i0 else 0
    tail = _bounce(fd, i1, hi, dest[i1 - lo :], files.scratch()) if i1 < hi else 0
    return i1 - i0 + head + tail


def _bounce(fd: int, lo: int, hi: int, dest: torch.Tensor, scratch: torch.Tensor) -> int:
    """Bytes [lo, hi) of the file into `dest` through `scratch`, whole aligned blocks at a time."""
    moved, step = 0, scratch.numel()
    for c0 in range(_down(lo), hi, step):
        c1 = min(c0 + step, aligned_size(hi))
        a, b = max(lo, c0), min(hi, c1)
        got = _pread(fd, scratch[: c1 - c0], c0)  # the file's last block may end early
        if got < b - c0:
            raise OSError(f"read {got} of {b - c0} bytes at offset {c0}: the file is shorter than its header says")
        dest[a - lo : b - lo].copy_(scratch[a - c0 : b - c0])
        moved += c1 - c0
    return moved


def _pread(fd: int, dest: torch.Tensor, offset: int) -> int:
    """Read into `dest` from `offset` until it is full or the file ends; the bytes read."""
    view, done = memoryview(dest.numpy()), 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            break
        done += got
    return done


def _pread_exact(fd: int, dest: torch.Tensor, offset: int) -> None:
    got = _pread(fd, dest, offset)
    if got != dest.numel():
        raise OSError(f"read {got} of {dest.numel()} bytes at offset {offset}: the file is shorter than its header says")


def _down(n: int) -> int:
    return n // ALIGN * ALIGN
