"""`LoadedModel`: what loading a checkpoint fixes for every run of the block executor. `Engine.load` builds it
once; a block executor is this plus one call's `Policy` (engine/loop/schedule.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.checkpoint import LayerWeights
    from engine.compression.codecs import KVCodec
    from engine.kernels.native import NativeKernels
    from engine.memory.tiers import Devices
    from engine.memory.weight_store import WeightStore
    from engine.spec import ModelSpec


@dataclass(frozen=True)
class LoadedModel:
    """The model's shape (`spec`), its family's layer functions (`model`, engine/models), the embeddings and LM
    head (`global_weights`, on tier `globals_on`, where they also compute), the layers' weights placed over the
    tiers (`weights`), the tiers and transfers (`devices`), the compute dtype, the kernel backend, the KV-cache
    codec (None: K/V kept in the compute dtype), the tokenizer (None when loaded without one) and the id that
    left-pads prompts in a batch (never attended to)."""

    spec: ModelSpec
    model: object
    global_weights: LayerWeights
    weights: WeightStore
    devices: Devices
    dtype: torch.dtype
    kernels: NativeKernels
    kv_codec: KVCodec | None = None
    tokenizer: object | None = None
    pad: int = 0
    globals_on: str = "cpu"
