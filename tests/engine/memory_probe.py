"""Run in a subprocess: load a model under a policy and budgets, generate, and report RSS figures (bytes) as
JSON: the resident set after imports and tokenizer (baseline) and the peak over the whole run."""

import json
import sys
from pathlib import Path


def status_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of this process image. Not ru_maxrss: Linux carries that over from the
    parent across fork and exec, so it would count the test process's own memory."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def main(model_dir: str, offload_dir: str, cpu_mem: str) -> None:
    import torch  # noqa: F401  (imports count in the baseline, not in the engine's share)
    import transformers  # noqa: F401

    from engine.engine import Engine
    from engine.options import parse_bytes
    from engine.policy import Policy
    from engine.request import Request, SamplingParams
    from engine.tokenizer import load_tokenizer

    load_tokenizer(model_dir)
    baseline = status_bytes("VmRSS")
    policy = Policy(gbs=2, num_gb=2, weight_cpu=0.0)
    engine = Engine.load(model_dir, dtype="float32", policy=policy, budgets={"cpu": parse_bytes(cpu_mem)},
                         offload_dir=offload_dir)
    reqs = [Request(str(i), "The quick brown fox", SamplingParams(max_new_tokens=4)) for i in range(4)]
    out = engine.generate(reqs)
    peak = status_bytes("VmHWM")
    print(json.dumps({"baseline": baseline, "peak": peak, "tokens": [c.token_ids for c in out],
                      "cpu_tier_peak": engine.devices.tiers["cpu"].peak}))


if __name__ == "__main__":
    main(*sys.argv[1:])
