"""The kernel seam: the few operations a backend may implement its own way, everything else being shared.

A backend supplies Linear, rotary positions, prefill attention, and how a layer's stored weights become
ready to compute (dense tensors, dequantized 4-bit ones, or the backend's own packed form). The Policy, the
block schedule, placement and the KV caches are the same for every backend.

    native   plain PyTorch (the default): F.linear, engine/rope.py, the caches' SDPA, dequantize + GEMM
    ipex     Intel Extension for PyTorch kernels where they beat these (engine/kernels_ipex.py)
    auto     ipex when intel_extension_for_pytorch imports, else native
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.rope import apply_rope, cos_sin
from engine.weights import LayerWeights


class NativeKernels:
    """Plain PyTorch kernels; every backend falls back to these off the CPU or where it has nothing better."""

    name = "native"
    # full attention of a prefill; None leaves it to the KV caches (SDPA), as they do for decode
    prefill_attention = None

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, w, b)

    def rope_tables(self, inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
        """What `rope` needs for one step, from positions [B, S]: cos, sin [B, 1, S, D]."""
        return cos_sin(inv_freq, positions, dtype)

    def rope(self, q: torch.Tensor, k: torch.Tensor, tables) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, NH, S, D], k [B, KVH, S, D] (transposed views of [B, S, H, D]), rotated by position."""
        cos, sin = tables
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def pack_resident(self, stored: LayerWeights, meta: dict[str, str] | None) -> LayerWeights:
        """A layer that stays in CPU memory and only ever computes on the CPU, in the form it is kept in
        (called once at load). Native keeps the stored form."""
        return stored

    def ready(self, stored: LayerWeights, meta, codec, device: str) -> tuple[LayerWeights, dict | None]:
        """A layer's weights on compute `device`, ready for `linear`, and the codec buffers they occupy
        (handed back when the next layer is taken). Compressed weights are dequantized into those buffers."""
        if codec is None:
            return stored, None
        buffers = codec.acquire()
        return codec.decode(stored, meta, buffers), buffers
