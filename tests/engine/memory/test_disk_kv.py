"""The disk tier's KV cache read and written with direct I/O matches the in-memory cache slot for slot."""

import fcntl
import os

import pytest
import torch

from engine.memory.disk_kv import DirectKVCache
from engine.memory.kv_cache import KVCache
from engine.memory.offload import DEFAULT_OFFLOAD_DIR

L, B, KVH, T, D = 2, 3, 2, 40, 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_cache_equals_the_memory_cache_through_prefill_decode_rows_and_shifts(tmp_path, dtype):
    torch.manual_seed(0)
    disk, mem = DirectKVCache(L, B, KVH, T, D, dtype, offload_dir=tmp_path), KVCache(L, B, KVH, T, D, dtype)
    assert not list(tmp_path.iterdir())  # the scratch file is unlinked at once
    new = lambda s, b=B: (torch.randn(b, KVH, s, D).to(dtype), torch.randn(b, KVH, s, D).to(dtype))  # noqa: E731
    for layer in range(L):
        k, v = new(7)
        disk.store(layer, k, v, 0)
        mem.store(layer, k, v, 0)
    q = torch.randn(B, 2 * KVH, 1, D).to(dtype)
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    for t in range(7, 20):  # decode: one slot per step, crossing 4 KiB blocks
        for layer in range(L):
            k, v = new(1)
            got = disk.attend(layer, q, k, v, t, mask[..., : t + 1])
            want = mem.attend(layer, q, k, v, t, mask[..., : t + 1])
            assert torch.equal(got, want)
    for layer in range(L):
        k, v = new(3)
        row_k, row_v = new(3, 1)  # then a refilled row: slots [20, 23) of row 1 again
        for cache in (disk, mem):
            cache.store(layer, k, v, 20)
            cache.store(layer, row_k, row_v, 20, copy=lambda dst, src: dst[1:2].copy_(src))
    disk.shift_slots(5, 18)
    mem.shift_slots(5, 18)
    for layer in range(L):
        k, v = new(1)
        kd, vd = disk.update(layer, k, v, 18)
        km, vm = mem.update(layer, k, v, 18)
        assert torch.equal(kd, km) and torch.equal(vd, vm)
    disk.keep_rows([0, 2])  # row 1 finished: the others go on as a batch of two
    mem.keep_rows([0, 2])
    for layer in range(L):
        k, v = new(1, 2)
        kd, vd = disk.update(layer, k, v, 19)
        km, vm = mem.update(layer, k, v, 19)
        assert kd.shape[0] == 2 and torch.equal(kd, km) and torch.equal(vd, vm)


def test_the_scratch_file_bypasses_the_page_cache_in_the_offload_folder():
    probe = DEFAULT_OFFLOAD_DIR / f".direct-probe-{os.getpid()}"
    DEFAULT_OFFLOAD_DIR.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError:
        pytest.skip(f"the filesystem of {DEFAULT_OFFLOAD_DIR} refuses O_DIRECT (the cache reads buffered there)")
    finally:
        probe.unlink(missing_ok=True)
    cache = DirectKVCache(L, B, KVH, T, D, torch.float32, offload_dir=DEFAULT_OFFLOAD_DIR)
    assert fcntl.fcntl(cache.fd, fcntl.F_GETFL) & os.O_DIRECT
    assert cache.nbytes() == 2 * L * (-(-T * B * KVH * D * 4 // 4096) * 4096)
