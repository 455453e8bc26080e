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


STACKED = re.compile(r"^(.*experts\.)(gate_up_proj|down_proj)(_bias)?$")  # gpt-oss: every expert in one tensor


def unstack_experts(lw: LayerWeights) -> LayerWeights:
    """A layer's experts stored stacked (gpt-oss: `experts.gate_up_proj` [E, in, 2F] with gate and up interleaved
    along its last dimension, `experts.down_proj` [E, F, in], biases [E, out]) as one Linear weight [out, in] and
    bias per expert, `experts.{e}.gate_up_proj` (gate rows, then up rows) and `experts.{e}.down_proj`."""
    out = {}
    for name, t in lw.items():
        m = STACKED.match(name)
        if m is None:
            out[name] = t
            continue
        prefix, proj, bias = m.groups()
        for e in range(t.shape[0]):
            x = t[e] if bias else t[e].T  # [out] or [out, in]
            if proj == "gate_up_proj":
                x = torch.cat([x[0::2], x[1::2]])
            out[f"{prefix}{e}.{proj}.{'bias' if bias else 'weight'}"] = x.contiguous()
    return out


def fuse_projections(lw: LayerWeights) -> LayerWeights:
    """A layer's weights with each group of `fused_groups` present concatenated, stacked experts unstacked (other
    tensors as they are)."""
    out = unstack_experts(lw)
    for fused, parts in fused_groups(out).items():
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
