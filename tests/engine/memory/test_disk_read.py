"""Disk-tier reads that bypass the page cache: O_DIRECT into reused aligned buffers gives the bytes safetensors
reads, the engine's tokens do not change, and 4-bit weights stay compressed on disk."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.engine import Engine
from engine.memory import disk_read
from engine.memory.disk_read import ALIGN, DirectReader
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS


def test_direct_read_matches_safetensors_and_reuses_buffers(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(33, 7, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16),
               "c": torch.randint(0, 255, (13, 3), dtype=torch.uint8), "d": torch.randn(2, 2).half()}
    path = tmp_path / "layer.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    reader = DirectReader()
    for _ in range(5):
        got, buf = reader.read(path)
        assert buf.data_ptr() % ALIGN == 0
        want = load_file(str(path))
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])
        reader.release(buf)
    assert reader.buffers_made == 1


def test_reads_are_direct_when_the_disk_tier_exceeds_half_the_memory_left():
    assert disk_read.reads_direct(501, 1000) and not disk_read.reads_direct(500, 1000)


def test_memory_room_is_positive_here():
    assert disk_read.memory_room_bytes() > 0


@pytest.mark.parametrize("compress", [False, True])
def test_direct_disk_reads_give_the_same_tokens(checkpoint, tmp_path, one_thread, compress):
    model = checkpoint("llama_gqa_llama3")
    policy = Policy(gbs=2, num_gb=2, weight_cpu=0.0, compress_weight=compress)
    reqs = [Request(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(PROMPTS)]
    buffered = Engine.load(model, dtype="float32", policy=policy, offload_dir=tmp_path)
    assert buffered.weights.direct is None  # a tiny model stays in the page cache
    want = [c.token_ids for c in buffered.generate(reqs)]
    direct = Engine.load(model, dtype="float32", policy=policy, offload_dir=tmp_path)
    direct.weights.direct = DirectReader()
    assert [c.token_ids for c in direct.generate(reqs)] == want
    assert direct.weights.direct.buffers_made <= 3 and direct.devices.links.moved["disk->cpu"] > 0
    for e in (buffered, direct):
        e.weights.close()


def test_four_bit_weights_stay_compressed_on_disk(checkpoint, tmp_path, offload_copies):
    model = checkpoint("llama_gqa_llama3")
    sizes = {}
    for compress in (False, True):
        folder = tmp_path / str(compress)
        Engine.load(model, dtype="float32", policy=Policy(weight_cpu=0.0, compress_weight=compress),
                    offload_dir=folder).weights.close()
        sizes[compress] = sum(f.stat().st_size for f in folder.rglob("layer_*.safetensors"))
    assert sizes[True] < 0.3 * sizes[False]
