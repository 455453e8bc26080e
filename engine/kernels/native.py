"""The kernel seam: the few operations a backend may implement its own way, everything else being shared.

A backend supplies Linear, rotary positions, a layer's norms and gating, prefill attention, and how a layer's
stored weights become ready to compute (dense tensors, compressed ones computed on directly or dequantized, or the
backend's own packed form). The Policy, the block schedule, placement and the KV caches are the same for every
backend.

    native   PyTorch (the default): F.linear, or oneDNN's reordered weights where the CPU reorders them
             (engine/kernels/onednn_dense.py, chosen by engine/kernels/gemm_choice.py), engine/kernels/rope.py,
             the caches' SDPA, the project's fused norm / RoPE / SiLU kernels on the CPU
             (engine/kernels/layer_ops.py), prefill attention by SDPA or the project's own kernel
             (engine/kernels/prefill_choice.py), and compressed weights through engine/compression/qlinear.py
             (int4 / int8 kernels, or dequantize + GEMM, by the rule of engine/kernels/gemm_choice.py)
    aten     native with every dense Linear through aten's F.linear as loaded (no reordered weights): the
             baseline the reordering is measured against
    ipex     Intel Extension for PyTorch kernels where they beat these (engine/kernels/ipex.py)
    auto     ipex when intel_extension_for_pytorch imports, else native
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from engine import trace
from engine.checkpoint import LayerWeights
from engine.compression.bf16 import Bf16Weight
from engine.compression.int8 import Int8Weight, quantize_int8
from engine.compression.qlinear import QLinear, QWeight, one_call
from engine.kernels import (
    bf16_tiles,
    int4_tiles,
    int8_rows,
    int8_tiles,
    layer_ops,
    mxfp4_linear,
    onednn_dense,
    prefill_choice,
)
from engine.kernels.bf16_tiles import Bf16Tiles
from engine.kernels.gemm_choice import max_rows, packs_dense, packs_shape
from engine.kernels.int4_tiles import Int4Tiles
from engine.kernels.mxfp4_linear import Mxfp4Weight
from engine.kernels.onednn_dense import OnednnWeight
from engine.kernels.rope import apply_rope, cos_sin


class NativeKernels:
    """Plain PyTorch kernels; every backend falls back to these off the CPU or where it has nothing better."""

    name = "native"
    reorders_dense = True  # dense resident weights reordered for oneDNN (gemm_choice.packs_dense)

    def prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                          scale: float | None = None) -> torch.Tensor:
        """Full attention of a prefill over its new K/V (q [B, NH, S, D], k/v [B, KVH, S, D], mask [B, 1, S, S]):
        the project's own kernel or SDPA, by the rule of engine/kernels/prefill_choice.py."""
        return prefill_choice.prefill(q, k, v, mask, scale)

    def linear(self, x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
        with trace.scope(trace.LINEAR):
            return self._linear(x, w, b)

    def _linear(self, x: torch.Tensor, w, b: torch.Tensor | None) -> torch.Tensor:
        if isinstance(w, QLinear):
            return w(x, b)
        if isinstance(w, OnednnWeight):
            return onednn_dense.linear(x, w, b)
        if isinstance(w, Mxfp4Weight):
            return mxfp4_linear.linear(x, w, b)
        if isinstance(w, QWeight):  # kept outside a layer (the int8 head)
            return one_call(w, x.dtype)(x, b)
        return F.linear(x, w, b)

    def rope_tables(self, inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
        """What `rope` needs for one step, from positions [B, S]: cos, sin [B, 1, S, D]."""
        return cos_sin(inv_freq, positions, dtype)

    def rope(self, q: torch.Tensor, k: torch.Tensor, tables) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, NH, S, D], k [B, KVH, S, D] (transposed views of [B, S, H, D]), rotated by position."""
        cos, sin = tables
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def rope_qkv(self, qkv: torch.Tensor, tables, num_heads: int, num_kv_heads: int, head_dim: int):
        """qkv [B, S, (NH + 2 KVH) D] from the fused projection -> q [B, NH, S, D], k, v [B, KVH, S, D], q and k
        rotated by position: in place in qkv (one pass, views returned) where the fused kernel takes it (every
        dimension rotates)."""
        if tables[0].shape[-1] == head_dim:
            fused = layer_ops.fused_rope_qkv(qkv, *tables, num_heads, num_kv_heads, head_dim)
            if fused is not None:
                return fused
        q, k, v = layer_ops.split_heads(qkv, num_heads, num_kv_heads, head_dim)
        return (*self.rope(q, k, tables), v)

    def rms_norm(self, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """h [*, H] float32 -> RMSNorm(h) * weight [*, H] in the weight's dtype."""
        fused = layer_ops.fused_add_rms_norm(h, None, weight, eps, in_place=True)
        return layer_ops.rms_norm(h, weight, eps) if fused is None else fused[1]

    def add_rms_norm(self, h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                     in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add and the next norm: (h + delta in float32, into h when `in_place`; its RMSNorm)."""
        fused = layer_ops.fused_add_rms_norm(h, delta, weight, eps, in_place)
        return layer_ops.add_rms_norm(h, delta, weight, eps, in_place) if fused is None else fused

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [*, 2F] -> silu(gate) * up [*, F]."""
        fused = layer_ops.fused_silu_mul(gate_up)
        return layer_ops.silu_mul(gate_up) if fused is None else fused

    def pack_resident(self, stored: LayerWeights, meta: dict[str, str] | None, codec=None) -> LayerWeights:
        """A layer that stays in CPU memory and only ever computes on the CPU, in the form it is kept in
        (called once at load). Compressed weights become QWeights, 4-bit ones packed for the 4-bit kernel when
        it computes them at some row count (engine/kernels/gemm_choice.py): the project's tiles
        (engine/kernels/int4_tiles.py) replace the stored form (the dense path dequantizes the tiles), aten's
        layout is kept beside it; dense ones are reordered for oneDNN where gemm_choice.packs_dense says
        (engine/kernels/onednn_dense.py). MXFP4 experts kept packed become Mxfp4Weights
        (engine/kernels/mxfp4_linear.py)."""
        stored = mxfp4_linear.gather(stored)
        if codec is None or meta is None:
            return {name: onednn_dense.pack(w) if self.reorders_dense and _packs_dense(w) else w
                    for name, w in stored.items()}
        plain, packed = codec.split(stored, meta)
        return plain | {name: qweight(w, codec.dtype, pack=True) for name, w in packed.items()}

    def pack_head(self, gw: LayerWeights, tied: bool) -> LayerWeights:
        """The global weights, the LM head's reordered for oneDNN where gemm_choice.packs_dense says, as a layer's
        dense weights are (called once at load, for a head computed on the CPU). A head tied to the embeddings stays
        plain: the lookup needs the plain form, and a second copy would cost vocabulary x hidden more memory."""
        w = gw.get("lm_head.weight")
        if tied or not self.reorders_dense or not isinstance(w, torch.Tensor) or w.device.type != "cpu":
            return gw
        return gw | {"lm_head.weight": onednn_dense.pack(w)} if packs_dense(w) else gw

    def ready_in_place(self, stored: LayerWeights, meta, codec, device: str) -> bool:
        """Whether `ready` on `device` only wraps these stored weights (no copy, no dequantization): dense ones, or
        compressed ones packed for a kernel that computes on them at every row count. The weight store readies
        such a layer on the compute thread instead of the prefetcher's, whose Python work would otherwise contend
        with the compute thread's for the interpreter at every op."""
        if codec is None:
            return True
        plain, packed = codec.split(stored, meta)
        return device == "cpu" and not packed and all(w.fast is not None for w in plain.values()
                                                      if isinstance(w, QWeight))

    def ready(self, stored: LayerWeights, meta, codec, device: str,
              buffers: dict | None = None) -> tuple[LayerWeights, dict | None]:
        """A layer's weights on compute `device`, ready for `linear`, and the codec buffers they occupy
        (handed back when the next layer is taken). On the CPU, compressed weights become QLinears (the
        compressed kernel, or a dense copy made in those buffers on first need); elsewhere they are dequantized.
        Part of a layer read later (a routed expert) is readied into its layer's `buffers`, then held by it. MXFP4
        experts kept packed compute as they are (engine/kernels/mxfp4_linear.py)."""
        stored = mxfp4_linear.gather(stored)
        if codec is None:
            return stored, None
        own = buffers is None
        buffers = codec.acquire() if own else buffers
        held = buffers if own else None
        if device != "cpu":
            return codec.decode(stored, meta, buffers), held
        plain, packed = codec.split(stored, meta)
        out = dict(plain)
        for name, w in [*packed.items(), *((n, t) for n, t in plain.items() if isinstance(t, QWeight))]:
            q = w if isinstance(w, QWeight) else qweight(w, codec.dtype, pack=False)
            kept = q.stored if q.stored is not None else q.fast  # a layer in the kernel's tiles alone
            out[name] = QLinear(q, partial(codec.dense, name, kept, buffers), self.dense_gemm(q, codec.dtype))
            if q.fast is None:  # dense at every row count: dequantize now (in the prefetch thread)
                out[name].dense()
        return out, held


    def dense_gemm(self, q: QWeight, dtype: torch.dtype):
        """The GEMM over a QWeight's dense copy: for bfloat16 weights at rest the float32 run's own, oneDNN's where
        this backend reorders that weight (gemm_choice.packs_dense; over the widened weight as it is, which gives
        the reordered weight's values bit for bit), so that those calls equal the uncompressed run's; else
        F.linear."""
        kept = q.stored if q.stored is not None else q.fast
        if isinstance(kept, (Bf16Weight, Bf16Tiles)) and self.reorders_dense and packs_shape(*kept.shape, dtype):
            return onednn_dense.linear_plain
        return F.linear


class AtenKernels(NativeKernels):
    """The native kernels with dense weights kept as loaded: every dense Linear is aten's F.linear."""

    name = "aten"
    reorders_dense = False


def _packs_dense(w) -> bool:
    return isinstance(w, torch.Tensor) and packs_dense(w)


def int8_head(gw: LayerWeights, tied: bool, dtype: torch.dtype) -> LayerWeights:
    """The global weights with the LM head's weight (the embeddings' where tied, which stay as they are for the
    lookup) as a row-wise int8 QWeight under `lm_head.weight` (engine.memory.weight_store.head_in_int8 decides)."""
    w = gw["embed_tokens.weight"] if tied or "lm_head.weight" not in gw else gw["lm_head.weight"]
    return gw | {"lm_head.weight": qweight(quantize_int8(w), dtype, pack=True)}


def qweight(w, dtype: torch.dtype, pack: bool) -> QWeight:
    """A QTensor, Int8Weight or Bf16Weight as a QWeight, packed for its kernel where `pack` (done once, for weights
    kept in memory): int8 in the kernel's tiles (engine/kernels/int8_tiles.py), which replace the stored codes, or
    else computed on its codes as they are (a layer read anew at every step); int4 and bf16 are packed only where
    their kernel computes them at some row count."""
    if isinstance(w, Int8Weight):
        n, k = w.codes.shape
        rows = max_rows("int8", n, k, dtype)
        if pack and int8_rows.available() and w.codes.device.type == "cpu":  # kept in the tiles alone
            return QWeight(None, int8_tiles.pack(w), rows)
        return QWeight(w, int8_rows.pack_fast(w), rows)
    if isinstance(w, Bf16Weight):
        return bf16_qweight(w, dtype, pack)
    n, k = w.shape
    fast = int4_tiles.pack_fast(w) if pack else None
    rows = max_rows("int4", n, k, dtype) if fast is not None else 0
    if rows and isinstance(fast, Int4Tiles):  # kept in the tiles alone: the calls it does not take dequantize them
        return QWeight(None, fast, rows)
    return QWeight(w, fast if rows else None, rows)


def bf16_qweight(w: Bf16Weight, dtype: torch.dtype, pack: bool) -> QWeight:
    """A bfloat16 weight at rest as a QWeight: in the bf16 kernel's tiles alone (engine/kernels/bf16_tiles.py) where
    `pack` and its rule takes float32 calls of some row count on this machine class, else as stored (widened, then
    the dense GEMM, at every row count)."""
    n, k = w.shape
    rows = max_rows("bf16", n, k, dtype) if dtype == torch.float32 and bf16_tiles.available() else 0
    if pack and rows and w.values.device.type == "cpu":
        return QWeight(None, bf16_tiles.pack(w.values), rows)
    return QWeight(w, None, 0)
