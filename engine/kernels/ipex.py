"""The `ipex` kernel backend: Intel Extension for PyTorch (IPEX 2.8, which needs torch 2.8) where its kernels beat
the native ones on the CPU, the native kernels everywhere else. Imported only when the backend is chosen.

What it replaces, on the CPU only (see `IpexKernels`):
  - 4-bit weights, where IPEX has its optimized int4 kernel (`int4_gemm_available`): its weight-only-quantized
    GEMM reads our group-wise codes directly (converted once, exactly, by `pack_int4`) instead of dequantizing
    the layer and running a dense GEMM;
  - dense weights of layers that stay in CPU memory: packed once into oneDNN's blocked layout (`pack_dense`);
  - RoPE: IPEX's fused rotary kernel, over a float32 sin/cos table indexed by position;
  - prefill attention: IPEX's flash attention.
Decode attention stays ours (`engine/kernels/cpu_attention.py`): it reads the KV cache where it lives, 4-bit or not,
and measured faster than IPEX's over a bfloat16 cache."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from engine.checkpoint import LayerWeights
from engine.compression.codecs import is_linear_weight
from engine.compression.int4 import QTensor, unpack_codes
from engine.kernels.attention import attend
from engine.kernels.layer_ops import split_heads
from engine.kernels.native import NativeKernels

log = logging.getLogger(__name__)
_ATTN_MASK_UTILS = "transformers.modeling_attn_mask_utils"


class IpexUnavailable(Exception):
    """IPEX is not installed, does not match this torch, or fails to import."""


def ipex_kernels() -> IpexKernels:
    _import_ipex()
    return IpexKernels(int4_gemm_available())


def int4_gemm_available() -> bool:
    """Whether IPEX runs its optimized int4 GEMM here. IPEX builds those kernels only for its AVX512-FP16 ISA
    level (Sapphire Rapids and later: the AMX generation); on other CPUs (e.g. AVX512-BF16 without AMX) its
    weight-only-quantized linear falls back to dequantizing the whole weight with ATen ops at every call, which is
    slower than dequantizing a layer once per step and running bf16 GEMMs (docs/BENCHMARKS.md, the ipex backend)."""
    import intel_extension_for_pytorch as ipex

    return ipex._C._get_current_isa_level() == "AVX512_FP16"


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


@cache  # once per process (a failure is not cached, and raises again)
def _import_ipex() -> None:
    """Import IPEX, or raise IpexUnavailable saying why. The version check comes first because a mismatched
    IPEX prints an error and fails inside its own import."""
    if importlib.util.find_spec("intel_extension_for_pytorch") is None:
        raise IpexUnavailable("intel-extension-for-pytorch is not installed")
    version = importlib.metadata.version("intel_extension_for_pytorch")
    if _minor(version) != _minor(torch.__version__):
        raise IpexUnavailable(f"intel-extension-for-pytorch {version} needs torch {_minor(version)}.*, "
                              f"but this is torch {torch.__version__}")
    with _attn_mask_utils_placeholder():
        try:
            import intel_extension_for_pytorch  # noqa: F401  (registers torch.ops.torch_ipex / ipex_prepack)
        except Exception as e:  # IPEX fails in many ways (NameError, AttributeError) besides ImportError
            raise IpexUnavailable(f"importing intel_extension_for_pytorch {version} failed: {e!r}") from e
    log.info("ipex backend: intel-extension-for-pytorch %s on torch %s, int4 GEMM %s", version, torch.__version__,
             "on" if int4_gemm_available() else "off (no optimized kernel for this CPU: 4-bit weights stay native)")


@contextmanager
def _attn_mask_utils_placeholder():
    """IPEX 2.8 was validated with transformers 4.51; its package import loads its own Hugging Face model
    rewrites, which need `transformers.modeling_attn_mask_utils`, a module transformers 5 removed (the import
    then dies with a NameError). flexbatch uses IPEX's operators only, never those rewrites, so while IPEX is
    imported a placeholder stands in for the missing module; its functions raise if ever called."""
    missing = importlib.util.find_spec("transformers") is not None and _ATTN_MASK_UTILS not in sys.modules and \
        importlib.util.find_spec(_ATTN_MASK_UTILS) is None
    if missing:
        sys.modules[_ATTN_MASK_UTILS] = _placeholder_module()
    try:
        yield
    finally:
        if missing:
            sys.modules.pop(_ATTN_MASK_UTILS, None)


def _placeholder_module() -> types.ModuleType:
    module = types.ModuleType(_ATTN_MASK_UTILS)

    def unavailable(*args, **kwargs):
        raise NotImplementedError(f"{_ATTN_MASK_UTILS} does not exist in this transformers version")

    module._prepare_4d_causal_attention_mask = module._prepare_4d_attention_mask = unavailable
    return module


# ---- packed Linear weights -------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackedLinear:
    """A Linear weight [out, in] packed for an IPEX kernel: `int4` (weight-only quantized) or `dense` (oneDNN)."""

    context: object  # the IPEX op context (a torch.classes object)
    kind: str
    in_features: int
    out_features: int
    dtype: torch.dtype


_DTYPES = (torch.float32, torch.bfloat16)  # compute dtypes whose weights IPEX packs


def int4_supported(qt: QTensor) -> bool:
    """IPEX's int4 GEMM takes groups along `in` whose size is a power of two (ours: 64 by default)."""
    g = qt.config.group_size
    return len(qt.shape) == 2 and qt.dim == 1 and g & (g - 1) == 0 and qt.dtype in _DTYPES


