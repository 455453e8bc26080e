"""Reading byte spans of files into given places of one buffer, bypassing the page cache where the file allows.

O_DIRECT moves whole 4 KiB blocks into 4 KiB-aligned memory. A span whose place in the buffer agrees with its
file offset modulo 4 KiB is read straight there in one call, its partial first and last blocks included (what
they carry beyond the span lands around it and is put right); a span that does not agree passes through a small
aligned scratch buffer and is copied into place. Where O_DIRECT is refused (tmpfs) the files are read buffered
and their pages dropped after, as `DirectReader` does; where the caller wants the page cache (`direct` false)
they are read buffered and kept."""

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


def read_span(files: OpenFiles, path: Path, offset: int, buf: torch.Tensor, at: int, n: int) -> int:
    """Bytes [offset, offset + n) of `path` into buf[at : at + n] (`buf` uint8, from an ALIGN-aligned address);
    returns the bytes read from the file, whole blocks counted with O_DIRECT.

    With O_DIRECT and `at` agreeing with `offset` modulo ALIGN, one read moves the whole blocks covering the span
    straight into `buf`: the bytes of `buf` before `at` in its first block are kept (saved and put back), those
    after `at + n` up to its last block's end are overwritten. A caller filling one buffer from several spans
    therefore reads them in ascending order of `at`, and fills what no read gives (converted tensors) after."""
    fd, direct = files.fd(path)
    if not direct:
        _pread_exact(fd, buf[at : at + n], offset)
        return n
    head = offset % ALIGN
    if (buf.data_ptr() + at - offset) % ALIGN or at < head or aligned_size(at + n) > buf.numel():
        return _bounce(fd, offset, offset + n, buf[at : at + n], files.scratch())
    blocks = aligned_size(head + n)
    kept = buf[at - head : at].clone()
    got = _pread(fd, buf[at - head : at - head + blocks], offset - head)  # the file's last block may end early
    if got < head + n:
        raise OSError(f"{path}: read {got} of {head + n} bytes at offset {offset - head}: the file is shorter "
                      "than its header says")
    buf[at - head : at].copy_(kept)
    return blocks


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
        raise OSError(f"read {got} of {dest.numel()} bytes at offset {offset}: the file is shorter than its header "
                      "says")


def _down(n: int) -> int:
    return n // ALIGN * ALIGN
