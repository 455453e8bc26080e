"""KV cache and activations placed at tensor granularity: each GPU batch's tensors are split along the batch
dimension into row segments on the gpu, cpu and disk tiers.

With CUDA, host segments are pinned. A prefill computed on the GPU stores its new K/V into a host cache on the
`kv` side stream (4-bit caches are quantized on the GPU first, so only the compressed bytes cross): each store
copies into pinned contiguous staging buffers while the GPU computes on, and lands in the strided cache slices
on the host STORES_IN_FLIGHT stores later, or before decode first reads the cache. Decode attention computed on
the GPU over a host cache (without CPU attention) fetches the cache through reused pinned staging on the same
stream (engine/memory/staging.py); activations cross on the `act` stream."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.compression.int4 import QTensor
from engine.kernels.attention import ScoreRule, attend
from engine.kernels.cpu_attention import attention
from engine.kernels.shared_attention import shared_prefix_attention
from engine.memory.offload import scratch_tensor
from engine.memory.streams import synchronize
from engine.memory.tiers import Devices

STORES_IN_FLIGHT = 2  # prefill K/V stores of a GPU batch (one per layer) left copying while the GPU computes


def row_segments(rows: int, fractions: dict[str, float]) -> list[tuple[str, slice]]:
    """Split `rows` into consecutive (tier, slice) segments by fraction, dropping empty ones."""
    out, start, acc = [], 0, 0.0
    for name in ("gpu", "cpu", "disk"):
        acc += fractions[name]
        end = rows if name == "disk" else min(rows, round(acc * rows))
        if end > start:
            out.append((name, slice(start, end)))
        start = max(start, end)
    return out


def alloc(devices: Devices, tier: str, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
    """An uninitialized tensor on `tier` (every slot is written before it is read); a disk tensor is a
    memory-mapped scratch file in the offload folder (engine/memory/offload.py)."""
    numel = 1
    for n in shape:
        numel *= n
    devices.tiers[tier].reserve(numel * torch.empty((), dtype=dtype).element_size(), what)
    if tier == "cpu":
        return devices.host_empty(shape, dtype)
    if tier != "disk":
        return torch.empty(shape, dtype=dtype, device=devices.torch_device(tier))
    return scratch_tensor(devices.offload_dir, shape, dtype)


@dataclass
class PlacedActivations:
    """The hidden states of one GPU batch between layers, [B, S, H] split by rows over tiers, in flat buffers
    reused for every layer and step of a block (pinned on the host with CUDA). From and to a CUDA GPU the
    host parts move on the `act` side stream: a store waits for the compute stream's event, a load is waited
    for by the compute stream, and the host reads a part only after the store that filled it has finished.

    With `carry` (a step's argument, on when a block has one GPU batch left) the hidden states go straight from
    each layer to the next one, crossing only where the compute device changes: no other GPU batch needs the
    room between two layers, so a store and load round trip would only add crossings."""

    devices: Devices
    segments: list[tuple[str, slice]]
    buffers: list[torch.Tensor]
    _stored: object = None  # the event of the last copy on the act stream, until the host waited for it
    h: torch.Tensor | None = None  # the hidden states as stored when they are not copied into buffers
    where: str = "cpu"  # the device `h` is on

    @classmethod
    def create(cls, devices: Devices, fractions: dict[str, float], shape: tuple[int, int, int], dtype):
        segs = row_segments(shape[0], fractions)
        pinned = devices.pin_host or devices.async_moves
        if len(segs) == 1 and segs[0][0] != "disk" and not (segs[0][0] == "cpu" and pinned):
            return cls(devices, segs, [])
        per_row = shape[1] * shape[2]
        bufs = [alloc(devices, t, ((s.stop - s.start) * per_row,), dtype, "activations") for t, s in segs]
        return cls(devices, segs, bufs)

    def store(self, h: torch.Tensor, src: str, carry: bool = False) -> None:
        """Write hidden states [B, S, H] computed on `src` (into the reused buffers when they cross)."""
        if carry or not self.buffers:  # no staging buffer: kept as computed, or moved to one memory tier
            self.h, self.where = (h, src) if carry else (self.devices.move(h, src, self.segments[0][0]),
                                                           self.segments[0][0])
            return
        d, S = self.devices, h.shape[1]
        side = d.async_moves and src == "gpu"
        if side:
            act = d.streams["act"]
            act.wait(d.compute_stream.record())  # h is complete
        else:
            self._host_may_touch()
        for (tier, rows), buf in zip(self.segments, self.buffers):
            home, out = ("cpu" if tier == "disk" else tier), _view(buf, (rows.stop - rows.start, S, h.shape[2]))
            if home == src:
                out.copy_(h[rows])
            elif side and tier == "cpu":
                with act:
                    d.keep_for_current_stream(h)  # the compute stream's allocator must not reuse it yet
                    d.copy_into(out, h[rows], src, home, side=True)
            else:
                d.copy_into(out, h[rows], src, home)
        self._stored = act.record() if side else None
        self.length, self.width = S, h.shape[2]

    def load(self, dst: str, last: bool = False, carry: bool = False) -> torch.Tensor:
        """The hidden states [B, S, H] on compute device `dst`; with `last`, only the last position's [B, H]
        (what the LM head reads), taken before it crosses. `carry` as given to the store that wrote them."""
        if carry or not self.buffers:
            return self.devices.move(self.h[:, -1] if last else self.h, self.where, dst)
        d, cols, parts, queued = self.devices, self.length - 1 if last else slice(0, self.length), [], False
        for (tier, rows), buf in zip(self.segments, self.buffers):
            x = _view(buf, (rows.stop - rows.start, self.length, self.width))[:, cols]
            home = "cpu" if tier == "disk" else tier
            if d.async_moves and dst == "gpu" and tier == "cpu":
                if not queued:
                    d.streams["act"].wait(d.compute_stream.record())  # out's memory is free on the GPU
                out = torch.empty(x.shape, dtype=x.dtype, device=d.torch_device(dst))
                with d.streams["act"]:
                    parts.append(d.copy_into(out, x, home, dst, side=True))  # after the store, in stream order
                queued = True
            else:
                if home == "cpu":
                    self._host_may_touch()
                parts.append(d.move(x, home, dst))
        if queued:  # the host rewrites these buffers only after the loads read them, too
            self._stored = d.streams["act"].record()
            d.compute_stream.wait(self._stored)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def keep_rows(self, rows: list[int]) -> None:
        """Only batch rows `rows` (ascending) go on (each step stores new hidden states: nothing to move; a part's
        view is the leading elements of its flat buffer)."""
        kept = kept_segments(self.segments, rows)
        if self.buffers:
            self.buffers = [buf for (_, _, mine), buf in zip(kept, self.buffers) if mine]
        self.segments = [(tier, seg) for tier, seg, mine in kept if mine]

    def _host_may_touch(self) -> None:
        """The host waits for the last copy on the act stream before it reads or rewrites a host buffer."""
        if self._stored is not None:
            synchronize(self._stored)
            self._stored = None


def _view(buf: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The leading elements of a flat buffer as a contiguous tensor of `shape`."""
    return buf[: torch.Size(shape).numel()].view(shape)


def kept_segments(segments, rows: list[int]) -> list[tuple[str, slice, list[int]]]:
    """For each (tier, rows slice, ...) segment: its tier, its slice among the kept `rows` (ascending) and which of
    its own rows are kept."""
    out, start = [], 0
    for tier, seg, *_ in segments:
        mine = [b - seg.start for b in rows if seg.start <= b < seg.stop]
        out.append((tier, slice(start, start + len(mine)), mine))
        start += len(mine)
    return out


class PlacedKV:
    """The KV cache of one GPU batch, split by rows over tiers (one cache per segment). It does the attention:
    prefill attends over the new K/V on the compute device; decode attends, per segment, where the segment
    lives when `cpu_attention` is on (only q, the new K/V and the output cross), else on the compute device.
    The compute device (where q and the new K/V are) and the phase are arguments of each call."""

    def __init__(self, devices: Devices, segments: list[tuple[str, slice, object]], cpu_attention: bool,
                 prefill_attention=None, prefix=None):
        self.devices = devices
        self.segments = segments
        self.cpu_attention = cpu_attention
        self.prefill_attention = prefill_attention  # a backend's kernel; None: the caches' own (SDPA)
        self.prefix = prefix  # the block's shared prefix (engine/loop/shared_prefix.py), seen by every row
        self._queued: list = []  # prefill stores in flight: (event, [(cache slice, pinned staging)])

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale: float | None = None, *, device: str,
               phase: str, rule: ScoreRule | None = None):
        """Store the new K/V [B, KVH, S, D] computed on `device` at slot `start` and attend q [B, NH, S, D] (scores
        under the score `rule` where given: the caches' and the backend's own kernels, which know none, are
        passed by)."""
        decode = phase == "decode"
        if decode and self._queued:  # prefill's queued stores land before the host reads the cache
            self._land(keep=0)
        if self.prefix is not None:
            return self._attend_with_prefix(layer, q, k_new, v_new, start, mask, scale, device, decode, rule)
        if not decode and self.prefill_attention is not None and rule is None:
            return self._prefill(layer, q, k_new, v_new, start, mask, scale, device)
        if len(self.segments) == 1 and self.segments[0][0] == device and rule is None:
            return self.segments[0][2].attend(layer, q, k_new, v_new, start, mask, scale)
        outs = [self._attend_segment(seg, layer, q, k_new, v_new, start, mask, scale, device, decode, rule)
                for seg in self.segments]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _attend_segment(self, seg, layer, q, k_new, v_new, start, mask, scale, dev: str, decode: bool, rule):
        tier, rows, cache = seg
        home, mv = ("cpu" if tier == "disk" else tier), self.devices.move
        if not decode:  # prefill: every key is new, so attend on the compute device and only store
            self._store(seg, layer, k_new, v_new, start, dev)
            return attend(q[rows], k_new[rows], v_new[rows], mask[rows], scale, rule)
        k_home, v_home = mv(k_new[rows], dev, home), mv(v_new[rows], dev, home)
        where = home if self.cpu_attention else dev
        if where == home and rule is None:
            o = cache.attend(layer, mv(q[rows], dev, home), k_home, v_home, start, mv(mask[rows], dev, home), scale)
            return mv(o, home, dev)
        k_all, v_all = cache.update(layer, k_home, v_home, start)
        if where == home:
            o = attention(mv(q[rows], dev, home), k_all, v_all, mv(mask[rows], dev, home), scale, rule=rule)
            return mv(o, home, dev)
        return attention(q[rows], *self._fetch([k_all, v_all], home, dev), mask[rows], scale, rule=rule)

    def _attend_with_prefix(self, layer, q, k_new, v_new, start, mask, scale, dev: str, decode: bool, rule):
        """Attention over the block's shared prefix and each row's own slots (engine/kernels/shared_attention.py).
        A prefill stores its new K/V and attends over them on the compute device; a decode attends per segment
        where `_attend_segment` would, the prefix's K/V brought there."""
        shared = self.prefix.kv
        if not decode:
            for seg in self.segments:
                self._store(seg, layer, k_new, v_new, start, dev)
            return shared_prefix_attention(q, k_new, v_new, mask, shared(layer, dev), scale, rule=rule)
        outs, mv = [], self.devices.move
        for tier, rows, cache in self.segments:
            home = "cpu" if tier == "disk" else tier
            k_all, v_all = cache.update(layer, mv(k_new[rows], dev, home), mv(v_new[rows], dev, home), start)
            if self.cpu_attention or home == dev:
                o = shared_prefix_attention(mv(q[rows], dev, home), k_all, v_all, mv(mask[rows], dev, home),
                                            shared(layer, home), scale, rule=rule)
                outs.append(mv(o, home, dev))
            else:
                k_all, v_all = self._fetch([k_all, v_all], home, dev)
                outs.append(shared_prefix_attention(q[rows], k_all, v_all, mask[rows], shared(layer, dev), scale,
                                                    rule=rule))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _prefill(self, layer, q, k_new, v_new, start, mask, scale, dev: str):
        """Store each segment's new K/V rows on its tier, then attend over the new K/V on the compute device
        (a prefill's keys are all new)."""
        for seg in self.segments:
            self._store(seg, layer, k_new, v_new, start, dev)
        return self.prefill_attention(q, k_new, v_new, mask, scale)

    def _store(self, seg, layer: int, k_new, v_new, start: int, dev: str) -> None:
        """Store prefill's new K/V rows of one segment on its tier; a 4-bit cache quantizes them on the compute
        device, so only compressed bytes cross. From a CUDA GPU into a pinned host cache the copies (and the
        quantization) queue on the kv stream."""
        tier, rows, cache = seg
        home, d = ("cpu" if tier == "disk" else tier), self.devices
        if dev == home:
            cache.store(layer, k_new[rows], v_new[rows], start)
            return
        if not (d.async_kv_stores and dev == "gpu" and tier == "cpu"):
            cache.store(layer, k_new[rows], v_new[rows], start, copy=lambda dst, src: d.copy_into(dst, src, dev, home))
            return
        kv, pairs = d.streams["kv"], []
        kv.wait(d.compute_stream.record())
        k, v = k_new[rows], v_new[rows]
        with kv:
            d.keep_for_current_stream(k, v)  # the compute stream's allocator must not reuse them yet
            moved = cache.store(layer, k, v, start, copy=lambda dst, src: pairs.append((dst, self._staged(src))))
        d.links.add(dev, home, moved)
        self._queued.append((kv.record(), pairs))
        self._land(keep=STORES_IN_FLIGHT)

    def store_rows(self, layer: int, k_new, v_new, start: int, rows: list[int], dev: str) -> None:
        """Store the new K/V [R, KVH, S, D] of a refill prefill (computed on `dev`) at slots [start, start+S)
        of batch rows `rows` (row i of k_new goes to batch row rows[i]), synchronously."""
        self._land(keep=0)
        d = self.devices
        for i, b in enumerate(rows):
            tier, seg_rows, cache = next(s for s in self.segments if s[1].start <= b < s[1].stop)
            home, r = ("cpu" if tier == "disk" else tier), b - seg_rows.start

            def copy(dst, src, r=r, home=home):
                return d.copy_into(dst[r : r + 1], src, dev, home)

            cache.store(layer, k_new[i : i + 1], v_new[i : i + 1], start, copy=copy)

    def keep_rows(self, rows: list[int]) -> None:
        """Only batch rows `rows` (ascending) go on: each segment keeps its live rows at its front."""
        self._land(keep=0)
        kept = []
        for (tier, seg, mine), (_, _, cache) in zip(kept_segments(self.segments, rows), self.segments):
            if mine:
                cache.keep_rows(mine)
                kept.append((tier, seg, cache))
        self.segments = kept

    def shift_slots(self, first: int, count: int) -> None:
        """Move slots [first, first+count) of every segment's cache to [0, count)."""
        self._land(keep=0)
        for _, _, cache in self.segments:
            cache.shift_slots(first, count)

    def _staged(self, src: torch.Tensor) -> torch.Tensor:
        """A pinned, contiguous host buffer filled from GPU tensor `src` asynchronously (on the current stream):
        a cache slice is strided, and a strided destination would make the copy synchronous. PyTorch's pinned
        allocator reuses such buffers, and not before the copies recorded on them have finished."""
        buf = self.devices.host_empty(src.shape, src.dtype)
        buf.copy_(src, non_blocking=self.devices.has_cuda)
        return buf

    def _land(self, keep: int) -> None:
        """Finish all but the newest `keep` queued stores: wait for each one's copies, then write the staged
        rows into the cache slices on the host."""
        while len(self._queued) > keep:
            event, pairs = self._queued.pop(0)
            synchronize(event)
            for dst, buf in pairs:
                dst.copy_(buf)

    def _fetch(self, tensors: list, home: str, dev: str) -> list:
        """Cache tensors moved to compute device `dev`; a 4-bit one travels compressed."""
        parts = [p for x in tensors for p in _parts(x)]
        d = self.devices
        if d.async_moves and home == "cpu" and dev == "gpu":
            moved = self._fetch_staged(parts, dev)
        else:
            moved = [d.move(p, home, dev) for p in parts]
        out = []
        for x in tensors:
            n = len(_parts(x))
            out.append(replace(x, data=moved[0], mins=moved[1], scales=moved[2]) if n == 3 else moved[0])
            moved = moved[n:]
        return out

    def _fetch_staged(self, parts: list[torch.Tensor], dev: str) -> list[torch.Tensor]:
        """Host tensors copied to the GPU through one set of reused pinned staging buffers, gathered by the host
        (a cache slice up to the current slot is strided: copied as it is, it would go through a pageable
        temporary, synchronously), then copied on the kv stream under one event that the compute stream waits
        for."""
        d, kv = self.devices, self.devices.streams["kv"]
        slot, staged = d.staging.take(parts)  # the host waited for the copies that last read this set
        for buf, p in zip(staged, parts):
            buf.copy_(p)
        kv.wait(d.compute_stream.record())  # the outputs' memory is free on the GPU
        outs = [torch.empty(p.shape, dtype=p.dtype, device=d.torch_device(dev)) for p in parts]
        with kv:
            for out, buf in zip(outs, staged):
                d.copy_into(out, buf, "cpu", dev, side=True)
        ready = kv.record()
        d.staging.read_by(slot, ready)
        d.compute_stream.wait(ready)
        return outs


def _parts(x) -> list[torch.Tensor]:
    """The tensors a cache tensor moves as: a 4-bit one's codes, minimums and scales."""
    return [x.data, x.mins, x.scales] if isinstance(x, QTensor) else [x]
