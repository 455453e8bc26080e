"""One side of the --memory-limit line, run as its own process inside a memory group (jobs/bench/memory_limit.py):
`python -m jobs.bench.memory_side '<Side as JSON>'` loads the model, generates, and prints one JSON line."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from jobs.bench import models as bm
from jobs.bench.memory_limit import Side
from planner.microbench import timed_call

DTYPE = "bfloat16"


def flexbatch_policy(side: Side):
    """Under the CPU budget, after the embeddings, the activations and two staged disk layers: whole layers kept
    in memory first, then as much of the KV cache as fits; the rest of both on disk."""
    from engine.policy import Policy
    from engine.spec import load_model_spec
    from engine.weights import CheckpointReader

    spec = load_model_spec(side.model_dir)
    reader = CheckpointReader(side.model_dir, spec)
    layer = sum(t.numel() * 2 for t in reader.layer(0, torch.bfloat16).values())
    glob = sum(t.numel() * 2 for t in reader.globals(torch.bfloat16).values())
    T = side.prompt_len + side.gen_len
    kv = side.rows * spec.kv_bytes_per_token(2) * T
    room = side.cpu_bytes - glob - 2 * layer - side.batch * side.prompt_len * spec.hidden_size * 4
    resident = max(0, min(spec.num_layers, int(room // layer)))
    cache_cpu = max(0.0, min(1.0, (room - resident * layer) / kv))
    return Policy(gbs=side.batch, num_gb=max(1, side.rows // side.batch), weight_cpu=resident / spec.num_layers,
                  cache_cpu=round(cache_cpu, 3), act_cpu=1.0)


def run_flexbatch(side: Side, prompts) -> tuple[int, float, dict]:
    from engine.generate import Engine
    from engine.request import Request, SamplingParams

    policy = flexbatch_policy(side)
    eng = Engine.load(side.model_dir, dtype=DTYPE, policy=policy, budgets={"cpu": side.cpu_bytes},
                      offload_dir=side.offload_dir)
    reqs = [Request(str(i), bm.prompt_text(ids), SamplingParams(max_new_tokens=side.gen_len))
            for i, ids in enumerate(prompts)]
    comps, gen_s = timed_call(lambda: eng.generate(reqs))
    assert not any(c.error for c in comps), [c.error for c in comps if c.error][:1]
    info = {"weight_cpu": policy.weight_cpu, "disk_direct": eng.weights.direct is not None,
            "phase_seconds": eng.phase_seconds}
    return sum(c.completion_tokens for c in comps), gen_s, info


def run_accelerate(side: Side, prompts) -> tuple[int, float, dict]:
    from jobs.bench.engine import accelerate_model
    from jobs.bench.runs import hf_runner

    model, device_map = accelerate_model(Path(side.model_dir), side.cpu_bytes, side.offload_dir)
    tokens, gen_s = timed_call(lambda: sum(hf_runner(model, prompts[i : i + side.batch], side.batch)(side.gen_len)
                                           for i in range(0, len(prompts), side.batch)))
    on = {}
    for v in device_map.values():
        on[v] = on.get(v, 0) + 1
    return tokens, gen_s, {"device_map": on}


MARGIN_BYTES = 64 << 20  # left free in the group: Python's own growth, the tokenizer, the generate loop


def main(arg: str) -> None:
    """The CPU memory either side may fill is measured here, in the group, after the imports: the group's room
    less a margin (capped by the Side's), so both sides get the same."""
    import transformers  # noqa: F401  (both sides' baseline includes it)

    from engine.disk_read import memory_room_bytes

    side = Side(**json.loads(arg))
    side = replace(side, cpu_bytes=max(16 << 20, min(side.cpu_bytes, memory_room_bytes() - MARGIN_BYTES)))
    vocab = json.loads((Path(side.model_dir) / "config.json").read_text())["vocab_size"]
    prompts = bm.prompt_ids(side.rows, side.prompt_len, vocab)
    run = run_flexbatch if side.side == "flexbatch" else run_accelerate
    (tokens, gen_s, info), process_s = timed_call(lambda: run(side, prompts))
    print(json.dumps({"tokens": tokens, "gen_s": gen_s, "tokens_per_s": tokens / gen_s, "cpu_bytes": side.cpu_bytes,
                      "process_s": process_s, **info}))


if __name__ == "__main__":
    main(sys.argv[1])
