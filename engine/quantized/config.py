"""What a checkpoint's `quantization_config` (config.json) says, checked when the checkpoint is opened: the
methods loaded as downloaded are GPTQ and AWQ at 4 bits and block-scaled FP8 (e4m3); every other method or
setting is refused in one line naming it and what is supported. The format is read from this metadata, never
guessed from tensor names (the names only say which tensors of a layer belong to a quantized weight)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import UnsupportedModelError

SUPPORTED = ("gptq (bits=4, checkpoint_format gptq or gptq_v2, pack_dtype int32, any group size, desc_act)",
             "awq (bits=4, version gemm, zero_point=true)",
             "fp8 (e4m3 weights, float weight_scale_inv per block or per tensor, dynamic activations)",
             "mxfp4 (gpt-oss's experts: e2m1 values in blocks of 32 with e8m0 scales)")
INT4_METHODS = ("gptq", "awq")


@dataclass(frozen=True)
class QuantFormat:
    """A checkpoint's quantization: `method` ("gptq", "awq", "fp8", "mxfp4"), the int4 methods' `group_size` (-1: one group
    per row) and GPTQ's zero offset (`zero_offset` 1 for checkpoint_format gptq, which stores zero - 1), FP8's
    `block` (rows, cols) of one scale, or None for one scale per tensor."""

    method: str
    bits: int = 4
    group_size: int = -1
    zero_offset: int = 0
    block: tuple[int, int] | None = None


def checkpoint_quantization(cfg: dict, where: str | Path = "config.json") -> QuantFormat | None:
    """The checkpoint's QuantFormat (None for an unquantized checkpoint), or UnsupportedModelError naming the
    method or setting that is not supported and what is."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        _refuse(where, f"quantization_config {qc!r} is not an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "gptq":
        return _gptq(qc, where)
    if method == "awq":
        return _awq(qc, where)
    if method == "fp8":
        return _fp8(qc, where)
    if method == "mxfp4":
        return QuantFormat("mxfp4", 4, 32)
    _refuse(where, f"quant_method {qc.get('quant_method')!r} is not supported")


def _refuse(where, what: str):
    raise UnsupportedModelError(f"{str(where)!r}: {what}; flexbatch loads these quantized checkpoints: "
                                f"{'; '.join(SUPPORTED)}, and unquantized ones")


def _bits(qc: dict, where) -> int:
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        _refuse(where, f"{qc['quant_method']} with bits={bits} is not supported (only bits=4)")
    return 4


def _group(qc: dict, where) -> int:
    group = qc.get("group_size", qc.get("q_group_size", -1))
    if not isinstance(group, int) or not (group == -1 or group > 0):
        _refuse(where, f"{qc['quant_method']} group_size={group!r} is invalid (a positive size, or -1)")
    return group


def _gptq(qc: dict, where) -> QuantFormat:
    bits, group = _bits(qc, where), _group(qc, where)
    fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        _refuse(where, f"gptq checkpoint_format {fmt!r} is not supported (a repacked kernel layout)")
    pack = str(qc.get("pack_dtype", "int32")).removeprefix("torch.")
    if pack != "int32":
        _refuse(where, f"gptq pack_dtype {pack!r} is not supported")
    return QuantFormat("gptq", bits, group, zero_offset=1 if fmt == "gptq" else 0)


def _awq(qc: dict, where) -> QuantFormat:
    bits, group = _bits(qc, where), _group(qc, where)
    version = str(qc.get("version") or "gemm").lower()
    if version != "gemm":
        _refuse(where, f"awq version {version!r} is not supported")
    if not qc.get("zero_point", True):
        _refuse(where, "awq with zero_point=false is not supported")
    return QuantFormat("awq", bits, group)


def _fp8(qc: dict, where) -> QuantFormat:
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        _refuse(where, f"fp8 fmt {fmt!r} is not supported")
    if str(qc.get("activation_scheme", "dynamic")).lower() != "dynamic":
        _refuse(where, f"fp8 activation_scheme {qc.get('activation_scheme')!r} is not supported")
    if str(qc.get("scale_fmt", "float")).lower() != "float":
        _refuse(where, f"fp8 scale_fmt {qc.get('scale_fmt')!r} is not supported")
    if str(qc.get("expert_dtype", "fp8")).lower() != "fp8":
        _refuse(where, f"fp8 expert_dtype {qc.get('expert_dtype')!r} is not supported")
    block = qc.get("weight_block_size")
    if block is not None and (len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block)):
        _refuse(where, f"fp8 weight_block_size={block!r} is invalid (two positive sizes)")
    return QuantFormat("fp8", 8, block=tuple(block) if block is not None else None)
