"""The offload folder: where the disk tier lives. Disk-tier tensors made during a run (activations, a 4-bit KV
cache) are scratch files mapped into memory; nothing of them outlives the mapping. A plain KV cache on disk is
a scratch file read and written with direct I/O instead (engine/memory/disk_kv.py).

A scratch file is made in a fresh private folder (`mkdtemp`, mode 0700) under the offload folder, opened with
O_CREAT | O_EXCL | O_NOFOLLOW (a name planted in advance, such as a symlink, makes the open fail rather than
write through it), and its name and folder are removed as soon as it is mapped: a killed process leaves
nothing behind, and no other process can reach the file by name."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import os
import tempfile
from pathlib import Path

import torch

from engine.atomic_files import sweep, write_atomic
from engine.cache_root import CACHE_ROOT
from engine.errors import ConfigError
from engine.kept_files import INT, TEXT, parse

log = logging.getLogger(__name__)
DEFAULT_OFFLOAD_DIR = CACHE_ROOT / "offload"


def offload_root(offload_dir: str | Path | None) -> Path:
    """The offload folder (made if missing, private to its owner when flexbatch makes it); ConfigError naming it
    and the fix where it cannot be made (a file of that name, a read-only or another user's parent)."""
    root = Path(offload_dir or DEFAULT_OFFLOAD_DIR).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise unwritable(root, e) from None
    return root


def checked_offload_root(offload_dir: str | Path | None) -> Path:
    """The offload folder, made if missing and checked for writing (a file made and removed in it), before any work
    is done: ConfigError naming the folder and the fix where it cannot be written."""
    root = offload_root(offload_dir)
    sweep(root)  # what killed writers left: the weight files' digests (engine/memory/fingerprint.py)
    try:
        fd, name = tempfile.mkstemp(prefix=".write-check-", dir=root)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise unwritable(root, e) from None
    return root


def unwritable(folder: Path, e: OSError) -> ConfigError:
    """The one-line error of an offload folder (or a folder in it) that cannot be made or written."""
    why = "it is a file" if folder.is_file() else e.strerror or e
    return ConfigError(f"the offload folder {folder} cannot be written ({why}); give --offload-dir a "
                       "folder this user may write, or make it writable (it holds disk-tier weights and scratch "
                       "files)")


def scratch_tensor(offload_dir: str | Path | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor backed by a shared memory-mapped scratch file under the offload folder."""
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    fd = scratch_file(offload_dir)
    try:
        os.ftruncate(fd, nbytes)
        mapped = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping keeps the file alive until the tensor is freed
    return torch.frombuffer(mapped, dtype=dtype, count=numel).view(shape)


def scratch_file(offload_dir: str | Path | None, direct: bool = False) -> int:
    """The descriptor of a new, already unlinked scratch file under the offload folder; with `direct`, opened
    with O_DIRECT where the filesystem takes it (tmpfs does not: then buffered)."""
    private = tempfile.mkdtemp(prefix="scratch-", dir=offload_root(offload_dir))
    path = os.path.join(private, "scratch.bin")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | (os.O_DIRECT if direct else 0), 0o600)
        except OSError:
            if not direct:
                raise
            fd = os.open(path, flags, 0o600)
        os.unlink(path)
    finally:
        os.rmdir(private)
    return fd


# Disk-tier layers: one safetensors file per layer, `layer_NNNN.safetensors`, in a folder per (checkpoint,
# dtype, format). Each is written under a temporary name and renamed into place, then its completion record
# `layer_NNNN.json` (size and SHA-256, and what the file holds: the layer's index and the identity of its
# folder, i.e. the model's content fingerprint, format and dtype) is written the same way: a file without a
# record, whose size or SHA-256 differs from it, or whose record names another layer, model, format or dtype
# (a file and its record moved together to the wrong place) is rebuilt. The hash is checked on every reuse (one read of the file at load, not
# kept in the page cache): a same-size change, a flipped bit or a file swapped in, would otherwise compute
# with wrong weights and no error. Which layers a run puts on disk depends on its policy, so each layer stands alone; two
# processes converting the same model at once each write their own temporary and rename the same content.

RECORD_SHAPE = {"bytes": INT, "sha256": TEXT, "layer": INT, "model": TEXT, "format": TEXT, "dtype": TEXT}


def layer_path(folder: Path, i: int) -> Path:
    return folder / f"layer_{i:04d}.safetensors"


def stored_layer(folder: Path, i: int, identity: dict | None = None) -> dict | None:
    """Layer i's metadata if its file is complete and matches its record, and the record names layer i of
    `identity` (the model, format and dtype asked for), else None (it is to be rebuilt)."""
    from safetensors import safe_open

    path, record_path = layer_path(folder, i), folder / f"layer_{i:04d}.json"
    try:
        record, problem = parse(record_path.read_text(), RECORD_SHAPE, "the record")
        if problem:
            log.warning("%s: %s; rebuilding the layer", record_path, problem)
            return None
        asked = {"layer": i, **(identity or {})}
        if wrong := {k: record.get(k) for k, v in asked.items() if record.get(k) != v}:
            log.warning("%s's record names %s, not %s; rebuilding it", path, _named(wrong), _named(asked))
            return None
        if path.stat().st_size != record["bytes"] or _sha256(path) != record["sha256"]:
            log.warning("%s does not match its record %s (size or SHA-256); rebuilding it", path, record_path.name)
            return None
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):  # missing, torn or not safetensors
        return None


def _named(fields: dict) -> str:
    return ", ".join(f"{k} {str(v)[:16]}" for k, v in fields.items())


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # a memory cgroup would charge the pages read
    return digest


def write_layer(folder: Path, i: int, tensors: dict[str, torch.Tensor], metadata: dict | None,
                identity: dict | None = None) -> Path:
    """Write layer i's file and then its completion record (naming layer i of `identity`), each atomically."""
    from safetensors.torch import save

    data = save(tensors, metadata=metadata)
    path = layer_path(folder, i)
    write_atomic(path, data)
    record = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "layer": i, **(identity or {})}
    write_atomic(folder / f"layer_{i:04d}.json", json.dumps(record).encode())
    return path
