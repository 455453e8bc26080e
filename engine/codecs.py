"""How a policy's compression applies to weights and the KV cache.

Weights: every Linear weight [out, in] is kept as a 4-bit QTensor grouped along `in` (norms, biases and
embeddings stay as they are); compressed tensors are what is stored and moved, and a layer is decompressed on
its compute device into one of two reused buffer sets (the layer computing, the layer being prefetched).
KV cache: `QuantKVCache`, 4-bit groups along the head dimension, read chunk by chunk by CPU attention."""

from __future__ import annotations

import json
import math
import threading

import torch

from engine.cpu_attention import QuantKVCache
from engine.quant import DEFAULT_CONFIG, PARAM_DTYPE, QTensor, QuantConfig, dequantize, quantize
from engine.weights import LayerWeights

_PARTS = ("data", "mins", "scales")


def is_linear_weight(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.endswith(".weight") and "norm" not in name


class WeightCodec:
    """Encodes a layer to plain tensors + string metadata (what a safetensors file holds) and back."""

    def __init__(self, dtype: torch.dtype, config: QuantConfig = DEFAULT_CONFIG):
        self.dtype = dtype
        self.config = QuantConfig(config.bits, config.group_size, dim=-1)
        self._free: list[dict] = []
        self._lock = threading.Lock()

    def metadata(self) -> dict[str, str]:
        return {"codec": "flexbatch-weights-int4", "group_size": str(self.config.group_size)}

    def encode(self, lw: LayerWeights) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        tensors, meta = {}, dict(self.metadata())
        for name, t in lw.items():
            if not is_linear_weight(name, t):
                tensors[name] = t
                continue
            qt = quantize(t, self.config)
            for part in _PARTS:
                tensors[f"{name}.{part}"] = getattr(qt, part).contiguous()
            meta[name] = json.dumps(qt.metadata())
        return tensors, meta

    def decode(self, tensors: dict[str, torch.Tensor], meta: dict[str, str], buffers: dict) -> LayerWeights:
        """Dense weights (strided views of W^T buffers) on the tensors' device; `buffers` is reused."""
        out: LayerWeights = {}
        for name, t in tensors.items():
            if not name.endswith(".data"):
                if not name.endswith((".mins", ".scales")):
                    out[name] = t
                continue
            base = name.removesuffix(".data")
            qt = QTensor.from_parts(json.loads(meta[base]), t, tensors[base + ".mins"], tensors[base + ".scales"])
            n = math.prod(qt.buffer_shape)
            buf = buffers.get(base)
            if buf is None or buf.numel() < n or buf.device != t.device:
                buf = buffers[base] = torch.empty(n, dtype=self.dtype, device=t.device)
            scratch = buffers.get(base + "#scratch")
            if scratch is None or scratch.numel() < n or scratch.device != t.device:
                scratch = buffers[base + "#scratch"] = torch.empty(n, dtype=torch.uint8, device=t.device)
            out[base] = dequantize(qt, out=buf, scratch=scratch)
        return out

    def acquire(self) -> dict:
        with self._lock:
            return self._free.pop() if self._free else {}

    def release(self, buffers: dict) -> None:
        with self._lock:
            self._free.append(buffers)


class KVCodec:
    """Makes 4-bit KV caches with KVCache's constructor signature."""

    def __init__(self, config: QuantConfig = DEFAULT_CONFIG):
        self.config = QuantConfig(config.bits, config.group_size, dim=-1)

    def cache(self, num_layers, batch, kv_heads, max_len, head_dim, dtype, alloc=None) -> QuantKVCache:
        return QuantKVCache(num_layers, batch, kv_heads, max_len, head_dim, dtype, alloc=alloc, config=self.config)

    def bytes_per_head_slot(self, head_dim: int) -> float:
        """Bytes of one K (or V) head vector of one slot: packed codes plus a min and scale per group."""
        groups = -(-head_dim // self.config.group_size)
        return groups * (self.config.group_size // 2 + 2 * torch.empty((), dtype=PARAM_DTYPE).element_size())
