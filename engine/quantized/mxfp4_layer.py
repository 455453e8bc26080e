"""gpt-oss's MXFP4 experts kept in their checkpoint form: a layer read with each expert's gate_up and down weight as
the checkpoint's own bytes, 4.25 bits a weight (engine/quantized/mxfp4.py `pack`), every other tensor in the run's
dtype, unstacked and fused as engine/kernels/fuse.py gives the dense layer. Its experts compute with the project's
MXFP4 kernels (engine/kernels/mxfp4_linear.py, mxfp4_experts.py). Where those cannot run (not built, turned off by
FLEXBATCH_KERNELS=off, or a layer computing on the GPU) the experts are dequantized at load instead
(engine/quantized/layer.py), taking 4x (bfloat16) or 8x (float32) their checkpoint bytes."""

from __future__ import annotations

import torch

from engine.checkpoint import CheckpointReader, LayerWeights
from engine.errors import WeightFormatError
from engine.kernels import mxfp4_linear
from engine.kernels.fuse import STACKED, fuse_projections
from engine.policy import Policy
from engine.quantized.layer import split_quantized
from engine.quantized.mxfp4 import SUFFIX, pack
from engine.spec import ModelSpec


def keeps_packed(model: ModelSpec, policy: Policy) -> bool:
    """Whether a run keeps `model`'s experts packed: an MXFP4 checkpoint, every layer computing on the CPU in both
    phases, and the kernels built for this CPU."""
    quant = model.quantization
    return (quant is not None and quant.method == "mxfp4" and policy.prefill_device == "cpu"
            and policy.decode_device == "cpu" and mxfp4_linear.available())


def packed_layer(reader: CheckpointReader, i: int, dtype: torch.dtype) -> LayerWeights:
    """Layer i of an MXFP4 checkpoint: each expert's projection as `{prefix}experts.{e}.{proj}.weight` + SUFFIX
    [out, in / 32, 17] uint8, the other tensors in `dtype` as `fuse_projections` gives them."""
    parts, rest = split_quantized(reader.stored_layer(i), reader.quant)
    out = fuse_projections({name: t.to(dtype).contiguous() for name, t in rest.items()})
    for name, p in parts.items():
        out |= per_expert(name, p)
    return out


def per_expert(name: str, parts: dict[str, torch.Tensor]) -> LayerWeights:
    """Stacked weight `name` (`{prefix}experts.gate_up_proj` or `.down_proj`: blocks [E, out, in / 32, 16], scales
    [E, out, in / 32]) as one packed weight per expert; gate_up's rows, gate and up interleaved in the checkpoint,
    as its gate rows, then its up rows (as engine/kernels/fuse.py `unstack_experts` orders the dense ones)."""
    m = STACKED.match(name)
    if m is None or m.group(3):
        raise WeightFormatError(f"mxfp4 weight {name!r} is not a stacked expert projection (experts.gate_up_proj or "
                                "experts.down_proj): only gpt-oss's experts are read in MXFP4")
    if set(parts) != {"blocks", "scales"}:
        raise WeightFormatError(f"mxfp4 weight {name!r} lacks its {'scales' if 'blocks' in parts else 'blocks'}")
    prefix, proj = m.group(1), m.group(2)
    stacked = pack(parts["blocks"], parts["scales"], name)  # [E, out, in / 32, 17]
    out = {}
    for e in range(stacked.shape[0]):
        w = stacked[e]
        if proj == "gate_up_proj":
            w = torch.cat([w[0::2], w[1::2]])
        out[f"{prefix}{e}.{proj}.weight{SUFFIX}"] = w.contiguous()
    return out
