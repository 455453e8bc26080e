"""One side of the --memory-limit line, run as its own process inside a memory group (jobs/bench/memory_limit.py):
`python -m jobs.bench.memory_side '<Side as JSON>'` loads the model, generates, and prints one JSON line."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from jobs.bench import models as bm
from jobs.bench.memory_limit import LLAMA_CPP, Side
from planner.microbench import timed_call


def flexbatch_plan(side: Side):
    """The planner's policy for this side's workload under the room its group leaves (`pipeline.plan.planning`):
    the same decision a job makes, with the hardware profile the bench measured; a compressed side pins its
    format, as `--compress-weight FORMAT` does."""
    from engine.memory.room import memory_room
    from engine.spec import load_model_spec
    from pipeline.plan.planning import plan_budgets, planning_process
    from planner.hardware import load_hardware
    from planner.profiler import load_or_profile
    from planner.search import search
    from planner.workload import Workload

    spec = load_model_spec(side.model_dir)
    room = memory_room()
    hw = planning_process(load_hardware(side.hardware) if side.hardware else load_or_profile(), room)
    budgets = plan_budgets({"cpu": side.cpu_bytes}, room)
    work = Workload(side.prompt_len, side.gen_len, side.rows, dtype=side.dtype)
    pins = {"compress_weight": True, "weight_format": side.weight_format} if side.compress else None
    return search(spec, hw, work, pins=pins, budgets=budgets, allow_compression=side.compress), budgets


def run_flexbatch(side: Side, prompts) -> tuple[int, float, dict]:
    from engine.engine import Engine
    from engine.request import Request, SamplingParams

    plan, budgets = flexbatch_plan(side)
    policy = plan.policy
    eng = Engine.load(side.model_dir, dtype=side.dtype, policy=policy, budgets=budgets, offload_dir=side.offload_dir)
    reqs = [Request(str(i), bm.prompt_text(ids), SamplingParams(max_new_tokens=side.gen_len))
            for i, ids in enumerate(prompts)]
    comps, gen_s = timed_call(lambda: eng.generate(reqs))
    assert not any(c.error for c in comps), [c.error for c in comps if c.error][:1]
    info = {"policy": policy.to_dict(), "predicted_s": plan.prediction.total_s, "cpu_budget": budgets["cpu"],
            "roofline_s": plan.prediction.bound_s,  # bytes and FLOPs over the profiled rates, channels overlapped
            "disk_direct": eng.weights.direct is not None, "phase_seconds": eng.phase_seconds,
            # the compute thread's wait for layers and the prefetch thread's loading: a disk-bound run waits
            "weight_wait_s": eng.weights.weight_wait_s, "weight_load_s": eng.weights.load_s}
    return sum(c.completion_tokens for c in comps), gen_s, info


def run_llama_cpp(side: Side, prompts) -> tuple[int, float, dict]:
    """llama.cpp's llama-batched-bench on the side's GGUF, as a child of this process (so in its group): its own
    random prompts of the same shape; seconds are its prefill and decode (jobs/bench/llama_cpp.py)."""
    from jobs.bench import llama_cpp as lc

    res = lc.run_batched_bench(lc.llama_cpp_tools(side.llama_cpp), Path(side.gguf), side.rows, side.prompt_len,
                               side.gen_len, side.threads, side.load_mode)
    return res["tokens"], res["seconds"], {k: res[k] for k in ("phase_seconds", "attempts", "command")}


ACCELERATE_BATCHES = 2  # batches Accelerate runs: each is alike, so its rate does not depend on how many follow


def run_accelerate(side: Side, prompts) -> tuple[int, float, dict]:
    from jobs.bench.engine import accelerate_model
    from jobs.bench.runs import hf_runner

    model, device_map = accelerate_model(Path(side.model_dir), side.cpu_bytes, side.offload_dir, side.dtype)
    rows = prompts[: ACCELERATE_BATCHES * side.batch]
    tokens, gen_s = timed_call(lambda: sum(hf_runner(model, rows[i : i + side.batch], side.batch)(side.gen_len)
                                           for i in range(0, len(rows), side.batch)))
    on = {}
    for v in device_map.values():
        on[v] = on.get(v, 0) + 1
    return tokens, gen_s, {"device_map": on}


MARGIN_BYTES = 64 << 20  # left free in the group: Python's own growth, the tokenizer, the generate loop


def imports(side: Side) -> None:
    """What the side runs, imported: its baseline (`--baseline` stops here)."""
    import transformers  # noqa: F401  (both sides' baseline includes it)

    if side.side == "flexbatch":
        import engine.engine  # noqa: F401
        import planner.program  # noqa: F401  (cvxpy and HiGHS)
        from engine.tokenizer import load_tokenizer

        load_tokenizer(side.model_dir)
    elif side.side == "accelerate":  # llama.cpp's side imports nothing more: its engine is a process of its own
        import accelerate  # noqa: F401
        import transformers.models.llama.modeling_llama  # noqa: F401


def main(arg: str, baseline: bool = False) -> None:
    """The CPU memory either side may fill is measured here, in the group, after the imports: the group's room
    less a margin (capped by the Side's), so both sides get the same."""
    import torch

    from engine.memory.disk_read import memory_room_bytes

    side = Side(**json.loads(arg))
    torch.set_num_threads(side.threads)
    imports(side)
    if baseline:
        json.loads((Path(side.model_dir) / "config.json").read_text())
        print(json.dumps({"baseline": True}))
        return
    side = replace(side, cpu_bytes=max(16 << 20, min(side.cpu_bytes, memory_room_bytes() - MARGIN_BYTES)))
    vocab = json.loads((Path(side.model_dir) / "config.json").read_text())["vocab_size"]
    prompts = bm.prompt_ids(side.rows, side.prompt_len, vocab)
    run = {"flexbatch": run_flexbatch, "accelerate": run_accelerate, LLAMA_CPP: run_llama_cpp}[side.side]
    read_before = disk_read_bytes()
    (tokens, gen_s, info), process_s = timed_call(lambda: run(side, prompts))
    read = disk_read_bytes() - read_before
    print(json.dumps({"tokens": tokens, "gen_s": gen_s, "tokens_per_s": tokens / gen_s, "cpu_bytes": side.cpu_bytes,
                      "process_s": process_s, "disk_read_bytes": read, "disk_read_bytes_per_token": read / tokens,
                      **info}))


def disk_read_bytes() -> int:
    """Bytes this process has had read from storage (`read_bytes` of /proc/self/io: page-cache hits not counted),
    its threads included, and its children that have exited (their rusage's blocks read, 512 bytes each: the
    same counter, llama.cpp's process included)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1]) + children
    return children


if __name__ == "__main__":
    main(sys.argv[-1], baseline="--baseline" in sys.argv[1:-1])