def pack_int4(qt: QTensor) -> PackedLinear:
    """Our 4-bit weight (groups along `in`, w = q s + m) in IPEX's plain int4 layout, without requantizing:
    codes [out, ceil(in/2)] uint8 with column 2j in the low nibble of byte j and 2j+1 in the high one, and per
    group float32 scales s and zero points zp = -m / s, so that IPEX's (q - zp) s = q s + m. A constant group
    (s = 0, every code 0) gets s = 1, zp = -m, which gives m exactly. The GEMM computes in the weight's dtype:
    float32 stays float32 (lowp mode NONE), bfloat16 runs bf16 GEMMs (lowp mode BF16)."""
    from intel_extension_for_pytorch.quantization import WoqActQuantMode, WoqLowpMode, WoqWeightDtype

    assert int4_supported(qt), (qt.shape, qt.config, qt.dtype)
    n, k = qt.shape
    codes = unpack_codes(qt)[:k].T  # [N, K]
    if k % 2:
        codes = F.pad(codes, (0, 1))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    scales, mins = qt.scales.float().T, qt.mins.float().T  # [N, groups]
    scales = torch.where(scales == 0, 1.0, scales)
    lowp = WoqLowpMode.NONE if qt.dtype == torch.float32 else WoqLowpMode.BF16
    context = torch.ops.ipex_prepack.weight_only_qlinear_prepack(
        packed, int(WoqWeightDtype.INT4), [n, k], scales.contiguous(), (-mins / scales).contiguous(), None, None,
        None, qt.config.group_size, int(lowp), int(WoqActQuantMode.NONE), False)
    return PackedLinear(context, "int4", k, n, qt.dtype)


def pack_dense(w: torch.Tensor) -> PackedLinear:
    """A dense weight [out, in] in oneDNN's blocked layout (a copy: the caller drops the original)."""
    context = torch.ops.ipex_prepack.linear_prepack(w, None, None)
    return PackedLinear(context, "dense", w.shape[1], w.shape[0], w.dtype)


def packed_linear(x: torch.Tensor, w: PackedLinear, b: torch.Tensor | None) -> torch.Tensor:
    """y = x W^T (+ b): x [*, in] -> [*, out] in x's dtype."""
    x = x.contiguous()
    if w.kind == "int4":
        y = torch.ops.torch_ipex.ipex_woq_linear(x, w.context.get_data_handle())
    else:
        empty = torch.empty(0, dtype=w.dtype)
        y = torch.ops.torch_ipex.ipex_linear(x, empty, None, w.context.get_data_handle(), w.out_features)
    return y if b is None else y.add_(b)


def _qtensor(stored: LayerWeights, meta: dict[str, str], base: str) -> QTensor:
    return QTensor.from_parts(json.loads(meta[base]), stored[base + ".data"], stored[base + ".mins"],
                              stored[base + ".scales"])


