"""Projections that read the same input run as one GEMM: q/k/v become `self_attn.qkv_proj`, a SwiGLU MLP's
gate/up become `mlp.gate_up_proj` and each expert's gate/up (`experts.{e}.gate_proj`/`up_proj`, or Mixtral's `w1`/`w3`)
its `experts.{e}.gate_up_proj`, their weights (and biases) concatenated along `out` once, when a layer is loaded. One GEMM of width 3H (or 2F) instead of three (two) narrower ones saves dispatch per layer and runs
at a higher rate at decode row counts. Each output element is still the same dot product over `in`, so the
results equal the separate projections' (checked against transformers token for token)."""

from __future__ import annotations

import re

import torch

from engine.checkpoint import LayerWeights

FUSED = {  # fused name -> the projections it concatenates, in this order along `out`
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
EXPERT_GATE = re.compile(r"^(.*(?:experts\.\d+|shared_expert)\.)(gate_proj|w1)\.weight$")  # an expert's gate
EXPERT_UP = {"gate_proj": "up_proj", "w1": "w3"}  # its up projection, by the checkpoint's naming
LAYOUT = "fused-qkv-gate-up-v1"  # part of the offload folder's key: layers stored on disk are fused


def fused_groups(names) -> dict[str, tuple[str, ...]]:
    """FUSED, and each expert's gate/up among the tensor `names` of a layer: fused name -> its projections."""
    groups = dict(FUSED)
    for name in names:
        m = EXPERT_GATE.match(name)
        if m:
            prefix, gate = m.groups()
            groups[prefix + "gate_up_proj"] = (prefix + gate, prefix + EXPERT_UP[gate])
    return groups


def fuse_projections(lw: LayerWeights) -> LayerWeights:
    """A layer's weights with each group of `fused_groups` present concatenated (other tensors as they are)."""
    out = dict(lw)
    for fused, parts in fused_groups(lw).items():
        if not all(p + ".weight" in lw for p in parts):
            continue
        for suffix in (".weight", ".bias"):
            tensors = [out.pop(p + suffix, None) for p in parts]
            if all(t is not None for t in tensors):
                out[fused + suffix] = torch.cat(tensors)
            elif any(t is not None for t in tensors):  # some biased, some not: zeros stand in for the missing
                like = next(t for t in tensors if t is not None)
                out[fused + suffix] = torch.cat([t if t is not None else like.new_zeros(lw[p + ".weight"].shape[0])
                                                 for t, p in zip(tensors, parts)])
    return out
