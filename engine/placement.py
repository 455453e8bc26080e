"""KV cache and activations placed at tensor granularity: each GPU batch's tensors are split along the batch
dimension into row segments on the gpu, cpu and disk tiers."""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.attention import attend
from engine.cpu_attention import attention
from engine.quant import QTensor
from engine.tiers import Devices

_file_ids = itertools.count()


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
    memory-mapped file in the offload folder."""
    numel = 1
    for n in shape:
        numel *= n
    devices.tiers[tier].reserve(numel * torch.empty((), dtype=dtype).element_size(), what)
    if tier != "disk":
        return torch.empty(shape, dtype=dtype, device=devices.torch_device(tier))
    folder = Path(devices.offload_dir or tempfile.gettempdir()) / "flexbatch-scratch"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.getpid()}-{next(_file_ids)}.bin"
    t = torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(shape)
    path.unlink()  # the mapping stays valid; nothing is left behind
    return t


@dataclass
class PlacedActivations:
    """The hidden states of one GPU batch between layers, [B, S, H] split by rows over tiers."""

    devices: Devices
    segments: list[tuple[str, slice]]
    buffers: list[torch.Tensor]

    @classmethod
    def create(cls, devices: Devices, fractions: dict[str, float], shape: tuple[int, int, int], dtype):
        segs = row_segments(shape[0], fractions)
        if len(segs) == 1 and segs[0][0] != "disk":
            return cls(devices, segs, [])
        bufs = [alloc(devices, t, (s.stop - s.start, *shape[1:]), dtype, "activations") for t, s in segs]
        return cls(devices, segs, bufs)

    def _whole(self) -> bool:
        return not self.buffers

    def store(self, h: torch.Tensor, src: str) -> None:
        """Write hidden states [B, S, H] computed on `src`."""
        if self._whole():
            self.h = self.devices.move(h, src, self.segments[0][0])  # one memory tier: no staging buffer
            return
        S = h.shape[1]
        for (tier, rows), buf in zip(self.segments, self.buffers):
            part = self.devices.move(h[rows], src, "cpu" if tier == "disk" else tier)
            buf[:, :S].copy_(part)
        self.length = S

    def load(self, dst: str) -> torch.Tensor:
        """The hidden states [B, S, H] on compute device `dst`."""
        if self._whole():
            return self.devices.move(self.h, self.segments[0][0], dst)
        parts = [self.devices.move(buf[:, : self.length], "cpu" if tier == "disk" else tier, dst)
                 for (tier, _), buf in zip(self.segments, self.buffers)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class PlacedKV:
    """The KV cache of one GPU batch, split by rows over tiers (one cache per segment). It does the attention:
    prefill attends over the new K/V on the compute device; decode attends, per segment, where the segment
    lives when `cpu_attention` is on (only q, the new K/V and the output cross), else on the compute device."""

    def __init__(self, devices: Devices, segments: list[tuple[str, slice, object]], cpu_attention: bool,
                 prefill_attention=None):
        self.devices = devices
        self.segments = segments
        self.cpu_attention = cpu_attention
        self.prefill_attention = prefill_attention  # a backend's kernel; None: the caches' own (SDPA)
        self.compute = "cpu"
        self.decode = False

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale: float | None = None):
        if not self.decode and self.prefill_attention is not None:
            return self._prefill(layer, q, k_new, v_new, start, mask, scale)
        if len(self.segments) == 1 and self.segments[0][0] == self.compute:
            return self.segments[0][2].attend(layer, q, k_new, v_new, start, mask, scale)
        outs = [self._attend_segment(seg, layer, q, k_new, v_new, start, mask, scale) for seg in self.segments]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _attend_segment(self, seg, layer, q, k_new, v_new, start, mask, scale):
        tier, rows, cache = seg
        home, dev, mv = ("cpu" if tier == "disk" else tier), self.compute, self.devices.move
        k_home, v_home = mv(k_new[rows], dev, home), mv(v_new[rows], dev, home)
        if not self.decode:  # prefill: every key is new, so attend on the compute device and only store
            cache.update(layer, k_home, v_home, start)
            return attend(q[rows], k_new[rows], v_new[rows], mask[rows], scale)
        where = home if self.cpu_attention else dev
        if where == home:
            o = cache.attend(layer, mv(q[rows], dev, home), k_home, v_home, start, mv(mask[rows], dev, home), scale)
            return mv(o, home, dev)
        k_all, v_all = cache.update(layer, k_home, v_home, start)
        return attention(q[rows], self._fetch(k_all, home), self._fetch(v_all, home), mask[rows], scale)

    def _prefill(self, layer, q, k_new, v_new, start, mask, scale):
        """Store each segment's new K/V rows on its tier, then attend over the new K/V on the compute device
        (a prefill's keys are all new)."""
        for tier, rows, cache in self.segments:
            home, mv = ("cpu" if tier == "disk" else tier), self.devices.move
            cache.update(layer, mv(k_new[rows], self.compute, home), mv(v_new[rows], self.compute, home), start)
        return self.prefill_attention(q, k_new, v_new, mask, scale)

    def _fetch(self, x, home: str):
        """A cache tensor moved to the compute device; a 4-bit one travels compressed."""
        if isinstance(x, QTensor):
            mv = self.devices.move
            return replace(x, data=mv(x.data, home, self.compute), mins=mv(x.mins, home, self.compute),
                           scales=mv(x.scales, home, self.compute))
        return self.devices.move(x, home, self.compute)
