"""A random-weight Llama checkpoint written shard by shard, for model sizes that do not fit in memory (a 7B or 13B
shape on a 24 GiB machine): one shard per transformer layer plus one for the embeddings, final norm and head, each
made from its own seed, written under a temporary name and renamed into place, with `model.safetensors.index.json`
written last. Making it holds one shard in memory at a time (~0.45 GB at the 7B shape in bf16); a build that
stops is resumed by the next call, which keeps the shards already in place (the same seeds give the same bytes).

The weights are drawn as `transformers` initializes a Llama (normal, std `initializer_range`; norms 1), so the
checkpoint loads with `AutoModelForCausalLM.from_pretrained` as well as with the engine."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def layer_tensors(cfg, i: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Layer i's tensor names -> (shape, is a norm) in the `transformers` Llama naming."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    d = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    p = f"model.layers.{i}."
    return {p + "input_layernorm.weight": ((h,), True), p + "post_attention_layernorm.weight": ((h,), True),
            p + "self_attn.q_proj.weight": ((q, h), False), p + "self_attn.k_proj.weight": ((kv, h), False),
            p + "self_attn.v_proj.weight": ((kv, h), False), p + "self_attn.o_proj.weight": ((h, q), False),
            p + "mlp.gate_proj.weight": ((f, h), False), p + "mlp.up_proj.weight": ((f, h), False),
            p + "mlp.down_proj.weight": ((h, f), False)}


def global_tensors(cfg) -> dict[str, tuple[tuple[int, ...], bool]]:
    out = {"model.embed_tokens.weight": ((cfg.vocab_size, cfg.hidden_size), False),
           "model.norm.weight": ((cfg.hidden_size,), True)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ((cfg.vocab_size, cfg.hidden_size), False)
    return out


def _draw(shapes: dict, dtype: torch.dtype, std: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, norm) in shapes.items():
        t = torch.ones(shape, dtype=dtype) if norm else torch.empty(shape, dtype=torch.float32).normal_(0, std,
                                                                                                      generator=g)
        out[name] = t.to(dtype)
    return out


def shard_bytes(shapes: dict, dtype: torch.dtype) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    return sum(torch.Size(s).numel() * size for s, _ in shapes.values())


def shards(cfg) -> list[dict[str, tuple[tuple[int, ...], bool]]]:
    """The checkpoint's shards: the embeddings, final norm and head, then one per layer."""
    return [global_tensors(cfg)] + [layer_tensors(cfg, i) for i in range(cfg.num_hidden_layers)]


def checkpoint_bytes(cfg, dtype: torch.dtype) -> int:
    return sum(shard_bytes(s, dtype) for s in shards(cfg))


def write_sharded_random(out: Path, cfg, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """Write (or finish writing) the checkpoint of `cfg` (a `transformers` LlamaConfig) into `out`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    parts = shards(cfg)
    n = len(parts)
    weight_map, total = {}, 0
    for k, shapes in enumerate(parts):
        name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        path = out / name
        weight_map |= dict.fromkeys(shapes, name)
        total += shard_bytes(shapes, dtype)
        if path.is_file():  # renamed into place only once complete
            continue
        log.info("writing shard %d of %d (%s)", k + 1, n, name)
        tmp = out / f".{name}.tmp"
        save_file(_draw(shapes, dtype, cfg.initializer_range, seed * 100_003 + k), str(tmp), metadata={"format": "pt"})
        os.replace(tmp, path)
    cfg.torch_dtype = dtype
    cfg.architectures = ["LlamaForCausalLM"]  # as save_pretrained names it: tools that read the config need it
    cfg.to_json_file(str(out / "config.json"))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    tmp = out / ".model.safetensors.index.json.tmp"
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / "model.safetensors.index.json")
    return out
