"""How a policy's compression applies to weights and the KV cache.

Weights: every Linear weight [out, in] is kept compressed (a 4-bit QTensor grouped along `in`, row-wise int8,
or bfloat16 for a run computing in float32; norms, biases and embeddings stay as they are); compressed tensors
are what is stored and moved. On its compute device a layer's weights are computed on directly by the compressed
kernels up to the row count their rule names (engine/compression/qlinear.py), else decompressed into one of two
reused buffer sets (the layer computing, the layer being prefetched).
KV cache: `QuantKVCache`, 4-bit groups along the head dimension, read chunk by chunk by CPU attention."""

from __future__ import annotations

import json
import math
import threading

import torch

from engine.checkpoint import LayerWeights
from engine.compression.bf16 import Bf16Weight
from engine.compression.int4 import DEFAULT_CONFIG, QTensor, QuantConfig, dequantize, quantize
from engine.compression.int8 import FORMAT as INT8_FORMAT
from engine.compression.int8 import Int8Weight, dequantize_int8, quantize_int8
from engine.errors import InvalidParamsError
from engine.kernels import bf16_tiles, int4_tiles, int8_tiles
from engine.kernels.bf16_tiles import Bf16Tiles
from engine.kernels.int4_tiles import Int4Tiles
from engine.kernels.int8_tiles import Int8Tiles
from engine.memory.kv_cache import QuantKVCache
from engine.policy import WEIGHT_FORMATS

_PARTS = ("data", "mins", "scales")


ROUTERS = (".gate.weight", "router.weight", "shared_expert_gate.weight")  # a mixture's routers: kept as they are


def is_linear_weight(name: str, t: torch.Tensor) -> bool:
    """Whether a layer tensor is a Linear weight a codec compresses: 2-D, not a norm, not a router (a few rows,
    read by every token, whose rounding would change which experts run)."""
    return t.dim() == 2 and name.endswith(".weight") and "norm" not in name and not name.endswith(ROUTERS)


_INT8_PARTS = ("q8", "q8scales")


