"""FlexInfer's per-phase policies on the GPU: the static split keeps its GPU layers' weights resident and moves
only activations; weights streamed to the GPU reuse two staging sets; prefill's KV cache crosses once, to where
decode reads it, compressed when the cache is. The `gpu`-marked tests run the policies on real CUDA (fp32 tokens
equal the CPU run token for token; bf16 agrees on at least 95 % of tokens); the others run on the simulated gpu
tier, where every copy is real and synchronous."""

import pytest
import torch

import engine.engine as engine_module
from engine.engine import Engine
from engine.memory.footprint import int4_row_bytes
from engine.memory.weight_store import globals_tier, weight_placement
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec
from tests.engine.reference import PROMPTS
from tests.engine.test_policies import POLICIES

PROMPTS_X2 = PROMPTS + [p[::-1] for p in PROMPTS]
VARIANT = "llama_gqa_llama3"
LAYERS = 2  # the test checkpoints' depth

GPU_POLICIES = {
    **POLICIES,
    "offload-both": Policy(gbs=4, num_gb=2, prefill_device="gpu", decode_device="gpu"),
    "prefill-gpu-decode-cpu": Policy(gbs=4, num_gb=2, prefill_device="gpu"),
    "prefill-gpu-decode-split": Policy(gbs=3, num_gb=2, weight_gpu=0.5, weight_cpu=0.5, prefill_device="gpu",
                                       decode_device="split", decode_split_layer=1),
    "split-resident": Policy(gbs=4, num_gb=2, weight_gpu=0.5, weight_cpu=0.5, prefill_device="split",
                             prefill_split_layer=1, decode_device="split", decode_split_layer=1),
    "offload-gpu-attention": Policy(gbs=4, num_gb=2, prefill_device="gpu", decode_device="gpu",
                                    cpu_attention=False),
}
COMPRESSED = {
    "prefill-gpu-decode-cpu-4bit": Policy(gbs=4, num_gb=2, prefill_device="gpu", compress_weight=True,
                                          compress_cache=True),
    "offload-4bit-gpu-attention": Policy(gbs=4, num_gb=2, prefill_device="gpu", decode_device="gpu",
                                         compress_weight=True, compress_cache=True, cpu_attention=False),
    "split-4bit": Policy(gbs=4, num_gb=2, weight_gpu=0.5, weight_cpu=0.5, prefill_device="gpu",
                         decode_device="split", decode_split_layer=1, compress_weight=True, compress_cache=True),
}


# the same policies on other shapes: OPT (the GPU benchmark's family) and a 5-layer Llama
OTHER_SHAPES = {
    "opt": {"offload-both": GPU_POLICIES["offload-both"], "split-resident": GPU_POLICIES["split-resident"],
            "prefill-gpu-decode-cpu-4bit": COMPRESSED["prefill-gpu-decode-cpu-4bit"]},
    "llama_deep": {
        "offload-both": GPU_POLICIES["offload-both"],
        "split-resident-3": Policy(gbs=4, num_gb=2, weight_gpu=0.4, weight_cpu=0.6, prefill_device="split",
                                   prefill_split_layer=3, decode_device="split", decode_split_layer=3),
        "prefill-gpu-decode-split-2-part-resident": Policy(
            gbs=3, num_gb=2, weight_gpu=0.4, weight_cpu=0.4, prefill_device="gpu", decode_device="split",
            decode_split_layer=2, cache_gpu=0.5, cache_cpu=0.5),
        "offload-gpu-attention-4bit": COMPRESSED["offload-4bit-gpu-attention"],
    },
}
SHAPE_CASES = [(variant, name) for variant, policies in OTHER_SHAPES.items() for name in policies]


def _reqs(n=10):
    return [Request(str(i), p, SamplingParams(max_new_tokens=n)) for i, p in enumerate(PROMPTS_X2)]


def _on_cpu(policy: Policy) -> Policy:
    """The same blocks and compression, everything on the CPU: the reference run of a GPU policy."""
    return Policy(gbs=policy.gbs, num_gb=policy.num_gb, compress_weight=policy.compress_weight,
                  compress_cache=policy.compress_cache)


