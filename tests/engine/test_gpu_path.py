"""The GPU path's second part: the embeddings and the LM head placed like a layer, activations crossing on their
own stream (and not at all between layers with one GPU batch per block), and decode's fetch of a host cache
through pinned staging on the kv stream.

On the simulated gpu tier the side-stream paths run with deferred streams: a copy queued on a side stream runs
only when an event recorded after it is waited for (by the host or another stream), as on CUDA, where it may
run any time before. A buffer read before its copy's event was waited for then holds stale data, and the
tokens differ from the CPU run's; so token equality checks the event protocol. The `gpu`-marked tests run the
same policies on CUDA."""

import threading
from dataclasses import replace

import pytest
import torch

from engine.engine import Engine
from engine.memory.placement import PlacedActivations
from engine.memory.tiers import BudgetError
from engine.memory.weight_store import globals_tier
from engine.policy import Policy
from tests.engine.test_gpu import COMPRESSED, GPU_POLICIES, VARIANT, _agreement, _on_cpu, _reqs

SIDE_POLICIES = {name: GPU_POLICIES[name] for name in ("offload-both", "split-resident", "offload-gpu-attention",
                                                       "prefill-gpu-decode-split")}
SIDE_POLICIES["offload-4bit-gpu-attention"] = COMPRESSED["offload-4bit-gpu-attention"]


class _Event(tuple):
    """(stream name, number) of a recorded event; waiting for it runs what its stream queued before it."""

    def synchronize(self):
        self.log.append(("host waits", self))
        self.stream.flush(self.upto)


class _DeferredStream:
    """Stands in for a CUDA stream: logs the events it records and waits for, and holds back the side copies
    queued on it until an event recorded after them is waited for."""

    active: list = []  # the streams entered (`with`) on the main thread, innermost last

    def __init__(self, name: str, log: list):
        self.name, self.log, self.count, self.queue, self.done = name, log, 0, [], 0

    def __enter__(self):
        _DeferredStream.active.append(self)
        return self

    def __exit__(self, *exc):
        _DeferredStream.active.pop()
        return False

    def record(self):
        self.count += 1
        event = _Event((self.name, self.count))
        event.log, event.stream, event.upto = self.log, self, len(self.queue)
        self.log.append(("record", event))
        return event

    def wait(self, event):
        self.log.append((f"{self.name} waits", event))
        if event is not None:
            event.stream.flush(event.upto)

    def flush(self, upto: int) -> None:
        while self.done < upto:
            self.queue[self.done]()
            self.done += 1


def _deferred(engine: Engine) -> list:
    """Turn on the side-stream paths (as with CUDA) with deferred streams; returns their log."""
    d, log = engine.devices, []
    d.async_moves = d.async_kv_stores = True
    d.compute_stream = _DeferredStream("compute", log)
    for name in ("act", "kv"):
        d.streams[name] = _DeferredStream(name, log)
    run = d.copy_into

    def copy_into(out, x, src, dst, side=False):
        if side and _DeferredStream.active and threading.current_thread() is threading.main_thread():
            _DeferredStream.active[-1].queue.append(lambda: run(out, x, src, dst, side))
            return out
        return run(out, x, src, dst, side)

    d.copy_into = copy_into
    take, read_by = d.staging.take, d.staging.read_by

    def logged_take(likes):
        slot, bufs = take(likes)
        log.append(("fill", slot))
        return slot, bufs

    def logged_read_by(slot, event):
        log.append(("fetch", (slot, event)))
        read_by(slot, event)

    d.staging.take, d.staging.read_by = logged_take, logged_read_by
    return log


def _run(model, policy, tmp_path, n=10, simulate=True, deferred=False, rows=None):
    engine = Engine.load(model, dtype="float32", policy=policy, simulate_gpu=simulate, offload_dir=tmp_path)
    log = _deferred(engine) if deferred else []
    try:
        reqs = _reqs(n)[:rows]
        return [c.token_ids for c in engine.generate(reqs)], engine, log
    finally:
        engine.weights.close()


def _cpu_tokens(model, policy, n=10, rows=None):
    return _run(model, _on_cpu(policy), None, n, simulate=False, rows=rows)[0]


# -- the embeddings and the LM head ---------------------------------------------------------------------------


def test_head_and_embeddings_follow_decodes_last_layer_not_the_fractions():
    L = 4
    assert globals_tier(Policy(), L) == "cpu"
    assert globals_tier(Policy(decode_device="gpu"), L) == "gpu"
    assert globals_tier(Policy(decode_device="split", decode_split_layer=3), L) == "gpu"
    assert globals_tier(Policy(prefill_device="gpu"), L) == "cpu"  # FlexInfer's phase switch: decode on the CPU
    for weight_gpu in (0.0, 0.5, 1.0):  # solved fractions never move them
        p = Policy(weight_gpu=weight_gpu, weight_cpu=1 - weight_gpu, decode_device="gpu")
        assert globals_tier(p, L) == "gpu"