def pack_layer(stored: LayerWeights, meta: dict[str, str] | None, int4: bool, dense: bool) -> LayerWeights | None:
    """A CPU layer with its 4-bit Linear weights (if `int4`) and its dense ones (if `dense`) packed for IPEX;
    other tensors and already packed weights as they are. None when it holds a 4-bit weight that is not to be
    packed (int4 off, or a format IPEX does not take): such a layer is dequantized as by the native kernels."""
    out: LayerWeights = {}
    for name, t in stored.items():
        if name.endswith((".mins", ".scales")):
            continue
        if name.endswith(".data"):
            qt = _qtensor(stored, meta, name.removesuffix(".data"))
            if not (int4 and int4_supported(qt)):
                return None
            out[name.removesuffix(".data")] = pack_int4(qt)
        elif dense and isinstance(t, torch.Tensor) and is_linear_weight(name, t) and t.dtype in _DTYPES:
            out[name] = pack_dense(t)
        else:
            out[name] = t
    return out


class IpexKernels(NativeKernels):
    """IPEX kernels for CPU tensors; the native ones for tensors on another device."""

    name = "ipex"

    def __init__(self, int4: bool):
        self.int4 = int4  # 4-bit weights through IPEX's int4 GEMM (else dequantized, as natively)

    def _linear(self, x, w, b):
        if isinstance(w, PackedLinear):
            return packed_linear(x, w, b)
        return super()._linear(x, w, b)

    def pack_resident(self, stored, meta, codec=None):
        """Packed once at load, replacing the stored form: dense weights for oneDNN, 4-bit ones for the int4
        GEMM (when on; else the layer stays as stored and is dequantized at each use, as natively). Other
        formats (int8) are kept as natively."""
        if codec is not None and codec.format != "int4":
            return super().pack_resident(stored, meta, codec)
        packed = pack_layer(stored, meta, self.int4, dense=True)
        return stored if packed is None else packed

    def ready(self, stored, meta, codec, device, buffers=None):
        """On the CPU, 4-bit weights read from disk (or kept for another device) are packed for the int4 GEMM
        as they are loaded, in place of being dequantized; dense ones are used as they are."""
        if device != "cpu" or codec is None or not self.int4 or codec.format != "int4":
            return super().ready(stored, meta, codec, device, buffers)
        packed = pack_layer(stored, meta, self.int4, dense=False)
        return (packed, None) if packed is not None else super().ready(stored, meta, codec, device, buffers)

    def rope_tables(self, inv_freq, positions, dtype):
        """A float32 table [P, D] of (sin, cos) of p * inv_freq for positions p < P, and positions [B, S]."""
        P = int(positions.max()) + 1
        freqs = torch.arange(P, dtype=torch.float32, device=positions.device).unsqueeze(-1) * inv_freq
        return torch.cat([freqs.sin(), freqs.cos()], dim=-1), positions.contiguous()

    def rope(self, q, k, tables):
        sincos, positions = tables
        if q.device.type != "cpu":  # the native kernel, with cos, sin [B, 1, S, D] made from the table
            sin, cos = sincos[positions].chunk(2, dim=-1)  # [B, S, D/2] each
            cos, sin = (torch.cat([t, t], -1).to(q.dtype).unsqueeze(1) for t in (cos, sin))
            return super().rope(q, k, (cos, sin))
        return _ipex_rope(q, sincos, positions), _ipex_rope(k, sincos, positions)

    def rope_qkv(self, qkv, tables, num_heads, num_kv_heads, head_dim):
        """IPEX's rotary kernel over its own tables (`rope_tables`), not the native in-place one."""
        q, k, v = split_heads(qkv, num_heads, num_kv_heads, head_dim)
        return (*self.rope(q, k, tables), v)

    def prefill_attention(self, q, k, v, mask, scale=None):
        """q [B, NH, S, D], k/v [B, KVH, S, D], mask [B, 1, S, S] bool -> [B, NH, S, D]."""
        if q.device.type != "cpu":
            return attend(q, k, v, mask, scale)
        B, NH, S, D = q.shape
        KVH = k.shape[1]
        if KVH != NH:  # GQA: each K/V head serves NH / KVH query heads
            k, v = (t.unsqueeze(2).expand(B, KVH, NH // KVH, S, D).reshape(B, NH, S, D) for t in (k, v))
        return torch.ops.torch_ipex.flash_attention(q, k, v, attention_mask=mask, scale=scale)[0]


def _ipex_rope(x: torch.Tensor, sincos: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D] (a transposed view of [B, S, H, D]) rotated by `positions`: rotate-half pairs (i, i + D/2)."""
    _, H, _, D = x.shape
    out = torch.ops.torch_ipex.rotary_position_embedding(x.transpose(1, 2).contiguous(), sincos, positions, H, D,
                                                         D // 2, D)[0]
    return out.transpose(1, 2)