def _tokens(model, dtype, policy=None, simulate=False, tmp_path=None, n=10):
    engine = Engine.load(model, dtype=dtype, policy=policy, simulate_gpu=simulate, offload_dir=tmp_path)
    try:
        return [c.token_ids for c in engine.generate(_reqs(n))], engine
    finally:
        engine.weights.close()


@pytest.fixture(scope="module")
def cpu_reference(checkpoint):
    return {dtype: _tokens(checkpoint(VARIANT), dtype)[0] for dtype in ("float32", "bfloat16")}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_POLICIES))
def test_cuda_fp32_tokens_equal_the_cpu_run(checkpoint, cpu_reference, tmp_path, name):
    got, engine = _tokens(checkpoint(VARIANT), "float32", GPU_POLICIES[name], tmp_path=tmp_path)
    assert engine.devices.has_cuda and engine.devices.pin_host
    assert got == cpu_reference["float32"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_POLICIES))
def test_cuda_bf16_agrees_on_95_percent_of_tokens(checkpoint, cpu_reference, tmp_path, name):
    got, _ = _tokens(checkpoint(VARIANT), "bfloat16", GPU_POLICIES[name], tmp_path=tmp_path)
    assert _agreement(got, cpu_reference["bfloat16"]) >= 0.95


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(COMPRESSED))
def test_cuda_compressed_policies_agree_with_the_cpu_compressed_run(checkpoint, tmp_path, name):
    """4-bit runs: the GPU quantizes the cache and dequantizes the weights itself; it must agree with the
    same compression on the CPU (all on the CPU: same formats, float32)."""
    policy = COMPRESSED[name]
    want, _ = _tokens(checkpoint(VARIANT), "float32", _on_cpu(policy))
    got, _ = _tokens(checkpoint(VARIANT), "float32", policy, tmp_path=tmp_path)
    assert _agreement(got, want) >= 0.95


@pytest.mark.gpu
@pytest.mark.parametrize("variant, name", SHAPE_CASES)
def test_cuda_other_shapes_agree_with_their_cpu_run(checkpoint, tmp_path, variant, name):
    policy = OTHER_SHAPES[variant][name]
    want, _ = _tokens(checkpoint(variant), "float32", _on_cpu(policy))
    got, _ = _tokens(checkpoint(variant), "float32", policy, tmp_path=tmp_path)
    if policy.compress_weight or policy.compress_cache:
        assert _agreement(got, want) >= 0.95
    else:
        assert got == want


@pytest.mark.parametrize("variant, name", SHAPE_CASES)
def test_simulated_other_shapes_equal_their_cpu_run(checkpoint, tmp_path, monkeypatch, variant, name):
    policy = OTHER_SHAPES[variant][name]
    with monkeypatch.context() as m:
        if globals_tier(policy, load_model_spec(checkpoint(variant)).num_layers) == "gpu":
            # a head on the GPU computes in the compute dtype even with compressed weights (head_in_int8): the
            # reference keeps it so too, for the layers' work to be compared alone
            m.setattr(engine_module, "head_in_int8", lambda policy, where: False)
        want, _ = _tokens(checkpoint(variant), "float32", _on_cpu(policy))
    got, engine = _tokens(checkpoint(variant), "float32", policy, simulate=True, tmp_path=tmp_path)
    assert got == want
    if name.startswith("split-resident"):
        assert engine.weights.staging_bytes() == 0
        k = policy.decode_split_layer
        assert engine.weights.placement[k:] == ["gpu"] * (engine.spec.num_layers - k)


def _agreement(got: list[list[int]], want: list[list[int]]) -> float:
    """Share of positions where the greedy tokens agree, counted up to each row's first difference and then as
    disagreeing (a row that diverges continues from a different prefix)."""
    same = total = 0
    for g, w in zip(got, want):
        total += max(len(g), len(w))
        for a, b in zip(g, w):
            if a != b:
                break
            same += 1
    return same / total


@pytest.mark.parametrize("name", list(COMPRESSED))
def test_simulated_compressed_policies_equal_the_cpu_compressed_run(checkpoint, tmp_path, name):
    policy = COMPRESSED[name]
    want, _ = _tokens(checkpoint(VARIANT), "float32", _on_cpu(policy))
    got, _ = _tokens(checkpoint(VARIANT), "float32", policy, simulate=True, tmp_path=tmp_path)
    assert got == want


