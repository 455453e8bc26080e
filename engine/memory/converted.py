"""Layers kept in their stored form in the offload folder, one folder per (checkpoint, dtype, format): the disk
tier's layers, and every compressed layer, converted once. A run with compressed weights writes each layer it
quantized there (a by-product of its first load); every later run and every worker of a job reads the compressed
form from there instead of quantizing the checkpoint again. The files are engine/memory/offload.py's: safetensors
with the format in their metadata, each checked against its completion record (size and SHA-256, the layer's
index, the model's content fingerprint, format and dtype) on every reuse."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from engine.atomic_files import sweep
from engine.checkpoint import CheckpointReader
from engine.kernels.fuse import LAYOUT, fuse_projections
from engine.memory.fingerprint import checkpoint_fingerprint
from engine.memory.offload import layer_path, offload_root, unwritable, write_layer
from engine.quantized.mxfp4_layer import packed_layer

log = logging.getLogger(__name__)


def layer_identity(reader: CheckpointReader, dtype: torch.dtype, codec, offload_dir: str | Path | None,
                   packed_experts: bool = False) -> dict:
    """What the converted layers of this checkpoint in `dtype` and `codec`'s format (None: as loaded) are, MXFP4
    experts kept packed where `packed_experts`: the checkpoint's content fingerprint (engine/memory/fingerprint.py),
    the format and the dtype. It names their folder and is written into each layer's record, which must name it
    again for the layer to be reused."""
    fmt = f"{codec.metadata() if codec else 'plain'}:{LAYOUT}" + (":mxfp4-experts" if packed_experts else "")
    model = checkpoint_fingerprint(reader.dir, offload_root(offload_dir))
    return {"model": model, "format": fmt, "dtype": str(dtype).removeprefix("torch.")}


def layer_folder(identity: dict, offload_dir: str | Path | None) -> Path:
    """The folder of the layers of `identity` under the offload folder (made if missing; ConfigError naming it and
    the fix where it cannot be): a checkpoint whose bytes changed, however its files' names, sizes and times read,
    gets a new folder."""
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    folder = offload_root(offload_dir) / key
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        raise unwritable(folder, e) from None
    sweep(folder, once=True)  # the temporaries of conversions killed before their rename
    return folder


def encode_layer(reader: CheckpointReader, i: int, dtype: torch.dtype, codec, packed_experts: bool = False):
    """Layer i read from the checkpoint in `dtype`, its projections fused (MXFP4 experts kept packed where
    `packed_experts`: engine/quantized/mxfp4_layer.py), then in `codec`'s format: (tensors, metadata or None)."""
    lw = packed_layer(reader, i, dtype) if packed_experts else fuse_projections(reader.layer(i, dtype))
    return codec.encode(lw) if codec else (lw, None)


def read_kept(folder: Path, i: int) -> dict[str, torch.Tensor]:
    """Layer i's kept tensors in memory of their own (not views of a mapping of the file, which a memory limit
    would evict and read again), the file's pages dropped from the page cache once read."""
    from safetensors.torch import load

    with open(layer_path(folder, i), "rb") as f:
        data = f.read()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return load(data)


def keep_layer(folder: Path, i: int, tensors: dict[str, torch.Tensor], meta: dict | None, identity: dict) -> bool:
    """Write layer i's stored form (recorded as layer i of `identity`) for later runs; a failed write (a full
    disk, a read-only folder) is logged and costs only the reuse: the run goes on with the layer it holds."""
    try:
        write_layer(folder, i, tensors, meta, identity)
        return True
    except OSError as e:
        log.warning("could not keep converted layer %d in %s (%s): later runs will convert it again", i, folder, e)
        return False
