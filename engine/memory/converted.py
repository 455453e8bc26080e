"""Layers kept in their stored form in the offload folder, one folder per (checkpoint, dtype, format): the disk
tier's layers, and every compressed layer, converted once. A run with compressed weights writes each layer it
quantized there (a by-product of its first load); every later run and every worker of a job reads the compressed
form from there instead of quantizing the checkpoint again. The files are engine/memory/offload.py's: safetensors
with the format in their metadata, each checked against its completion record (size and SHA-256) on every
reuse."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from engine.checkpoint import CheckpointReader
from engine.kernels.fuse import LAYOUT, fuse_projections
from engine.memory.offload import layer_path, offload_root, write_layer

log = logging.getLogger(__name__)


def layer_folder(reader: CheckpointReader, dtype: torch.dtype, codec, offload_dir: str | Path | None) -> Path:
    """The folder of this checkpoint's layers in `dtype` and `codec`'s format (None: as loaded) under the offload
    folder (made if missing): the key hashes config.json and the weight files' sizes and mtimes, so a changed
    checkpoint gets a new folder."""
    h = hashlib.sha256()
    h.update((reader.dir / "config.json").read_bytes())
    for f in sorted(reader.dir.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(f"{dtype}:{codec.metadata() if codec else 'plain'}:{LAYOUT}".encode())
    folder = offload_root(offload_dir) / h.hexdigest()[:16]
    folder.mkdir(exist_ok=True)
    return folder


def encode_layer(reader: CheckpointReader, i: int, dtype: torch.dtype, codec):
    """Layer i read from the checkpoint in `dtype`, its projections fused, then in `codec`'s format: (tensors,
    metadata or None)."""
    lw = fuse_projections(reader.layer(i, dtype))
    return codec.encode(lw) if codec else (lw, None)


def read_kept(folder: Path, i: int) -> dict[str, torch.Tensor]:
    """Layer i's kept tensors in memory of their own (not views of a mapping of the file, which a memory limit
    would evict and read again), the file's pages dropped from the page cache once read."""
    from safetensors.torch import load

    with open(layer_path(folder, i), "rb") as f:
        data = f.read()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return load(data)


def keep_layer(folder: Path, i: int, tensors: dict[str, torch.Tensor], meta: dict | None) -> bool:
    """Write layer i's stored form for later runs; a failed write (a full disk, a read-only folder) is logged and
    costs only the reuse: the run goes on with the layer it holds."""
    try:
        write_layer(folder, i, tensors, meta)
        return True
    except OSError as e:
        log.warning("could not keep converted layer %d in %s (%s): later runs will convert it again", i, folder, e)
        return False
