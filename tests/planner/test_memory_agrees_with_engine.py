"""The planner's predicted peak per tier, less the working memory the engine does not account, equals what the
engine reserves for the same policy: its weights and globals at load, plus `BlockExecutor.block_bytes` for a block
(the engine's budget check), in float32 and bfloat16, with and without a shared prefix."""

import dataclasses

import pytest
import torch

from engine.compression.int4 import Int4Packed
from engine.compression.qlinear import QWeight
from engine.engine import Engine
from engine.kernels.int4_tiles import Int4Tiles
from engine.memory.footprint import global_bytes
from engine.policy import Policy
from engine.spec import load_model_spec
from planner.memory_model import working_bytes
from planner.predict import memory_need, realized_policy
from planner.workload import TIERS, Workload
from tests.planner.specs import cpu_machine

POLICIES = [
    Policy(gbs=2, num_gb=2),
    Policy(gbs=2, num_gb=2, weight_gpu=0.5, weight_cpu=0.0, cache_gpu=0.5, cache_cpu=0.5, act_cpu=0.5,
           prefill_device="gpu", decode_device="split", decode_split_layer=1),
    Policy(gbs=3, num_gb=1, weight_cpu=0.0, cache_cpu=0.34, act_gpu=1.0, act_cpu=0.0, compress_weight=True,
           compress_cache=True, prefill_device="gpu", decode_device="gpu"),
    Policy(gbs=2, num_gb=2, compress_weight=True, weight_format="int8"),
    Policy(gbs=2, num_gb=1, weight_cpu=0.5, compress_weight=True, weight_format="int8"),
    Policy(gbs=2, num_gb=1, weight_cpu=0.5, compress_weight=True, weight_format="bf16"),
    Policy(gbs=2, num_gb=2, cache_cpu=0.5, act_cpu=0.5),
    Policy(gbs=4, num_gb=1, cache_gpu=0.75, cache_cpu=0.25, act_gpu=0.5, act_cpu=0.5, decode_device="gpu"),
]
IDS = ["cpu", "split", "compressed-disk", "int8", "int8-disk", "bf16-disk", "plain-cache-disk", "cache-gpu"]
SHARED = 5  # prefix tokens of a block that shares one


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_home_bytes_match_the_engine(tmp_path, tiny_llama_dir, policy, dtype):
    check_home_bytes(tmp_path, tiny_llama_dir, policy, dtype)


@pytest.mark.parametrize("policy", [Policy(gbs=2, num_gb=2, compress_weight=True),
                                    Policy(gbs=2, num_gb=1, weight_cpu=0.5, compress_weight=True)],
                         ids=["int4", "int4-disk"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_int4_kernels_layout_counts_where_the_engine_keeps_it(tmp_path, tiny_llama_dir, policy, dtype,
                                                                  compressed_kernels):
    """CPU-resident 4-bit layers packed for the int4 kernel (which wins at every row count here) keep the
    project's tiles in place of their codes, or aten's layout beside them where the project's kernels are not
    built: the engine reserves what it keeps and the planner counts it."""
    eng = check_home_bytes(tmp_path, tiny_llama_dir, policy, dtype)
    held = {}
    for layer in eng.weights.resident.values():
        for value in layer.values():
            collect_tensors(value, held)
    packed = [v for layer in eng.weights.resident.values() for v in layer.values() if isinstance(v, QWeight)]
    assert packed and all(isinstance(v.fast, (Int4Tiles, Int4Packed)) for v in packed)
    assert all((v.stored is None) == isinstance(v.fast, Int4Tiles) for v in packed)
    elem = torch.empty((), dtype=eng.dtype).element_size()
    globals_bytes = global_bytes(load_model_spec(tiny_llama_dir), elem, policy)  # the int8 head included
    assert eng.devices.tiers["cpu"].used - globals_bytes == sum(held.values())


def collect_tensors(value, out: dict) -> None:
    """Every tensor a kept weight holds (its stored codes and any kernel layout), by storage."""
    if isinstance(value, torch.Tensor):
        out[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            collect_tensors(getattr(value, f.name), out)


def check_home_bytes(tmp_path, tiny_llama_dir, policy, dtype="float32"):
    spec = load_model_spec(tiny_llama_dir)
    eng = Engine.load(tiny_llama_dir, dtype=dtype, policy=policy, simulate_gpu=True, offload_dir=tmp_path)
    try:
        rows, S, T = policy.block_size, 7, 12
        real = realized_policy(policy, spec.num_layers)
        for shared in (0, SHARED):
            engine_bytes = eng.executor(policy).block_bytes(rows, S, T, shared=shared)
            for tier in TIERS:
                engine_bytes[tier] += eng.devices.tiers[tier].used  # weights and globals placed at load
            work = Workload(prompt_len=S, gen_len=T - S, num_prompts=rows, dtype=dtype, shared_len=shared)
            for phase, peak in memory_need(spec, cpu_machine(), work, real, rows).items():
                scratch = working_bytes(spec, work, real, phase)
                ours = {t: peak[t] - scratch[t] for t in TIERS}
                assert ours == pytest.approx(engine_bytes, rel=0, abs=1), (phase, shared)
        return eng
    finally:
        eng.weights.close()


@pytest.mark.parametrize("variant", ["mixtral", "qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("policy", [POLICIES[0], POLICIES[2], POLICIES[3]], ids=["cpu", "compressed-disk", "int8"])
def test_a_mixtures_bytes_match_the_engine(tmp_path, checkpoint, variant, policy):
    """Every expert is stored (all of them count, compressed or not), its router stays as it is."""
    check_home_bytes(tmp_path, checkpoint(variant), policy)


@pytest.mark.parametrize("policy", [POLICIES[0], POLICIES[2], POLICIES[4]], ids=["cpu", "compressed-disk", "int8-disk"])
def test_mxfp4_experts_bytes_match_the_engine(tmp_path, policy):
    """gpt-oss's MXFP4 experts count at their checkpoint bytes where the run keeps them packed (every layer on the
    CPU, the kernels built), dequantized where it does not (a layer on the GPU)."""
    from tests.quantized_checkpoints import make_mxfp4_gpt_oss

    check_home_bytes(tmp_path, make_mxfp4_gpt_oss(tmp_path / "checkpoint"), policy)