def test_a_split_keeps_its_gpu_layers_weights_resident(checkpoint, cpu_reference, tmp_path):
    """Layers below the split compute on the CPU from CPU memory, the others on the GPU from GPU memory: no
    weight is staged, and per step only activations (and decode's q / outputs) cross."""
    policy = GPU_POLICIES["split-resident"]
    assert weight_placement(policy, LAYERS) == ["cpu", "gpu"]
    got, engine = _tokens(checkpoint(VARIANT), "float32", policy, simulate=True, tmp_path=tmp_path)
    assert got == cpu_reference["float32"]
    assert engine.weights.staging_bytes() == 0 and engine.weights._staging_free == []  # no layer was ever staged
    layer = engine.weights.layer_bytes[1]
    crossed = engine.devices.links.moved["cpu->gpu"]
    steps = 10 * 2  # tokens x blocks (10 rows in blocks of 8)
    assert crossed < steps * layer / 4, (crossed, layer)


def test_gpu_placement_follows_decode_then_prefill_and_upper_layers():
    p = Policy(weight_gpu=0.5, weight_cpu=0.25, prefill_device="split", prefill_split_layer=2,
               decode_device="split", decode_split_layer=5)
    # decode's GPU layers 5..7 first, then prefill's from the top (4, 3, 2), then the rest spread cpu/disk
    placement = weight_placement(p, 8)
    assert [j for j, t in enumerate(placement) if t == "gpu"] == [4, 5, 6, 7]
    assert placement.count("cpu") == 2 and placement.count("disk") == 2
    # without a split every layer is alike: the tiers are spread evenly, as before
    even = weight_placement(Policy(weight_gpu=0.5, weight_cpu=0.5, prefill_device="gpu", decode_device="gpu"), 4)
    assert even == ["gpu", "cpu", "gpu", "cpu"]


def test_streamed_weights_reuse_two_staging_sets(checkpoint, cpu_reference, tmp_path):
    """GPU offloading streams every layer every step into reused buffers: at most two sets ever exist (the
    layer computing and the one prefetched), and each step moves every layer's weights once."""
    got, engine = _tokens(checkpoint(VARIANT), "float32", GPU_POLICIES["offload-both"], simulate=True,
                          tmp_path=tmp_path)
    assert got == cpu_reference["float32"]
    store = engine.weights
    assert store._in_use is None  # the call handed every set back when it ended
    assert 1 <= len({id(s) for s in store._staging_free}) == len(store._staging_free) <= 2
    assert store.staging_bytes() == 2 * max(store.layer_bytes)


def test_prefill_kv_crosses_once_and_decode_moves_nothing(checkpoint, tmp_path):
    """Prefill on the GPU, decode on the CPU with the cache and activations in CPU memory: all GPU traffic is
    prefill's (weights in, K/V and activations out); decode steps add none."""
    policy = GPU_POLICIES["prefill-gpu-decode-cpu"]
    one = _tokens(checkpoint(VARIANT), "float32", policy, simulate=True, tmp_path=tmp_path, n=1)[1]
    many = _tokens(checkpoint(VARIANT), "float32", policy, simulate=True, tmp_path=tmp_path, n=10)[1]
    assert one.devices.links.moved == many.devices.links.moved
    assert many.devices.links.moved["gpu->cpu"] > 0


def test_a_compressed_cache_crosses_compressed(checkpoint, tmp_path):
    """Prefill on the GPU into a 4-bit CPU cache quantizes on the GPU: the K/V cross at the compressed size
    (besides them only the LM head's last position crosses: activations stay on the GPU)."""
    moved = {}
    for compress in (False, True):
        policy = Policy(gbs=4, num_gb=2, prefill_device="gpu", compress_cache=compress, act_gpu=1.0, act_cpu=0.0)
        engine = _tokens(checkpoint(VARIANT), "float32", policy, simulate=True, tmp_path=tmp_path, n=1)[1]
        moved[compress] = engine.devices.links.moved["gpu->cpu"]
    D = engine.spec.head_dim
    ratio = int4_row_bytes(D) / (D * 4)
    assert moved[True] / moved[False] == pytest.approx(ratio, abs=0.03), (moved, ratio)


