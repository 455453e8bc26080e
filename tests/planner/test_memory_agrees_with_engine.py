"""The planner's home memory per tier equals what the engine reserves for the same policy: its weights and
globals at load, plus `BlockExecutor.block_bytes` for a block (the engine's budget check)."""

import pytest

from engine.generate import Engine
from engine.policy import Policy
from engine.spec import load_model_spec
from planner.memory_model import disk_staging_bytes, home_bytes
from planner.predict import realized_policy
from planner.workload import PLACEMENT, TIERS, Workload

POLICIES = [
    Policy(gbs=2, num_gb=2),
    Policy(gbs=2, num_gb=2, weight_gpu=0.5, weight_cpu=0.0, cache_gpu=0.5, cache_cpu=0.5, act_cpu=0.5,
           prefill_device="gpu", decode_device="split", decode_split_layer=1),
    Policy(gbs=3, num_gb=1, weight_cpu=0.0, cache_cpu=0.34, act_gpu=1.0, act_cpu=0.0, compress_weight=True,
           compress_cache=True, prefill_device="gpu", decode_device="gpu"),
    Policy(gbs=2, num_gb=2, compress_weight=True, weight_format="int8"),
    Policy(gbs=2, num_gb=1, weight_cpu=0.5, compress_weight=True, weight_format="int8"),
]


@pytest.mark.parametrize("policy", POLICIES, ids=["cpu", "split", "compressed-disk", "int8", "int8-disk"])
def test_home_bytes_match_the_engine(tmp_path, tiny_llama_dir, policy):
    spec = load_model_spec(tiny_llama_dir)
    eng = Engine.load(tiny_llama_dir, dtype="float32", policy=policy, simulate_gpu=True, offload_dir=tmp_path)
    try:
        rows, S, T = policy.block_size, 7, 12
        engine_bytes = eng.executor(policy).block_bytes(rows, S, T)
        for tier in TIERS:
            engine_bytes[tier] += eng.devices.tiers[tier].used  # weights and globals placed at load
        work = Workload(prompt_len=S, gen_len=T - S, num_prompts=rows, dtype="float32")
        real = realized_policy(policy, spec.num_layers)
        x = [getattr(real, n) for n in PLACEMENT]
        ours = {t: a.at(x) for t, a in home_bytes(spec, work, real, rows).items()}
        if real.weight_disk > 0:
            ours["cpu"] += disk_staging_bytes(spec, work, policy)
        assert ours == pytest.approx(engine_bytes, rel=0, abs=1)
    finally:
        eng.weights.close()
