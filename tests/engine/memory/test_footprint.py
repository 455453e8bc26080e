"""The footprint's figures are what the engine really allocates for a block: the KV cache tensors it makes (plain,
4-bit, and a plain cache on the disk tier with its two buffers), the shared prefix's K/V, and the hidden states
between layers, which stay float32 in a bfloat16 run; `BlockExecutor.block_bytes` adds up the same figures."""

from dataclasses import replace

import pytest
import torch

from engine.engine import Engine
from engine.memory import footprint as fp
from engine.memory.disk_read import ALIGN
from engine.memory.placement import PlacedActivations
from engine.policy import Policy
from tests.engine.loop.test_shared_prefix import VARIANT, _reqs

# 5 rows in GPU batches of 3 and 2: the cache's rows 2 + 1 in CPU memory, 1 + 1 on disk; the activations' rows
# 1 + 1 in CPU memory, 2 + 1 on disk
POLICY = Policy(gbs=3, num_gb=2, cache_cpu=2 / 3, act_cpu=1 / 3)
CACHE_ROWS = {"cpu": 3, "disk": 2}
ACT_ROWS = {"cpu": 2, "disk": 3}


def test_the_4bit_row_size_pads_the_last_group():
    assert fp.int4_row_bytes(128) == 2 * (32 + 4)
    assert fp.int4_row_bytes(48) == 32 + 4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "int4"])
def test_a_block_allocates_what_the_footprint_counts(checkpoint, tmp_path, monkeypatch, dtype, compress):
    made, direct, hidden = record_allocations(monkeypatch)
    policy = replace(POLICY, compress_cache=compress)
    eng = Engine.load(checkpoint(VARIANT), dtype=dtype, policy=policy, offload_dir=tmp_path)
    try:
        ex, rows = eng.executor(), [eng._prepare(r, "error") for r in _reqs()]
        P = ex.shared_tokens(rows)
        S, T = max(len(r.prompt_ids) for r in rows) - P, ex.total_slots(rows) - P
        ex.run_block(rows)
    finally:
        eng.weights.close()
    spec, elem = eng.spec, torch.empty((), dtype=eng.dtype).element_size()
    assert P > 0 and fp.prefix_tier(policy) == "cpu"
    kv_row = fp.kv_row_bytes(spec, T, elem, compress)
    assert made[("cpu", "KV cache")] == CACHE_ROWS["cpu"] * kv_row + fp.prefix_bytes(spec, P, elem)
    if compress:  # a 4-bit cache on the disk tier is a mapped scratch file; no buffers
        assert made[("disk", "KV cache")] == CACHE_ROWS["disk"] * kv_row and not direct
    else:  # a plain one is read and written with direct I/O through two one-layer buffers per GPU batch
        files, buffers = sum(c.nbytes() for c in direct), sum(b.numel() for c in direct for b in c.buffers)
        assert 0 <= files - CACHE_ROWS["disk"] * kv_row < len(direct) * 2 * spec.num_layers * ALIGN
        buffer_need = CACHE_ROWS["disk"] * fp.disk_kv_buffer_bytes(spec, T, elem)
        assert 0 <= buffers - buffer_need < len(direct) * 2 * ALIGN
    for tier, n in ACT_ROWS.items():
        assert made[(tier, "activations")] == n * fp.act_row_bytes(spec, S)
    assert {h.dtype for h in hidden} == {fp.ACT_DTYPE}  # the states the layers hand on, as computed
    assert max(h[0].numel() * h.element_size() for h in hidden) == fp.act_row_bytes(spec, S)

    need = ex.block_bytes(len(rows), S, T, shared=P)
    if compress:
        assert need == {"gpu": 0, "cpu": made[("cpu", "KV cache")] + made[("cpu", "activations")],
                        "disk": made[("disk", "KV cache")] + made[("disk", "activations")]}
    else:
        assert need["cpu"] == made[("cpu", "KV cache")] + made[("cpu", "activations")] + buffer_need
        assert need["disk"] == CACHE_ROWS["disk"] * kv_row + made[("disk", "activations")]


def record_allocations(monkeypatch):
    """Bytes of every tensor the engine allocates on a tier, by (tier, what); the disk-tier plain caches it makes;
    the hidden states it stores between layers."""
    from engine.loop import schedule
    from engine.memory import placement

    made, direct, hidden = {}, [], []

    def alloc(devices, tier, shape, dtype, what):
        t = placement_alloc(devices, tier, shape, dtype, what)
        made[(tier, what)] = made.get((tier, what), 0) + t.numel() * t.element_size()
        return t

    class DirectKVCache(schedule.DirectKVCache):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            direct.append(self)

    def store(self, h, src, carry=False):
        hidden.append(h)
        return placed_store(self, h, src, carry)

    placement_alloc, placed_store = placement.alloc, PlacedActivations.store
    monkeypatch.setattr(schedule, "alloc", alloc)
    monkeypatch.setattr(placement, "alloc", alloc)
    monkeypatch.setattr(schedule, "DirectKVCache", DirectKVCache)
    monkeypatch.setattr(PlacedActivations, "store", store)
    return made, direct, hidden
