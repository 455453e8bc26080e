"""The per-phase policies `flexbatch bench gpu` compares under one GPU budget (FlexInfer's choices: CPU-only, GPU
with offloading, a static split by layers, for prefill and decode separately), with FlexGen-like offloading of
both phases as the baseline.

Where the weights live is fixed when an engine loads, so each policy's weight placement is fixed for every batch
size: the baseline keeps on the GPU as many whole layers as the budget holds after two staged layers and the
activations of the largest batch, and streams the others from the CPU; a split keeps its GPU layers' weights
resident on the GPU (as many as fit beside the embeddings and LM head, which live on the GPU when decode's last
layer computes there; the engine gives the gpu tier to the layers above the split first), its CPU
layers' in CPU memory (FlexInfer's static split); CPU-only and GPU-prefill/CPU-decode keep all weights on the CPU.
Besides the splits at 1/4, 1/2 and 3/4 of the layers, each split kind is also run at the layer where exactly the
layers that fit the budget sit on the GPU.
The KV cache and activations are placed per batch: on the GPU when they fit what the budget has left and a
GPU phase uses them, else on the CPU, where decode attention then runs (FlexGen's CPU attention)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from engine.memory.footprint import STAGED_LAYERS, act_row_bytes, global_bytes, kv_row_bytes, layer_bytes
from engine.policy import Policy
from engine.spec import ModelSpec

BASELINE = "offload"
KINDS = (BASELINE, "cpu", "gpu-cpu", "gpu-split", "split-split", "planner")
SPLIT_POINTS = (0.25, 0.5, 0.75)  # of the layers, as the planner's search splits


@dataclass(frozen=True)
class BenchPolicy:
    """A named policy: `base` fixes the weights and each phase's device; `place` fills in the rest per batch."""

    name: str
    kind: str
    base: Policy

    @property
    def uses_gpu(self) -> bool:
        return self.base.uses_gpu()


def split_layers(num_layers: int) -> list[int]:
    """The first GPU layer of a split at a quarter, half and three quarters of the layers."""
    return sorted({min(num_layers - 1, max(1, round(num_layers * q))) for q in SPLIT_POINTS}) if num_layers > 1 else []


def act_bytes(spec: ModelSpec, batch: int, prompt_len: int) -> float:
    """Activations of one block of `batch` rows (engine.memory.footprint.act_row_bytes, float32)."""
    return batch * act_row_bytes(spec, prompt_len)


def kv_bytes(spec: ModelSpec, batch: int, total_len: int, dtype_bytes: int) -> float:
    """The plain KV cache of one block of `batch` rows for total_len slots (engine.memory.footprint.kv_row_bytes)."""
    return batch * kv_row_bytes(spec, total_len, dtype_bytes, False)


def offload_gpu_layers(spec: ModelSpec, gpu_bytes: float, dtype_bytes: int, max_batch: int, prompt_len: int) -> int:
    """Whole layers the offloading baseline keeps on the GPU: what the budget holds after STAGED_LAYERS streamed
    layers and the activations of the largest batch."""
    return fitting_layers(spec, gpu_bytes, dtype_bytes, max_batch, prompt_len, STAGED_LAYERS)


def fitting_layers(spec: ModelSpec, gpu_bytes: float, dtype_bytes: int, max_batch: int, prompt_len: int,
                   staged: int) -> int:
    """Whole layers whose weights fit the GPU budget after `staged` staged layers, the largest batch's
    activations, and the embeddings and LM head (every policy sized here computes decode's last layer on the
    GPU, so they live there: engine.memory.weight_store.globals_tier)."""
    layer = layer_bytes(spec, dtype_bytes, False)
    room = gpu_bytes - staged * layer - act_bytes(spec, max_batch, prompt_len) - global_bytes(spec, dtype_bytes)
    return max(0, min(spec.num_layers, int(room // layer)))


def split_policy(L: int, k: int, fit: tuple[int, int], prefill: str) -> Policy:
    """Decode split at layer k, prefill on `prefill` ("gpu" or "split" at k): the GPU layers' weights resident
    on the GPU, as many as fit. fit: the layers that fit with nothing staged, and with two layers staged (once
    some GPU layer streams its weights)."""
    wg = (L - k if L - k <= fit[0] else fit[1]) / L
    extra = dict(prefill_split_layer=k) if prefill == "split" else {}
    return Policy(weight_gpu=wg, weight_cpu=1 - wg, prefill_device=prefill, decode_device="split",
                  decode_split_layer=k, **extra)


def bench_policies(spec: ModelSpec, gpu_bytes: float, dtype_bytes: int, max_batch: int, prompt_len: int,
                   kinds: tuple[str, ...] = KINDS) -> list[BenchPolicy]:
    """The fixed policies of the comparison (the planner's choice is added per batch), baseline first."""
    L = spec.num_layers
    wg = offload_gpu_layers(spec, gpu_bytes, dtype_bytes, max_batch, prompt_len) / L
    out = [BenchPolicy("offload gpu/gpu", BASELINE,
                       Policy(weight_gpu=wg, weight_cpu=1 - wg, prefill_device="gpu", decode_device="gpu"))]
    if "cpu" in kinds:
        out.append(BenchPolicy("cpu/cpu", "cpu", Policy()))
    if "gpu-cpu" in kinds:
        out.append(BenchPolicy("gpu/cpu", "gpu-cpu", Policy(prefill_device="gpu")))
    splits = split_layers(L)
    staged, bare = (fitting_layers(spec, gpu_bytes, dtype_bytes, max_batch, prompt_len, n) for n in (STAGED_LAYERS, 0))
    if "gpu-split" in kinds:  # prefill streams the CPU layers' weights: two layers staged
        for k in sorted(set(splits) | ({L - staged} if 0 < staged < L else set())):
            out.append(BenchPolicy(f"gpu/split@{k}", "gpu-split", split_policy(L, k, (staged, staged), "gpu")))
    if "split-split" in kinds:  # the middle split, and where the fitting layers sit on the GPU
        for k in sorted(set(splits[len(splits) // 2:][:1]) | ({L - bare} if 0 < bare < L else set())):
            out.append(BenchPolicy(f"split@{k}/split@{k}", "split-split", split_policy(L, k, (bare, staged), "split")))
    return out


def place(base: Policy, spec: ModelSpec, free_gpu_bytes: float, batch: int, prompt_len: int, gen_len: int,
          dtype_bytes: int) -> Policy:
    """`base` for one batch of `batch` rows (gbs = batch, num_gb = 1): activations on the GPU when some phase
    computes there and they fit, then the KV cache there too when decode runs wholly on the GPU and it fits."""
    p = dataclasses.replace(base, gbs=batch, num_gb=1, cache_gpu=0.0, cache_cpu=1.0, act_gpu=0.0, act_cpu=1.0)
    if not base.uses_gpu():
        return p
    act = act_bytes(spec, batch, prompt_len)
    if act > free_gpu_bytes:
        return p
    p = dataclasses.replace(p, act_gpu=1.0, act_cpu=0.0)
    kv = kv_bytes(spec, batch, prompt_len + gen_len, dtype_bytes)
    if base.decode_device == "gpu" and act + kv <= free_gpu_bytes:
        p = dataclasses.replace(p, cache_gpu=1.0, cache_cpu=0.0)
    return p


def load_key(policy: Policy, num_layers: int) -> str:
    """What an engine fixes at load (`Policy.fixed_at_load`): two policies with the same key share one engine."""
    return json.dumps(policy.fixed_at_load(num_layers), sort_keys=True)
