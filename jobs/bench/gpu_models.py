"""The checkpoints `flexbatch bench gpu` runs: random-weight OPT and Llama shapes of released models (built once with
`transformers` + `save_pretrained`, then cached), or any checkpoint folder; the bf16 size of a model's weights,
and the default GPU budget."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.spec import ModelSpec
from jobs.bench import models as bm
from jobs.bench.models import Preset

log = logging.getLogger(__name__)
BF16_BYTES = 2
DEFAULT_LAYER_SHARE = 0.25  # of the layers' weights in the GPU budget: a large GPU behaves like a small one


# opt-1.3b is the shape FlexGen's flex_opt runs as "facebook/opt-1.3b" (the FlexGen comparison uses it); llama-1b is
# Llama 3.2 1B's (GQA, tied embeddings); the tiny ones are for tests.
GPU_PRESETS = {
    "opt-1.3b": Preset(2048, 8192, 24, 32, 32, 50272, family="opt"),
    "opt-6.7b": Preset(4096, 16384, 32, 32, 32, 50272, family="opt"),
    "llama-1b": Preset(2048, 8192, 16, 32, 8, 128256, family="llama"),
    "tiny-opt": Preset(64, 256, 8, 4, 4, 256, max_position_embeddings=256, family="opt"),
    "tiny-llama": Preset(64, 192, 8, 4, 2, 256, max_position_embeddings=256, family="llama"),
}


def build_gpu_checkpoint(preset: str, cache_dir: str | Path | None = None) -> Path:
    """The folder of `preset`'s bf16 random-weight checkpoint, built on first use under cache_dir/gpu-<preset>."""
    return bm.build_checkpoint(GPU_PRESETS[preset], cache_dir, folder=f"gpu-{preset}")


def weight_bytes(spec: ModelSpec, dtype_bytes: int = BF16_BYTES) -> float:
    """Every weight of the model at `dtype_bytes` each: the layers, embeddings, head and norms."""
    from engine.memory.footprint import global_bytes, layer_bytes

    return spec.num_layers * layer_bytes(spec, dtype_bytes, False) + global_bytes(spec, dtype_bytes)


def default_gpu_budget(spec: ModelSpec, dtype_bytes: int = BF16_BYTES) -> float:
    """The embeddings and LM head (which every policy that decodes its last layer on the GPU keeps there) plus
    DEFAULT_LAYER_SHARE of the layers' weights, at `dtype_bytes` each."""
    from engine.memory.footprint import global_bytes, layer_bytes

    return global_bytes(spec, dtype_bytes) + DEFAULT_LAYER_SHARE * spec.num_layers * layer_bytes(spec, dtype_bytes,
                                                                                               False)
