"""Every placement and per-phase compute policy gives the foundation run's greedy fp32 tokens, token for
token; the gpu tier is the simulated pool so every transfer and split path runs without CUDA."""

import pytest

from engine.engine import Engine
from engine.errors import InvalidParamsError
from engine.memory.tiers import BudgetError
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS

PROMPTS_X2 = PROMPTS + [p[::-1] for p in PROMPTS]
VARIANT = "llama_gqa_llama3"

POLICIES = {
    "cpu-gbs1": Policy(gbs=1, num_gb=1),
    "cpu-gbs3x4": Policy(gbs=3, num_gb=4),
    "weights-disk": Policy(gbs=2, num_gb=3, weight_cpu=0.0),
    "weights-split": Policy(gbs=4, num_gb=2, weight_gpu=0.5, weight_cpu=0.0, decode_device="gpu",
                            prefill_device="gpu"),
    "all-gpu": Policy(gbs=4, num_gb=2, weight_gpu=1.0, weight_cpu=0.0, cache_gpu=1.0, cache_cpu=0.0,
                      act_gpu=1.0, act_cpu=0.0, prefill_device="gpu", decode_device="gpu"),
    "cache-3-tiers-cpu-attn": Policy(gbs=5, num_gb=2, cache_gpu=0.4, cache_cpu=0.4, act_gpu=0.5, act_cpu=0.25,
                                     prefill_device="gpu", decode_device="gpu", cpu_attention=True),
    "cache-3-tiers-gpu-attn": Policy(gbs=5, num_gb=2, cache_gpu=0.4, cache_cpu=0.4, prefill_device="gpu",
                                     decode_device="gpu", cpu_attention=False),
    "cache-disk-cpu-decode": Policy(gbs=3, num_gb=2, cache_cpu=0.0, act_cpu=0.0, prefill_device="gpu"),
    "split-prefill-gpu-decode-cpu": Policy(gbs=4, num_gb=3, weight_gpu=0.5, weight_cpu=0.25,
                                           prefill_device="split", prefill_split_layer=1),
    "split-both": Policy(gbs=2, num_gb=2, prefill_device="split", prefill_split_layer=1,
                         decode_device="split", decode_split_layer=1, cache_gpu=0.5, cache_cpu=0.5),
}


@pytest.fixture(scope="module")
def reference(checkpoint):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32")
    return [c.token_ids for c in engine.generate(_reqs())]


def _reqs():
    return [Request(str(i), p, SamplingParams(max_new_tokens=10)) for i, p in enumerate(PROMPTS_X2)]


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_gives_the_same_tokens(checkpoint, reference, tmp_path, name):
    policy = POLICIES[name]
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, simulate_gpu=True,
                         offload_dir=tmp_path)
    got = engine.generate(_reqs())
    assert [c.token_ids for c in got] == reference
    moved = engine.devices.links.moved
    if "disk" in engine.weights.placement:
        assert moved.get("disk->cpu", 0) > 0
    if policy.uses_gpu() and policy.weight_gpu < 1:
        assert moved.get("cpu->gpu", 0) > 0, moved
    engine.weights.close()


def test_disk_weights_are_written_once_and_reused(checkpoint, tmp_path):
    """4-bit disk layers are converted once into the offload folder (plain ones in the checkpoint's own dtype are
    read from the checkpoint itself: tests/engine/memory/test_checkpoint_direct.py)."""
    policy = Policy(weight_cpu=0.0, compress_weight=True)
    Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, offload_dir=tmp_path)
    files = sorted(tmp_path.rglob("layer_*.safetensors"))
    assert len(files) == 2
    stamps = [f.stat().st_mtime_ns for f in files]
    Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, offload_dir=tmp_path)
    assert [f.stat().st_mtime_ns for f in sorted(tmp_path.rglob("layer_*.safetensors"))] == stamps


def test_gpu_policy_without_gpu_is_refused(checkpoint):
    with pytest.raises(InvalidParamsError, match="no CUDA device"):
        Engine.load(checkpoint(VARIANT), policy=Policy(decode_device="gpu"))


def test_budgets_refuse_before_any_work(checkpoint, tmp_path):
    model = checkpoint(VARIANT)
    with pytest.raises(BudgetError, match="cpu tier"):
        Engine.load(model, dtype="float32", budgets={"cpu": 10_000})
    engine = Engine.load(model, dtype="float32", budgets={"cpu": 600_000}, policy=Policy(gbs=64, num_gb=4))
    with pytest.raises(BudgetError, match="KV cache and activations on the cpu tier"):
        engine.generate(_reqs() * 30)


def test_policy_round_trips_and_validates():
    p = POLICIES["split-both"]
    assert Policy.from_json(p.to_json()) == p
    assert Policy.from_percent((0, 50, 0, 100, 0, 100)).weight_disk == 0.5
    for bad in (dict(gbs=0), dict(weight_gpu=0.7, weight_cpu=0.7), dict(decode_device="tpu"),
                dict(prefill_device="split")):
        with pytest.raises(InvalidParamsError):
            Policy(**bad)