@pytest.mark.gpu
def test_cuda_host_buffers_that_cross_are_pinned(checkpoint, tmp_path):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=GPU_POLICIES["offload-both"],
                         offload_dir=tmp_path)
    try:
        assert all(t.is_pinned() for lw in engine.weights.resident.values() for t in lw.values())
        assert torch.cuda.is_available()
    finally:
        engine.weights.close()


class _Event(tuple):
    """(stream name, sequence number) of a recorded event; the host waiting for it is logged."""

    log: list = []

    def synchronize(self):
        self.log.append(("host waits", self))


class _RecordingStream:
    """Stands in for a CUDA stream: logs each event it records and each event it is made to wait for."""

    def __init__(self, name: str, log: list):
        self.name, self.log, self.count = name, log, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def record(self):
        self.count += 1
        event = _Event((self.name, self.count))
        event.log = self.log
        self.log.append(("record", event))
        return event

    def wait(self, event):
        self.log.append((f"{self.name} waits", event))


def test_streamed_weights_follow_the_event_protocol(checkpoint, tmp_path):
    """The ordering that CUDA enforces through events, checked with recording streams: every prefetched layer
    is waited for by the compute stream before use, and the weights stream refills buffers only after waiting
    for the compute stream's hand-back event (never for one of its own)."""
    engine = Engine.load(checkpoint("llama_deep"), dtype="float32", policy=GPU_POLICIES["offload-both"],
                         simulate_gpu=True, offload_dir=tmp_path)
    log: list = []
    engine.devices.compute_stream = _RecordingStream("compute", log)
    engine.devices.streams["weights"] = _RecordingStream("weights", log)
    try:
        engine.generate(_reqs(4))
    finally:
        engine.weights.close()
    ready = [e for kind, e in log if kind == "record" and e[0] == "weights"]
    waited_ready = [e for kind, e in log if kind == "compute waits"]
    released = [e for kind, e in log if kind == "record" and e[0] == "compute"]
    refills = [e for kind, e in log if kind == "weights waits"]
    assert ready and released
    assert all(e[0] == "weights" for e in waited_ready) and all(e is None or e[0] == "compute" for e in refills)
    assert len(waited_ready) >= len(ready) - 1  # at most the last step's prefetch of layer 0 is never taken
    assert sorted(waited_ready) == waited_ready and len(set(waited_ready)) == len(waited_ready)
    # only the very first load comes before any hand-back; every later one waits for a hand-back, in order
    handed = [e for e in refills if e is not None]
    assert len(handed) == len(refills) - 1 and set(handed) <= set(released) and sorted(handed) == handed


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "4-bit"])
def test_prefill_kv_stores_land_before_decode_reads_them(checkpoint, cpu_reference, tmp_path, compressed):
    """The asynchronous K/V store path of a GPU prefill into a host cache, run with recording streams: each store
    waits for the compute stream, is staged, and lands in the cache only after the host waited for its event;
    the tokens equal the CPU run's, so every staged row reached the cache before decode read it."""
    policy = COMPRESSED["prefill-gpu-decode-cpu-4bit"] if compressed else GPU_POLICIES["prefill-gpu-decode-cpu"]
    want = (_tokens(checkpoint(VARIANT), "float32", Policy(gbs=4, num_gb=2, compress_weight=True,
                                                              compress_cache=True))[0]
            if compressed else cpu_reference["float32"])
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, simulate_gpu=True, offload_dir=tmp_path)
    log: list = []
    engine.devices.async_kv_stores = True
    engine.devices.compute_stream = _RecordingStream("compute", log)
    engine.devices.streams["kv"] = _RecordingStream("kv", log)
    try:
        got = [c.token_ids for c in engine.generate(_reqs())]
    finally:
        engine.weights.close()
    assert got == want
    stores = [e for kind, e in log if kind == "record" and e[0] == "kv"]
    landed = [e for kind, e in log if kind == "host waits"]
    assert len(stores) == LAYERS * 3  # 10 rows in blocks of 8 and 2, GPU batches of 4: 2 + 1 batches per layer
    assert sorted(landed) == sorted(stores)  # every store was waited for once before its rows were used
    assert all(e[0] == "compute" for kind, e in log if kind == "kv waits")