@pytest.mark.parametrize("name", ["offload-both", "split-resident", "prefill-gpu-decode-cpu"])
def test_simulated_head_on_its_tier_equals_the_cpu_run(checkpoint, tmp_path, name):
    policy = GPU_POLICIES[name]
    got, engine, _ = _run(checkpoint(VARIANT), policy, tmp_path)
    assert got == _cpu_tokens(checkpoint(VARIANT), policy)
    where = "cpu" if name == "prefill-gpu-decode-cpu" else "gpu"
    assert engine.globals_on == where
    glob = sum(t.numel() * t.element_size() for t in engine.gw.values())
    layers = sum(n for n, t in zip(engine.weights.layer_bytes, engine.weights.placement) if t == "gpu")
    assert engine.devices.tiers["gpu"].used == layers + (glob if where == "gpu" else 0)


def test_head_that_does_not_fit_the_gpu_budget_is_refused(checkpoint, tmp_path):
    with pytest.raises(BudgetError, match="embeddings and head.*gpu tier"):
        Engine.load(checkpoint(VARIANT), dtype="float32", policy=GPU_POLICIES["offload-both"], simulate_gpu=True,
                    offload_dir=tmp_path, budgets={"gpu": 1024})


# -- activations ------------------------------------------------------------------------------------------


def _crossed(engine) -> int:
    moved = engine.devices.links.moved
    return moved.get("cpu->gpu", 0) + moved.get("gpu->cpu", 0)


def test_one_gpu_batch_keeps_activations_on_the_gpu_between_layers(checkpoint, tmp_path):
    """Prefill only (one step), 8 rows in one block, every layer, its weights and the head on the GPU (so only
    ids, activations, K/V and logits cross). With two GPU batches, activations
    placed on the CPU cross after the embedding, before and after every layer, and before the head (its last
    position); with one GPU batch they never cross. Placed on the GPU they never cross either way."""
    model, rows = checkpoint(VARIANT), 8
    crossed = {}
    for gbs, num_gb in ((4, 2), (8, 1)):
        for act in ("cpu", "gpu"):
            policy = Policy(gbs=gbs, num_gb=num_gb, prefill_device="gpu", decode_device="gpu", weight_gpu=1.0,
                            weight_cpu=0.0, act_gpu=float(act == "gpu"), act_cpu=float(act == "cpu"))
            got, engine, _ = _run(model, policy, tmp_path, n=1, rows=rows)
            assert got == _cpu_tokens(model, policy, n=1, rows=rows)
            crossed[gbs, act] = _crossed(engine)
    S = max(len(engine.tokenizer(r.prompt)["input_ids"]) for r in _reqs()[:rows])
    H, L = engine.spec.hidden_size, engine.spec.num_layers
    assert crossed[4, "cpu"] - crossed[4, "gpu"] == rows * H * 4 * (S * (1 + 2 * L) + 1)
    assert crossed[8, "cpu"] == crossed[8, "gpu"]


@pytest.mark.parametrize("name", list(SIDE_POLICIES))
def test_side_stream_copies_follow_the_event_protocol(checkpoint, tmp_path, name):
    """Activations on the act stream and decode's cache fetch on the kv stream, with deferred streams: the
    tokens equal the CPU run's (no buffer was read or rewritten before its copy's event was waited for); side
    streams only ever wait for the compute stream, and the compute stream only for side streams."""
    policy = SIDE_POLICIES[name]
    got, engine, log = _run(checkpoint(VARIANT), policy, tmp_path, deferred=True)
    assert got == _cpu_tokens(checkpoint(VARIANT), policy)
    assert all(e[0] == "compute" for kind, e in log if kind in ("act waits", "kv waits"))
    assert all(e[0] in ("act", "kv") for kind, e in log if kind == "compute waits" and e is not None)
    assert any(kind == "record" and e[0] == "act" for kind, e in log)
    if name == "split-resident":  # the CPU layer reads what the GPU stored: the host waited for it
        assert any(kind == "host waits" and e[0] == "act" for kind, e in log)


def test_deferred_streams_catch_a_missing_host_wait(checkpoint, tmp_path, monkeypatch):
    """The check above can fail: without the host's wait for the act stream, the CPU layer of a split reads
    hidden states the GPU has not stored yet, and the tokens differ."""
    monkeypatch.setattr(PlacedActivations, "_host_may_touch", lambda self: None)
    policy = SIDE_POLICIES["split-resident"]
    got, _, _ = _run(checkpoint(VARIANT), policy, tmp_path, deferred=True)
    assert got != _cpu_tokens(checkpoint(VARIANT), policy)


