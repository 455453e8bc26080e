"""Reading disk-tier layer files (safetensors) so that they do not thrash the page cache under memory pressure.

Buffered reads of a model larger than the memory left to the process charge the page cache to it (a cgroup's
page cache counts against its limit), evict the pages that will be needed next, and read every layer twice
(disk to page cache, page cache to the process). `DirectReader` reads a whole layer file with O_DIRECT into one
of a few reused, 4 KiB-aligned buffers and hands out tensors that are views of it; the buffer is reused once the
layer is handed back. Where O_DIRECT is refused (tmpfs), it reads buffered and drops the file's pages after.
When the disk-tier files fit in the memory left, the page cache holds them after the first pass and buffered
reads (safetensors' `load_file`) are faster: `reads_direct` decides."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import torch

from engine.memory.room import memory_room

log = logging.getLogger(__name__)
ALIGN = 4096
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
                      "BOOL": torch.bool}


def memory_room_bytes() -> int:
    """Memory this process may still fill (`engine.memory.room`: MemAvailable or its memory cgroup's room)."""
    return int(memory_room().available_bytes or 0)


def reads_direct(disk_bytes: float, room_bytes: float) -> bool:
    """The rule, for the engine and the planner alike: the disk tier is read with O_DIRECT when its files would
    not stay in the page cache, more than half the memory left to the process (the KV cache, activations and
    staged layers need the rest); else through the page cache, which keeps them after the first pass."""
    return disk_bytes > room_bytes // 2



def aligned_size(n: int) -> int:
    """n rounded up to a multiple of ALIGN (what an O_DIRECT read or write moves)."""
    return -(-n // ALIGN) * ALIGN


def aligned_empty(n: int) -> torch.Tensor:
    """An uninitialized uint8 buffer of n bytes starting on an ALIGN boundary, as O_DIRECT wants."""
    raw = torch.empty(n + ALIGN, dtype=torch.uint8)
    pad = -raw.data_ptr() % ALIGN
    return raw[pad : pad + n]


class DirectReader:
    """Reads safetensors files into reused aligned buffers, bypassing the page cache."""

    def __init__(self):
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.buffers_made = 0
        self.bytes_made = 0  # the buffers' bytes: what the reader holds once every buffer is released

    def buffer(self, n: int) -> torch.Tensor:
        """A free aligned buffer of at least n bytes (made when none is), to `release` once its views are unused."""
        with self._lock:
            for k, buf in enumerate(self._free):
                if buf.numel() >= n:
                    return self._free.pop(k)
        buf = aligned_empty(n)
        self.buffers_made += 1
        self.bytes_made += buf.numel()
        return buf

    def release(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)

    def read(self, path: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The file's tensors (views of one buffer) and that buffer, to `release` once they are no longer used."""
        size = path.stat().st_size
        buf = self.buffer(aligned_size(size))
        _read_into(path, buf, size)
        return _tensors(buf), buf


def _read_into(path: Path, buf: torch.Tensor, size: int) -> None:
    view = memoryview(buf.numpy())
    try:
        fd, direct = os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except OSError:  # e.g. tmpfs: read buffered, then drop the pages
        fd, direct = os.open(path, os.O_RDONLY), False
    try:
        done = 0
        while done < size:
            got = os.preadv(fd, [view[done:]], done)
            if got <= 0:
                raise OSError(f"{path}: read {done} of {size} bytes")
            done += got
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _tensors(buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors image in `buf`: [u64 header length][JSON header][data]."""
    n = int.from_bytes(bytes(buf[:8].tolist()), "little")
    header = json.loads(bytes(buf[8 : 8 + n].numpy()))
    base, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = buf[base + begin : base + end]
        out[name] = raw.view(SAFETENSORS_DTYPES[info["dtype"]]).view(info["shape"])
    return out
