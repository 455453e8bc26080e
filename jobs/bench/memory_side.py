"""One side of the --memory-limit line, run as its own process inside a memory group (jobs/bench/memory_limit.py):
`python -m jobs.bench.memory_side '<Side as JSON>'` loads the model, generates, and prints one JSON line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from jobs.bench import models as bm
from jobs.bench.memory_limit import Side

DTYPE = "bfloat16"


def flexbatch_policy(side: Side):
    """Whole layers kept in CPU memory as far as the budget allows after the embeddings, the block's KV cache and
    activations and two staged disk layers; the rest on disk."""
    from engine.policy import Policy
    from engine.spec import load_model_spec
    from engine.weights import CheckpointReader

    spec = load_model_spec(side.model_dir)
    reader = CheckpointReader(side.model_dir, spec)
    layer = sum(t.numel() * 2 for t in reader.layer(0, torch.bfloat16).values())
    glob = sum(t.numel() * 2 for t in reader.globals(torch.bfloat16).values())
    T = side.prompt_len + side.gen_len
    kv_act = side.batch * (spec.kv_bytes_per_token(2) * T + side.prompt_len * spec.hidden_size * 4)
    room = side.cpu_bytes - glob - kv_act - 2 * layer
    resident = max(0, min(spec.num_layers, int(room // layer)))
    return Policy(gbs=side.batch, num_gb=1, weight_cpu=resident / spec.num_layers)


def run_flexbatch(side: Side, prompts) -> tuple[int, float, dict]:
    from engine.generate import Engine
    from engine.request import Request, SamplingParams

    policy = flexbatch_policy(side)
    eng = Engine.load(side.model_dir, dtype=DTYPE, policy=policy, budgets={"cpu": side.cpu_bytes},
                      offload_dir=side.offload_dir)
    reqs = [Request(str(i), bm.prompt_text(ids), SamplingParams(max_new_tokens=side.gen_len))
            for i, ids in enumerate(prompts)]
    t0 = time.perf_counter()
    comps = eng.generate(reqs)
    gen_s = time.perf_counter() - t0
    assert not any(c.error for c in comps), [c.error for c in comps if c.error][:1]
    info = {"weight_cpu": policy.weight_cpu, "disk_direct": eng.weights.direct is not None,
            "phase_seconds": eng.phase_seconds}
    return sum(c.completion_tokens for c in comps), gen_s, info


def run_accelerate(side: Side, prompts) -> tuple[int, float, dict]:
    from jobs.bench.engine import accelerate_model
    from jobs.bench.runs import hf_runner

    model, device_map = accelerate_model(Path(side.model_dir), side.cpu_bytes, side.offload_dir)
    t0 = time.perf_counter()
    tokens = sum(hf_runner(model, prompts[i : i + side.batch], side.batch)(side.gen_len)
                 for i in range(0, len(prompts), side.batch))
    gen_s = time.perf_counter() - t0
    on = {}
    for v in device_map.values():
        on[v] = on.get(v, 0) + 1
    return tokens, gen_s, {"device_map": on}


def main(arg: str) -> None:
    side = Side(**json.loads(arg))
    vocab = json.loads((Path(side.model_dir) / "config.json").read_text())["vocab_size"]
    prompts = bm.prompt_ids(side.rows, side.prompt_len, vocab)
    t0 = time.perf_counter()
    run = run_flexbatch if side.side == "flexbatch" else run_accelerate
    tokens, gen_s, info = run(side, prompts)
    print(json.dumps({"tokens": tokens, "gen_s": gen_s, "tokens_per_s": tokens / gen_s,
                      "process_s": time.perf_counter() - t0, **info}))


if __name__ == "__main__":
    main(sys.argv[1])