# -- decode's fetch of a host cache -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["offload-gpu-attention", "offload-4bit-gpu-attention"])
def test_strided_cache_fetch_goes_through_reused_staging_on_the_kv_stream(checkpoint, tmp_path, name):
    """GPU decode attention over a CPU cache: a layer's K and V (every part of a 4-bit one: codes, minimums,
    scales) are gathered into one of the two reused staging sets and cross on the kv stream under one event,
    which the compute stream waits for; the host refills a set only after waiting for the copies that last read
    it; the bytes crossing are those of the direct path (weights resident on the GPU here, so that nothing else
    crosses)."""
    policy = replace(SIDE_POLICIES[name], weight_gpu=1.0, weight_cpu=0.0)  # no weight crosses: links exact
    got, engine, log = _run(checkpoint(VARIANT), policy, tmp_path, deferred=True)
    direct = _run(checkpoint(VARIANT), policy, tmp_path)[1]
    assert got == _cpu_tokens(checkpoint(VARIANT), policy)
    assert engine.devices.links.moved == direct.devices.links.moved
    _check_staging_protocol(log, len(engine.devices.staging.sets))
    assert [len(s) for s in engine.devices.staging.sets] == [6 if policy.compress_cache else 2] * 2


def _check_staging_protocol(log: list, sets: int) -> None:
    """Each fetch's copies are waited for by the compute stream; each refill of a staging set comes after the
    host waited for the copies that last read it."""
    fetches = [e for kind, e in log if kind == "fetch"]
    waited = {e for kind, e in log if kind == "compute waits"}
    assert len(fetches) > sets and all(e in waited for _, e in fetches)
    last, host_waited = {}, set()
    for kind, e in log:
        if kind == "host waits":
            host_waited.add(e)
        elif kind == "fill" and e in last:
            assert last[e] in host_waited, f"set {e} refilled before the copy {last[e]} that read it was done"
        elif kind == "fetch":
            last[e[0]] = e[1]


def test_staging_check_catches_a_buffer_refilled_too_early(checkpoint, tmp_path, monkeypatch):
    """The staging check can fail: a ring that refills a buffer without waiting for the copy reading it (which
    on CUDA may still be in flight) breaks it."""
    monkeypatch.setattr("engine.memory.staging.synchronize", lambda event: None)
    _, engine, log = _run(checkpoint(VARIANT), SIDE_POLICIES["offload-gpu-attention"], tmp_path, deferred=True)
    with pytest.raises(AssertionError, match="refilled before the copy"):
        _check_staging_protocol(log, len(engine.devices.staging.sets))


# -- the same on CUDA -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SIDE_POLICIES))
def test_cuda_side_streams_and_head_keep_fp32_tokens(checkpoint, tmp_path, name):
    """fp32 tokens equal the CPU run's; a 4-bit cache quantized on the GPU agrees on at least 95 % of them (as
    in tests/engine/test_gpu.py: the GPU's rounding of a code may differ)."""
    policy = SIDE_POLICIES[name]
    got, engine, _ = _run(checkpoint(VARIANT), policy, tmp_path, simulate=False)
    assert engine.devices.async_moves and engine.devices.has_cuda
    want = _cpu_tokens(checkpoint(VARIANT), policy)
    if policy.compress_cache or policy.compress_weight:
        assert _agreement(got, want) >= 0.95
    else:
        assert got == want
    if engine.globals_on == "gpu":
        assert all(t.is_cuda for t in engine.gw.values())
    if not policy.cpu_attention:
        assert all(b.is_pinned() for s in engine.devices.staging.sets for b in s)


@pytest.mark.gpu
def test_cuda_one_gpu_batch_keeps_activations_on_the_gpu(checkpoint, tmp_path):
    model, rows = checkpoint(VARIANT), 8
    crossed = []
    for act in ("cpu", "gpu"):
        policy = Policy(gbs=8, num_gb=1, prefill_device="gpu", decode_device="gpu", weight_gpu=1.0, weight_cpu=0.0,
                        act_gpu=float(act == "gpu"), act_cpu=float(act == "cpu"))
        got, engine, _ = _run(model, policy, tmp_path, n=1, simulate=False, rows=rows)
        assert got == _cpu_tokens(model, policy, n=1, rows=rows)
        crossed.append(_crossed(engine))
    assert crossed[0] == crossed[1]


@pytest.mark.gpu
def test_cuda_activation_buffers_that_cross_are_pinned(checkpoint, tmp_path):
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=GPU_POLICIES["offload-both"],
                         offload_dir=tmp_path)
    try:
        acts = PlacedActivations.create(engine.devices, {"gpu": 0.0, "cpu": 1.0, "disk": 0.0}, (2, 3, 8),
                                        torch.float32)
        assert acts.buffers and all(b.is_pinned() for b in acts.buffers)
    finally:
        engine.weights.close()
