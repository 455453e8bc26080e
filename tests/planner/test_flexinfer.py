"""FlexInfer's qualitative findings, reproduced by the planner on the server specs shipped in infra/hardware/
for Llama-2-70B (138 GB of bf16 weights, more than either GPU holds). FlexInfer's setting keeps the weights and
the KV cache in CPU memory (its GPU policy offloads them, FlexGen-like); the pins below say so."""

from pathlib import Path

import pytest

from engine.memory.weight_store import weight_placement
from planner.hardware import load_hardware
from planner.predict import predict
from planner.search import search
from planner.workload import Workload
from tests.planner.specs import LLAMA2_70B

SERVERS = Path(__file__).resolve().parents[2] / "infra" / "hardware"
SPR_H100 = SERVERS / "h100-80gb-sapphirerapids.json"
FLEXINFER_SETTING = {"weight_gpu": 0.0, "weight_cpu": 1.0, "cache_gpu": 0.0, "cache_cpu": 1.0}


@pytest.mark.parametrize("num_prompts", [1, 4])
def test_short_prompts_small_batches_run_cpu_only_on_the_amx_server(num_prompts):
    plan = search(LLAMA2_70B, load_hardware(SPR_H100), Workload(128, 32, num_prompts), pins=FLEXINFER_SETTING)
    assert (plan.policy.prefill_device, plan.policy.decode_device) == ("cpu", "cpu")



@pytest.mark.parametrize("num_prompts", [1, 4])
def test_free_placement_splits_with_the_gpu_layers_weights_resident(num_prompts):
    """Free to place weights, the planner keeps the layers that fit the GPU resident there and splits decode
    at them (FlexInfer's static split: only activations cross), which beats CPU-only."""
    hw, work = load_hardware(SPR_H100), Workload(128, 32, num_prompts)
    free = search(LLAMA2_70B, hw, work)
    p = free.policy
    assert p.decode_device == "split"
    placement = weight_placement(p, LLAMA2_70B.num_layers)
    k = p.decode_split_layer
    assert set(placement[k:]) == {"gpu"} and "gpu" not in placement[:k]
    cpu_only = search(LLAMA2_70B, hw, work, pins=FLEXINFER_SETTING)
    assert free.prediction.total_s < cpu_only.prediction.total_s


@pytest.mark.parametrize("num_prompts", [64, 256])
def test_long_prompts_large_batches_prefill_on_the_gpu_and_decode_on_the_cpu_or_split(num_prompts):
    plan = search(LLAMA2_70B, load_hardware(SPR_H100), Workload(1024, 32, num_prompts), pins=FLEXINFER_SETTING)
    assert plan.policy.prefill_device in ("gpu", "split")
    assert plan.policy.decode_device in ("cpu", "split")


def test_cpu_decode_beats_gpu_offloading_decode_with_128_in_32_out():
    hw, work = load_hardware(SPR_H100), Workload(128, 32, 8)
    for gbs in (1, 8):
        base = dict(gbs=gbs, num_gb=1, **FLEXINFER_SETTING, cpu_attention=True)
        cpu = predict(LLAMA2_70B, hw, work, _policy(base, "cpu", "cpu"))
        offload = predict(LLAMA2_70B, hw, work, _policy(base, "gpu", "gpu"))
        assert cpu.decode_token_s < offload.decode_token_s


def _policy(base, prefill, decode):
    from engine.policy import Policy

    return Policy(**base, prefill_device=prefill, decode_device=decode)


def test_shipped_specs_cite_their_sources():
    for path in SERVERS.glob("*.json"):
        hw = load_hardware(path)
        assert hw.has_gpu and "FlexInfer" in hw.sources["server"]
        assert any("estimate" in v for v in hw.sources.values())  # honest about what is not measured
