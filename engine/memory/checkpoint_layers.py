"""Disk-tier layers read straight from the checkpoint's own safetensors files, when the form the disk tier would
store is the checkpoint's bytes: no codec and a checkpoint already in the run's dtype, or bfloat16 at rest
(engine/compression/bf16.py) over a bfloat16 checkpoint. An offload copy would then cost a pass writing the whole
model (minutes at 7B, slower still under a memory group's dirty-page limit) to store the same bytes again; other
formats (int4, int8, a dtype change) still convert once into the offload folder (engine/memory/offload.py).

A `LayerPlan` says where each tensor of the stored form comes from (one span of a shard, or several where
projections are fused, engine/kernels/fuse.py, possibly in several shards) and where it lands in one layer
buffer. The stored names, dtypes, shapes and codec metadata are those `fuse_projections` and the codec give for
the layer, worked out on stand-ins one column wide (meta tensors would do, but their first use imports ~70 MiB
of Python, too much under a memory limit), so a layer read here is the layer an offload copy would hold. Each span
lands at its final place (engine/memory/span_read.py), so a fused weight is a view of the buffer with no copy;
small tensors stored in another dtype than the checkpoint's (norms widened to float32) are converted into
place."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint import CheckpointReader
from engine.kernels.fuse import fuse_projections, fused_groups
from engine.memory.disk_read import ALIGN, SAFETENSORS_DTYPES, aligned_empty, aligned_size
from engine.memory.span_read import OpenFiles, read_span

ALIGN_PIECE = 64  # bytes: where a tensor that cannot be read in place starts in the buffer


@dataclass(frozen=True)
class Span:
    """`nbytes` bytes of `dtype` values at `offset` of shard `file` (None: zeros)."""

    file: Path | None
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        return self.nbytes // self.dtype.itemsize


@dataclass(frozen=True)
class Piece:
    """One tensor of the stored layer: its spans concatenated along dim 0, at byte `at` of the layer buffer."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    at: int
    spans: tuple[Span, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Read:
    """`nbytes` of shard `file` from `offset`, read to byte `at` of the layer buffer: spans that follow each other
    both in the file and in the buffer are one read."""

    at: int
    file: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class LayerPlan:
    """How to read one layer: its pieces, the reads that fill them in ascending order of place, the spans that are
    converted (or zeros) into place after, its codec metadata (as the codec's `encode` gives it) and the buffer it
    needs (whole blocks: a read may spill past its last byte)."""

    pieces: tuple[Piece, ...]
    reads: tuple[Read, ...]
    fills: tuple[tuple[int, torch.dtype, Span], ...]
    meta: dict[str, str] | None
    buffer_bytes: int

    @property
    def stored_bytes(self) -> int:
        """The bytes of the stored form, what an offload copy of the layer would hold."""
        return sum(p.nbytes for p in self.pieces)


def checkpoint_plans(reader: CheckpointReader, layers: list[int], dtype: torch.dtype, codec) -> dict[int, LayerPlan]:
    """The plan of each of `layers` that can be read straight from the checkpoint (the others are left out)."""
    if codec is not None and getattr(codec, "format", None) != "bf16":
        return {}
    if getattr(reader, "quant", None) is not None:  # packed GPTQ/AWQ/FP8 parts are no plain weights: converted
        return {}
    headers: dict[Path, dict[str, Span]] = {}
    plans = {}
    for i in layers:
        plan = layer_plan(reader.layer_sources(i), dtype, codec, headers)
        if plan is not None:
            plans[i] = plan
    return plans


def layer_plan(sources: dict[str, tuple[Path, str]], dtype: torch.dtype, codec,
               headers: dict[Path, dict[str, Span]]) -> LayerPlan | None:
    """The plan of a layer whose tensors are at `sources` (name -> (file, key)), or None where its stored form is
    not the checkpoint's bytes. `headers` caches each shard's header."""
    spans = {}
    for name, (f, key) in sources.items():
        if f not in headers:
            headers[f] = tensor_spans(f)
        spans[name] = headers[f].get(key)
    if not spans or any(s is None for s in spans.values()):
        return None
    stand_ins = {n: torch.empty(s.shape[:1] + (1,) * (len(s.shape) - 1), dtype=dtype) for n, s in spans.items()}
    fused = fuse_projections(stand_ins)  # concatenates along dim 0: the other dims are the checkpoint's
    stored, meta = codec.encode(fused) if codec is not None else (fused, None)
    made = {name: _sources(name, fused, spans) for name in stored}
    if not all(made[n] is not None and _kept(t, made[n], dtype) for n, t in stored.items()):
        return None
    pieces, size = _lay_out({n: (t.dtype, tuple(t.shape[:1]) + made[n][0].shape[1:]) for n, t in stored.items()},
                            made)
    return LayerPlan(pieces, *_reads(pieces), meta, aligned_size(size))


def tensor_spans(path: Path) -> dict[str, Span]:
    """Where each tensor of a safetensors file lies: [u64 header length][JSON header][data]. A tensor of a dtype
    not known here, or whose byte range disagrees with its shape, is left out (its layer is then converted)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        dtype, (begin, end), shape = SAFETENSORS_DTYPES.get(info["dtype"]), info["data_offsets"], tuple(info["shape"])
        if dtype is not None and end - begin == math.prod(shape) * dtype.itemsize:
            out[key] = Span(path, 8 + n + begin, end - begin, dtype, shape)
    return out


def _sources(name: str, fused: dict, spans: dict[str, Span]) -> tuple[Span, ...] | None:
    """The spans stored tensor `name` is made of: the checkpoint tensor it keeps (under a codec suffix such as
    `.bf16`), or the projections `fuse_projections` concatenated, zeros standing in for a missing bias as there."""
    base = name if name in fused else name.rsplit(".", 1)[0]
    if base in spans:
        return (spans[base],)
    for group, parts in fused_groups(spans).items():
        for suffix in (".weight", ".bias"):
            if base == group + suffix:
                return tuple(spans.get(p + suffix) or _zeros(spans[p + ".weight"].shape[0], fused[base].dtype)
                             for p in parts)
    return None


def _zeros(numel: int, dtype: torch.dtype) -> Span:
    return Span(None, 0, numel * dtype.itemsize, dtype, (numel,))


def _kept(t: torch.Tensor, spans: tuple[Span, ...], run_dtype: torch.dtype) -> bool:
    """Whether stored tensor `t` (a stand-in one column wide) is its spans' bytes: a weight matrix must be (same
    dtype, and the run's dtype holds every value on the way, as the conversion at store time passes through it);
    a vector (norm, bias) may be converted, it is small."""
    if sum(s.shape[0] if s.shape else 1 for s in spans) != (t.shape[0] if t.dim() else 1):
        return False
    if any(s.shape[1:] != spans[0].shape[1:] for s in spans):  # concatenated along dim 0 only
        return False
    if t.dim() < 2:
        return True
    return all(s.file is not None and s.dtype == t.dtype and _exact_through(s.dtype, run_dtype) for s in spans)


def _exact_through(src: torch.dtype, via: torch.dtype) -> bool:
    """Whether converting `src` values to `via` and back gives them back."""
    wider = {torch.float32: (torch.bfloat16, torch.float16),
             torch.float64: (torch.float32, torch.bfloat16, torch.float16)}
    return src == via or src in wider.get(via, ())


def _lay_out(stored: dict[str, tuple[torch.dtype, tuple[int, ...]]],
             made: dict[str, tuple[Span, ...]]) -> tuple[tuple[Piece, ...], int]:
    """Each stored tensor's (dtype, shape) place in the buffer, in file order: where it can be read in place, at an
    address that agrees with its first span's file offset modulo ALIGN (so O_DIRECT reads it there), else on
    ALIGN_PIECE."""
    order = sorted(stored, key=lambda n: _file_order(made[n]))
    pieces, cursor = [], 0
    for name in order:
        (dtype, shape), spans = stored[name], made[name]
        if _in_place(dtype, spans):
            at = cursor + (spans[0].offset - cursor) % ALIGN
        else:
            at = -(-cursor // ALIGN_PIECE) * ALIGN_PIECE
        pieces.append(Piece(name, dtype, shape, at, spans))
        cursor = at + pieces[-1].nbytes
    return tuple(pieces), cursor


def _file_order(spans: tuple[Span, ...]) -> tuple:
    real = [s for s in spans if s.file is not None]
    return (0, str(real[0].file), real[0].offset) if real else (1, "", 0)


def _in_place(dtype: torch.dtype, spans: tuple[Span, ...]) -> bool:
    """Whether every span can land in place with one placement: same dtype, element-aligned, and each span's file
    offset agreeing modulo ALIGN with where it lands after the spans before it."""
    if any(s.file is None or s.dtype != dtype for s in spans) or spans[0].offset % dtype.itemsize:
        return False
    done = 0
    for s in spans:
        if (s.offset - spans[0].offset - done) % ALIGN:
            return False
        done += s.nbytes
    return True


def _reads(pieces: tuple[Piece, ...]) -> tuple[tuple[Read, ...], tuple[tuple[int, torch.dtype, Span], ...]]:
    """The spans kept as they are, as reads merged where they follow each other in the file and in the buffer, in
    ascending order of place (as `read_span` wants); and the spans converted or zeroed, with their places."""
    reads, fills = [], []
    for p in pieces:
        at = p.at
        for s in p.spans:
            if s.file is not None and s.dtype == p.dtype:
                reads.append(Read(at, s.file, s.offset, s.nbytes))
            else:
                fills.append((at, p.dtype, s))
            at += s.numel * p.dtype.itemsize
    merged: list[Read] = []
    for r in sorted(reads, key=lambda r: r.at):
        last = merged[-1] if merged else None
        if last and last.file == r.file and last.offset + last.nbytes == r.offset and last.at + last.nbytes == r.at:
            merged[-1] = Read(last.at, last.file, last.offset, last.nbytes + r.nbytes)
        else:
            merged.append(r)
    return tuple(merged), tuple(fills)


def read_layer(plan: LayerPlan, buf: torch.Tensor, direct: bool) -> tuple[dict[str, torch.Tensor], int]:
    """The layer's stored tensors, views of `buf` (uint8, at least `plan.buffer_bytes`, ALIGN-aligned), and the
    bytes read from the checkpoint. With `direct`, read with O_DIRECT where the files allow it."""
    nread = 0
    with OpenFiles(direct) as files:
        for r in plan.reads:
            nread += read_span(files, r.file, r.offset, buf, r.at, r.nbytes)
        for at, dtype, span in plan.fills:  # after the reads, which may spill over their places
            nread += _fill(files, buf[at : at + span.numel * dtype.itemsize].view(dtype), span)
    return {p.name: buf[p.at : p.at + p.nbytes].view(p.dtype).view(p.shape) for p in plan.pieces}, nread


def _fill(files: OpenFiles, dest: torch.Tensor, span: Span) -> int:
    """`dest` from a span of another dtype (converted as the store-time conversion does), or zeros."""
    if span.file is None:
        dest.zero_()
        return 0
    head = span.offset % ALIGN
    raw = aligned_empty(aligned_size(head + span.nbytes))
    nread = read_span(files, span.file, span.offset, raw, head, span.nbytes)
    dest.copy_(raw[head : head + span.nbytes].view(span.dtype))
    return nread


def file_plan(path: Path, meta: dict[str, str] | None) -> LayerPlan:
    """The plan of a layer stored as one safetensors file of its own (an offload copy, engine/memory/offload.py):
    each tensor is one span of the file, read in place."""
    spans = tensor_spans(path)
    stored = {name: (s.dtype, s.shape) for name, s in spans.items()}
    pieces, size = _lay_out(stored, {name: (s,) for name, s in spans.items()})
    return LayerPlan(pieces, *_reads(pieces), meta, aligned_size(size))


def sub_plan(plan: LayerPlan, names: set[str]) -> LayerPlan:
    """The plan of the pieces of `plan` named in `names` alone, laid out in a buffer of their own."""
    kept = [p for p in plan.pieces if p.name in names]
    pieces, size = _lay_out({p.name: (p.dtype, p.shape) for p in kept}, {p.name: p.spans for p in kept})
    return LayerPlan(pieces, *_reads(pieces), plan.meta, aligned_size(size))