class WeightCodec:
    """Encodes a layer to plain tensors + string metadata (what a safetensors file holds) and back, in one of
    WEIGHT_FORMATS: `int4` keeps each Linear weight as a QTensor (data, mins, scales), `int8` as row-wise codes
    and scales (q8, q8scales), `bf16` as a bfloat16 copy (bf16), widened to the compute dtype where it computes."""

    def __init__(self, dtype: torch.dtype, config: QuantConfig = DEFAULT_CONFIG, format: str = "int4"):
        if format not in WEIGHT_FORMATS:
            raise InvalidParamsError(f"weight format {format!r} is invalid: use one of {', '.join(WEIGHT_FORMATS)}")
        self.dtype = dtype
        self.format = format
        self.config = QuantConfig(config.bits, config.group_size, dim=-1)
        self._free: list[dict] = []
        self._lock = threading.Lock()

    def metadata(self) -> dict[str, str]:
        if self.format in ("int8", "bf16"):
            return {"codec": f"flexbatch-weights-{self.format}"}
        return {"codec": "flexbatch-weights-int4", "group_size": str(self.config.group_size)}

    def encode(self, lw: LayerWeights) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        tensors, meta = {}, dict(self.metadata())
        for name, t in lw.items():
            if not is_linear_weight(name, t):
                # a copy: a tensor read from safetensors may share the mapping of its whole file, and keeping it
                # would keep every page read from that file resident (the full-precision weights just compressed)
                tensors[name] = t.clone()
            elif self.format == "bf16":
                tensors[f"{name}.bf16"] = t.to(torch.bfloat16).contiguous()
                meta[name] = "bf16"
            elif self.format == "int8":
                w8 = quantize_int8(t)
                tensors[f"{name}.q8"], tensors[f"{name}.q8scales"] = w8.codes, w8.scales
                meta[name] = INT8_FORMAT
            else:
                qt = quantize(t, self.config)
                for part in _PARTS:
                    tensors[f"{name}.{part}"] = getattr(qt, part).contiguous()
                meta[name] = json.dumps(qt.metadata())
        return tensors, meta

    def split(self, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> tuple[LayerWeights, dict]:
        """A stored layer -> (its plain tensors, {name: QTensor, Int8Weight or Bf16Weight} of its compressed
        weights)."""
        plain, packed = {}, {}
        for name, t in tensors.items():
            if name.endswith(".data"):
                base = name.removesuffix(".data")
                packed[base] = QTensor.from_parts(json.loads(meta[base]), t, tensors[base + ".mins"],
                                                  tensors[base + ".scales"])
            elif name.endswith(".q8"):
                base = name.removesuffix(".q8")
                packed[base] = Int8Weight(t, tensors[base + ".q8scales"])
            elif name.endswith(".bf16"):
                packed[name.removesuffix(".bf16")] = Bf16Weight(t)
            elif not name.endswith((".mins", ".scales", ".q8scales")):
                plain[name] = t
        return plain, packed

    def dense(self, name: str, w, buffers: dict) -> torch.Tensor:
        """The dense weight [out, in] of compressed weight `name`, written into `buffers` (reused). 4-bit codes are
        unpacked into one scratch buffer of the set, as large as its largest weight: a set's weights are
        dequantized one after another, by one thread (the one readying the layer, or the one computing it)."""
        if isinstance(w, Int8Weight):
            return dequantize_int8(w, self.dtype, out=_buffer(buffers, name, w.codes.numel(), self.dtype,
                                                               w.codes.device).view(w.codes.shape))
        if isinstance(w, Bf16Weight):
            return _buffer(buffers, name, w.values.numel(), self.dtype, w.values.device).view(w.shape).copy_(w.values)
        if isinstance(w, Bf16Tiles):
            n, k = w.shape
            return bf16_tiles.dequantize(w, self.dtype, out=_buffer(buffers, name, n * k, self.dtype, w.values.device))
        if isinstance(w, Int8Tiles):
            return int8_tiles.dequantize(w, self.dtype, out=_buffer(buffers, name, w.codes.numel(), self.dtype,
                                                                    w.codes.device))
        if isinstance(w, Int4Tiles):
            n = w.out_features * w.codes.shape[1] * 8
            return int4_tiles.dequantize(w, self.dtype, out=_buffer(buffers, name, n, self.dtype, w.codes.device))
        n = math.prod(w.buffer_shape)
        buf = _buffer(buffers, name, n, self.dtype, w.data.device)
        return dequantize(w, out=buf, scratch=_buffer(buffers, SCRATCH, n, torch.uint8, w.data.device))

    def decode(self, tensors: dict[str, torch.Tensor], meta: dict[str, str], buffers: dict) -> LayerWeights:
        """Dense weights (int4: strided views of W^T buffers) on the tensors' device; `buffers` is reused."""
        plain, packed = self.split(tensors, meta)
        return plain | {name: self.dense(name, w, buffers) for name, w in packed.items()}

    def acquire(self) -> dict:
        with self._lock:
            return self._free.pop() if self._free else {}

    def release(self, buffers: dict) -> None:
        with self._lock:
            self._free.append(buffers)


SCRATCH = "#scratch"  # a buffer set's key of its 4-bit unpacking scratch


def _buffer(buffers: dict, key: str, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    buf = buffers.get(key)
    if buf is None or buf.numel() < n or buf.device != device:
        buf = buffers[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n]


class KVCodec:
    """Makes 4-bit KV caches with KVCache's constructor signature."""

    def __init__(self, config: QuantConfig = DEFAULT_CONFIG):
        self.config = QuantConfig(config.bits, config.group_size, dim=-1)

    def cache(self, num_layers, batch, kv_heads, max_len, head_dim, dtype, alloc=None) -> QuantKVCache:
        return QuantKVCache(num_layers, batch, kv_heads, max_len, head_dim, dtype, alloc=alloc, config=self.config)
