"""Fixed per-call costs of the engine on the CPU, measured on the engine's own block executor at tiny sizes,
where the arithmetic is negligible and what remains is dispatch: the schedule's per-layer work (weights handed
over by the prefetch thread, activations stored and loaded, the layer's norms, GEMMs, rotary, cache write and
chunked attention) and its per-step work outside the layers (masks, rotary tables, embedding, head, token
choice), and what 4-bit weights, a 4-bit cache, disk layers and split caches add to them. Two models of 1 and
PROBE_LAYERS layers run the same steps; the difference gives the layer call."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.engine import Engine
from engine.loop.row_state import RowState
from engine.policy import Policy
from engine.request import Request, SamplingParams
from planner.microbench import best_seconds

PROBE_LAYERS = 5
PROBE_CONFIG = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=2,
                    num_key_value_heads=2, vocab_size=64, max_position_embeddings=128, tie_word_embeddings=True)
PROMPT, STEPS = 4, 24
PROBE_ROWS = 8  # a typical GPU batch: the per-row parts of a call (masks, sampling, copies) are included


def write_probe_checkpoint(folder: Path, layers: int, config: dict | None = None) -> Path:
    """A random-weight Llama of `layers` layers (PROBE_CONFIG, or `config`): config.json and one safetensors file
    (no tokenizer)."""
    cfg = {**(config or PROBE_CONFIG), "num_hidden_layers": layers}
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = h * cfg["num_key_value_heads"] // cfg["num_attention_heads"]
    shapes = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h),
              "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, h), "mlp.gate_proj.weight": (f, h),
              "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f), "input_layernorm.weight": (h,),
              "post_attention_layernorm.weight": (h,)}
    tensors = {"model.embed_tokens.weight": torch.randn(v, h) * 0.02, "model.norm.weight": torch.ones(h)}
    for i in range(layers):
        tensors |= {f"model.layers.{i}.{k}": torch.randn(*s) * 0.02 for k, s in shapes.items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def block_seconds(folder: Path, dtype: torch.dtype, policy: Policy, repeats: int = 5, prompt: int = PROMPT,
                  steps: int = STEPS) -> float:
    """Fewest seconds of one block of policy.gbs rows (`prompt` tokens, `steps` steps) through the executor."""
    engine = Engine.load(folder, dtype=str(dtype).removeprefix("torch."), policy=policy,
                         offload_dir=folder / "offload", tokenizer=False)
    executor, params = engine.executor(), SamplingParams(max_new_tokens=steps)
    times = []
    try:
        for _ in range(repeats + 1):
            block = [RowState(Request(str(i), "", params), [1] * prompt, ()) for i in range(policy.gbs)]
            t0 = time.perf_counter()
            with torch.inference_mode():
                executor.run_block(block)
            times.append(time.perf_counter() - t0)
    finally:
        engine.weights.close()
    return min(times[1:])


VARIANTS = {  # what each probe adds to the plain layer call, and the Policy fields that make it
    "dequant_call_s": {"compress_weight": True},
    "cache_codec_call_s": {"compress_cache": True},
    "disk_layer_call_s": {"weight_cpu": 0.0},
    "split_call_s": {"cache_cpu": 0.5, "act_cpu": 0.5},
}


def call_seconds(dtype: torch.dtype) -> dict[str, float]:
    """Seconds per call for one GPU batch of PROBE_ROWS rows: layer_call_s and step_call_s, and what each of
    VARIANTS adds per layer call: 4-bit weights (per layer per step), a 4-bit cache, a layer read from disk
    (per layer per step), and a cache and activations split over two tiers."""
    per_layer_step = (PROBE_LAYERS - 1) * STEPS
    with tempfile.TemporaryDirectory(prefix="flexbatch-probe-") as tmp:
        one, many = write_probe_checkpoint(Path(tmp) / "one", 1), write_probe_checkpoint(Path(tmp) / "many",
                                                                                        PROBE_LAYERS)
        t = {name: (block_seconds(one, dtype, Policy(gbs=PROBE_ROWS, num_gb=1, **kw)),
                    block_seconds(many, dtype, Policy(gbs=PROBE_ROWS, num_gb=1, **kw)))
             for name, kw in {"layer_call_s": {}, **VARIANTS}.items()}
    layer = {name: max(0.0, (m - o) / per_layer_step) for name, (o, m) in t.items()}
    plain = layer["layer_call_s"]
    out = {"layer_call_s": plain, "step_call_s": max(0.0, t["layer_call_s"][0] / STEPS - plain)}
    return out | {name: max(0.0, layer[name] - plain) for name in VARIANTS}


def elementwise_bytes_per_s(dtype: torch.dtype, tokens: int = 1024, hidden: int = 1024, heads: int = 16) -> float:
    """Rate of a Llama layer's elementwise work as the engine does it (two RMSNorms, rotary on q and k, SiLU
    gating, two residual adds, the attention output's transpose), in the cost model's unit: bytes of
    (ELEMENTWISE_PASSES_H * H + ELEMENTWISE_PASSES_F * F) * dtype_bytes per token."""
    from engine.kernels.layer_ops import rms_norm
    from engine.kernels.rope import RopeSpec, apply_rope, cos_sin, inv_frequencies
    from planner.cost_model import ELEMENTWISE_PASSES_F, ELEMENTWISE_PASSES_H

    ffn, d = int(2.75 * hidden), hidden // heads
    h, w = torch.randn(1, tokens, hidden).to(dtype), torch.ones(hidden, dtype=dtype)
    q = torch.randn(1, tokens, heads, d).to(dtype).transpose(1, 2)
    gate, up = torch.randn(1, tokens, ffn).to(dtype), torch.randn(1, tokens, ffn).to(dtype)
    cos, sin = cos_sin(inv_frequencies(RopeSpec(), d), torch.arange(tokens).view(1, -1), dtype)

    def layer_elementwise():
        x = h + rms_norm(h, w, 1e-5)
        apply_rope(q, cos, sin), apply_rope(q, cos, sin)
        q.transpose(1, 2).reshape(1, tokens, hidden)
        return x + rms_norm(x, w, 1e-5), torch.nn.functional.silu(gate) * up

    with torch.inference_mode():
        seconds = best_seconds(layer_elementwise, 5)
    per_token = ELEMENTWISE_PASSES_H * hidden + ELEMENTWISE_PASSES_F * ffn
    return tokens * per_token * torch.empty((), dtype=dtype).element_size() / seconds

