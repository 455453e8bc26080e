"""Disk-tier layers whose stored form is the checkpoint's own bytes are read straight from its safetensors files:
each read gives exactly the tensors an offload copy would hold, greedy tokens equal the offload-copy path's and an
all-CPU run's (float32, and bfloat16 at rest over a bfloat16 checkpoint), nothing is written to the offload folder
for them, other formats still convert, a layer split over two shards reads whole, and where O_DIRECT is refused
the files are read buffered and dropped from the page cache."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint import CheckpointReader
from engine.compression.codecs import WeightCodec
from engine.engine import Engine
from engine.kernels.fuse import fuse_projections
from engine.memory import span_read, weight_store
from engine.memory.checkpoint_layers import checkpoint_plans, read_layer
from engine.memory.disk_read import ALIGN, DirectReader, aligned_empty
from engine.memory.tiers import tensor_bytes
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec
from jobs.bench import models as bm
from tests.engine.reference import PROMPTS

VARIANT = "llama_gqa_llama3"
ON_DISK = Policy(gbs=2, num_gb=2, weight_cpu=0.0)
ON_CPU = Policy(gbs=2, num_gb=2)
BF16 = {"compress_weight": True, "weight_format": "bf16"}


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    return bm.build_checkpoint("tiny", tmp_path_factory.mktemp("bf16-direct"))  # saved in bfloat16


def _reader(model_dir) -> CheckpointReader:
    return CheckpointReader(model_dir, load_model_spec(model_dir))


def _same(got: dict, want: dict) -> None:
    assert list(sorted(got)) == list(sorted(want))
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt", "qwen2"])
@pytest.mark.parametrize("direct", [True, False])
def test_a_layer_read_from_the_checkpoint_is_what_an_offload_copy_would_hold(checkpoint, variant, direct):
    reader = _reader(checkpoint(variant))
    plans = checkpoint_plans(reader, [0, 1], torch.float32, None)
    assert sorted(plans) == [0, 1]
    for i, plan in plans.items():
        want = fuse_projections(reader.layer(i, torch.float32))
        buf = aligned_empty(plan.buffer_bytes)
        got, nread = read_layer(plan, buf, direct)
        _same(got, want)
        assert plan.meta is None and plan.stored_bytes == tensor_bytes(want.values())
        assert all(t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr() for t in got.values())
        if direct:  # whole 4 KiB blocks, at most two partial ones per span beyond its bytes
            assert nread % ALIGN == 0 and plan.stored_bytes <= nread <= plan.stored_bytes + 2 * ALIGN * 9
        else:
            assert nread == plan.stored_bytes


def test_bf16_at_rest_over_a_bf16_checkpoint_reads_its_bytes(bf16_checkpoint):
    reader = _reader(bf16_checkpoint)
    codec = WeightCodec(torch.float32, format="bf16")
    layers = list(range(reader.spec.num_layers))
    plans = checkpoint_plans(reader, layers, torch.float32, codec)
    assert sorted(plans) == layers
    for i in (0, layers[-1]):
        want, meta = codec.encode(fuse_projections(reader.layer(i, torch.float32)))
        got, _ = read_layer(plans[i], aligned_empty(plans[i].buffer_bytes), direct=True)
        _same(got, want)
        assert plans[i].meta == meta
    # other formats, or a dtype the checkpoint is not in, still convert
    assert checkpoint_plans(reader, layers, torch.float32, WeightCodec(torch.float32, format="int8")) == {}
    assert checkpoint_plans(reader, layers, torch.float32, None) == {}  # bf16 -> float32 changes the bytes
    assert checkpoint_plans(reader, layers, torch.float16, codec) == {}  # through float16 a bf16 value may change


def _tokens(model_dir, policy, offload_dir, direct: bool | None = None, dtype="float32", prompt_ids=None):
    eng = Engine.load(model_dir, dtype=dtype, policy=policy, offload_dir=offload_dir)
    if direct is not None:  # else as the engine decides (a tiny model stays in the page cache)
        eng.weights.direct = DirectReader() if direct else None
    if prompt_ids is None:
        reqs = [Request(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(PROMPTS)]
    else:
        reqs = [Request(str(i), "", SamplingParams(max_new_tokens=6), prompt_ids=tuple(p))
                for i, p in enumerate(prompt_ids)]
    try:
        return [c.token_ids for c in eng.generate(reqs)], eng
    finally:
        eng.weights.close()


def _layer_files(folder) -> list:
    return list(folder.rglob("layer_*")) if folder.exists() else []


def test_float32_layers_read_from_the_checkpoint_give_the_tokens_of_a_copy_and_of_memory(checkpoint, tmp_path,
                                                                                        one_thread, monkeypatch):
    model = checkpoint(VARIANT)
    want, _ = _tokens(model, ON_CPU, tmp_path / "cpu")
    for direct in (True, False):
        got, eng = _tokens(model, ON_DISK, tmp_path / "direct", direct)
        assert got == want and sorted(eng.weights.plans) == [0, 1]
        assert eng.devices.links.moved["disk->cpu"] >= 2 * sum(eng.weights.layer_bytes)  # each layer, every pass
        assert eng.weights.weight_wait_s > 0 and eng.weights.load_s > 0
    assert _layer_files(tmp_path / "direct") == []
    monkeypatch.setattr(weight_store, "checkpoint_plans", lambda *args: {})
    copied, eng = _tokens(model, ON_DISK, tmp_path / "copy")
    assert copied == want and eng.weights.plans == {} and len(_layer_files(tmp_path / "copy")) == 4  # + records


def test_bf16_at_rest_reads_a_bf16_checkpoint_and_gives_the_tokens_of_a_copy_and_of_memory(
        bf16_checkpoint, tmp_path, one_thread, monkeypatch):
    prompts = bm.prompt_ids(4, 9, 512, seed=3)

    def run(policy, folder, **kw):
        return _tokens(bf16_checkpoint, policy, tmp_path / folder, prompt_ids=prompts, **kw)

    want, _ = run(ON_CPU, "plain")  # float32 widened at load: bf16 at rest loses nothing against it
    assert run(replace(ON_CPU, **BF16), "cpu")[0] == want
    got, eng = run(replace(ON_DISK, **BF16), "direct", direct=True)
    assert got == want and len(eng.weights.plans) == eng.spec.num_layers
    assert _layer_files(tmp_path / "direct") == []
    monkeypatch.setattr(weight_store, "checkpoint_plans", lambda *args: {})
    copied, eng = run(replace(ON_DISK, **BF16), "copy")
    assert copied == want and _layer_files(tmp_path / "copy")


def test_four_bit_layers_still_write_their_copy(checkpoint, tmp_path):
    eng = Engine.load(checkpoint(VARIANT), dtype="float32", policy=replace(ON_DISK, compress_weight=True),
                      offload_dir=tmp_path)
    eng.weights.close()
    assert eng.weights.plans == {}
    assert len(list(tmp_path.rglob("layer_*.safetensors"))) == 2


def _split_over_two_shards(src, out):
    """The checkpoint with its tensors dealt alternately into two shards and an index: every layer, and the
    fused q/k/v and gate/up, spans both files."""
    shutil.copytree(src, out)
    tensors = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {f"model-0000{k + 1}-of-00002.safetensors": names[k::2] for k in range(2)}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(out / file), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def test_a_layer_split_over_two_shards_reads_whole(checkpoint, tmp_path, one_thread):
    model = _split_over_two_shards(checkpoint(VARIANT), tmp_path / "sharded")
    reader = _reader(model)
    plans = checkpoint_plans(reader, [0, 1], torch.float32, None)
    files = {s.file.name for p in plans[0].pieces for s in p.spans}
    assert len(files) == 2 and any(len({s.file for s in p.spans}) == 2 for p in plans[0].pieces)
    for i, plan in plans.items():
        got, _ = read_layer(plan, aligned_empty(plan.buffer_bytes), direct=True)
        _same(got, fuse_projections(reader.layer(i, torch.float32)))
    want, _ = _tokens(checkpoint(VARIANT), ON_CPU, tmp_path / "cpu")
    got, _ = _tokens(model, ON_DISK, tmp_path / "off", direct=True)
    assert got == want and _layer_files(tmp_path / "off") == []


def test_where_o_direct_is_refused_the_files_are_read_buffered_and_dropped(checkpoint, tmp_path, monkeypatch):
    reader = _reader(checkpoint(VARIANT))
    plan = checkpoint_plans(reader, [0], torch.float32, None)[0]
    real_open, real_fadvise, dropped = os.open, os.posix_fadvise, []

    def refuse_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(22, "O_DIRECT refused", str(path))
        return real_open(path, flags, *args)

    def fadvise(fd, offset, length, advice):
        dropped.append(advice)
        return real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "open", refuse_direct)
    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    got, nread = read_layer(plan, aligned_empty(plan.buffer_bytes), direct=True)
    _same(got, fuse_projections(reader.layer(0, torch.float32)))
    assert nread == plan.stored_bytes and dropped == [os.POSIX_FADV_DONTNEED]
    dropped.clear()
    read_layer(plan, aligned_empty(plan.buffer_bytes), direct=False)  # the page cache keeps what it reads
    assert dropped == []


@pytest.mark.parametrize("direct", [True, False])
def test_any_span_lands_in_place_whatever_its_alignment_keeping_what_lies_before(tmp_path, monkeypatch, direct):
    monkeypatch.setattr(span_read, "SCRATCH_BYTES", 2 * ALIGN)  # several bounces per span
    size = 5 * ALIGN + 123  # the last block ends early
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "blob"
    path.write_bytes(data.numpy().tobytes())
    buf = aligned_empty(8 * ALIGN)
    for offset in (0, 1, 100, ALIGN - 1, ALIGN, ALIGN + 5000):
        for length in (1, 100, ALIGN, 3 * ALIGN + 7, size - offset):
            if offset + length > size:
                continue
            for at in (offset % ALIGN, offset % ALIGN + ALIGN, 64, 0):  # agreeing with the file modulo 4 KiB, or not
                buf.fill_(0xAB)
                with span_read.OpenFiles(direct) as files:
                    nread = span_read.read_span(files, path, offset, buf, at, length)
                assert torch.equal(buf[at : at + length], data[offset : offset + length]), (offset, length, at)
                assert bool((buf[:at] == 0xAB).all()), (offset, length, at)
                assert nread >= length and (not direct or nread % ALIGN == 0)


def test_the_checkpoint_is_read_with_o_direct_where_its_filesystem_takes_it(checkpoint):
    path = checkpoint(VARIANT) / "model.safetensors"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip(f"the filesystem of {path} refuses O_DIRECT (the checkpoint is read buffered there)")
    with span_read.OpenFiles(direct=True) as files:
        assert files.fd(path)[1]
    with span_read.OpenFiles(direct=False) as files:
        assert not files.fd(path)[1]
