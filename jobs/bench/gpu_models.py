"""The checkpoints `flexbatch bench gpu` runs: random-weight OPT and Llama shapes of released models (built once with
`transformers` + `save_pretrained`, then cached), or any checkpoint folder; and the bf16 size of a model's
weights, from which the default GPU budget is taken."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.spec import ModelSpec
from jobs.bench import models as bm

log = logging.getLogger(__name__)
BF16_BYTES = 2


@dataclass(frozen=True)
class GpuPreset:
    """A model shape: `family` is "opt" or "llama"; the rest are the config's sizes."""

    family: str
    hidden_size: int
    ffn_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_position_embeddings: int = 2048


# opt-1.3b is the shape FlexGen's flex_opt runs as "facebook/opt-1.3b" (the FlexGen comparison uses it); llama-1b is
# Llama 3.2 1B's (GQA, tied embeddings); the tiny ones are for tests.
GPU_PRESETS = {
    "opt-1.3b": GpuPreset("opt", 2048, 8192, 24, 32, 32, 50272),
    "opt-6.7b": GpuPreset("opt", 4096, 16384, 32, 32, 32, 50272),
    "llama-1b": GpuPreset("llama", 2048, 8192, 16, 32, 8, 128256),
    "tiny-opt": GpuPreset("opt", 64, 256, 8, 4, 4, 256, 256),
    "tiny-llama": GpuPreset("llama", 64, 192, 8, 4, 2, 256, 256),
}


def hf_config(p: GpuPreset):
    """The `transformers` config of a preset. No EOS: every row generates exactly gen_len tokens."""
    from transformers import LlamaConfig, OPTConfig

    if p.family == "opt":
        return OPTConfig(hidden_size=p.hidden_size, ffn_dim=p.ffn_size, num_hidden_layers=p.num_layers,
                         num_attention_heads=p.num_heads, vocab_size=p.vocab_size, word_embed_proj_dim=p.hidden_size,
                         max_position_embeddings=p.max_position_embeddings, do_layer_norm_before=True,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return LlamaConfig(hidden_size=p.hidden_size, intermediate_size=p.ffn_size, num_hidden_layers=p.num_layers,
                       num_attention_heads=p.num_heads, num_key_value_heads=p.num_kv_heads, vocab_size=p.vocab_size,
                       max_position_embeddings=p.max_position_embeddings, tie_word_embeddings=True,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0)


def build_gpu_checkpoint(preset: str, cache_dir: str | Path | None = None) -> Path:
    """The folder of `preset`'s bf16 random-weight checkpoint (with a word-level tokenizer), built on first use
    under cache_dir/gpu-<preset>."""
    import torch
    from transformers import AutoModelForCausalLM

    p = GPU_PRESETS[preset]
    out = Path(cache_dir or bm.DEFAULT_CACHE_DIR) / f"gpu-{preset}"
    done = out / "complete.json"
    if done.is_file() and json.loads(done.read_text()) == asdict(p):
        return out
    out.mkdir(parents=True, exist_ok=True)
    log.info("building the %s checkpoint in %s", preset, out)
    bm.make_word_tokenizer(out, p.vocab_size)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(p), dtype=torch.bfloat16)
    model.generation_config.eos_token_id = None
    model.save_pretrained(out, safe_serialization=True)
    done.write_text(json.dumps(asdict(p)))
    return out


def weight_bytes(spec: ModelSpec, dtype_bytes: int = BF16_BYTES) -> float:
    """Every weight of the model at `dtype_bytes` each: the layers, embeddings, head and norms."""
    from planner.memory_model import global_bytes, layer_bytes

    return spec.num_layers * layer_bytes(spec, dtype_bytes, False) + global_bytes(spec, dtype_bytes)
