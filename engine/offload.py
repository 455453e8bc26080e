"""The offload folder: where the disk tier lives. Disk-tier tensors made during a run (KV cache, activations)
are scratch files mapped into memory; nothing of them outlives the mapping.

A scratch file is made in a fresh private folder (`mkdtemp`, mode 0700) under the offload folder, opened with
O_CREAT | O_EXCL | O_NOFOLLOW (a name planted in advance, such as a symlink, makes the open fail rather than
write through it), and its name and folder are removed as soon as it is mapped: a killed process leaves
nothing behind, and no other process can reach the file by name."""

from __future__ import annotations

import math
import mmap
import os
import tempfile
from pathlib import Path

import torch

DEFAULT_OFFLOAD_DIR = Path.home() / ".cache" / "flexbatch" / "offload"


def offload_root(offload_dir: str | Path | None) -> Path:
    """The offload folder (made if missing, private to its owner when flexbatch makes it)."""
    root = Path(offload_dir or DEFAULT_OFFLOAD_DIR)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def scratch_tensor(offload_dir: str | Path | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor backed by a shared memory-mapped scratch file under the offload folder."""
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    private = tempfile.mkdtemp(prefix="scratch-", dir=offload_root(offload_dir))
    path = os.path.join(private, "tensor.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.unlink(path)
        os.rmdir(private)
        os.ftruncate(fd, nbytes)
        mapped = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping keeps the file alive until the tensor is freed
    return torch.frombuffer(mapped, dtype=dtype, count=numel).view(shape)
