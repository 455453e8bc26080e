"""Compressed layers are converted once: the first load keeps each in the offload folder, later loads read them
there instead of quantizing the checkpoint again, and a damaged file is converted anew."""

import json
import logging

import pytest
import torch

from engine.engine import Engine
from engine.memory import converted, weight_store
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec

VARIANT = "llama_gqa_llama3"


def _run(model_dir, tmp_path, fmt: str):
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(compress_weight=True, weight_format=fmt),
                         offload_dir=tmp_path)
    try:
        reqs = [Request(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(["The quick", "def add("])]
        return [c.token_ids for c in engine.generate(reqs)], engine.weights.resident
    finally:
        engine.weights.close()


def _kept_files(tmp_path):
    return sorted(p.name for p in tmp_path.rglob("layer_*.safetensors"))


def _no_conversion(monkeypatch):
    def refuse(reader, i, dtype, codec):
        raise AssertionError(f"layer {i} was quantized again")
    monkeypatch.setattr(weight_store, "encode_layer", refuse)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_second_load_reads_the_converted_layers_and_computes_the_same(checkpoint, tmp_path, monkeypatch, fmt):
    model_dir = checkpoint(VARIANT)
    layers = load_model_spec(model_dir).num_layers
    first, first_weights = _run(model_dir, tmp_path, fmt)
    assert len(_kept_files(tmp_path)) == layers  # every resident layer kept, written once
    _no_conversion(monkeypatch)
    second, second_weights = _run(model_dir, tmp_path, fmt)
    assert second == first
    compared = 0
    for i, layer in first_weights.items():  # the same stored form, read back
        for name, w in layer.items():
            a, b = (x if not hasattr(x, "stored") else x.fast if x.stored is None else x.stored
                    for x in (w, second_weights[i][name]))  # kept in a kernel's tiles alone: the tiles
            for field in ("data", "codes", "scales", "mins", "code_sums"):
                if hasattr(a, field):
                    assert torch.equal(getattr(a, field), getattr(b, field)), (i, name, field)
                    compared += 1
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b), (i, name)
    assert compared >= 4 * layers  # every compressed projection's codes and scales


def test_a_damaged_converted_layer_is_converted_again(checkpoint, tmp_path, monkeypatch):
    model_dir = checkpoint(VARIANT)
    first, _ = _run(model_dir, tmp_path, "int4")
    damaged = next(tmp_path.rglob("layer_0001.safetensors"))
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF  # same size, one flipped bit in the codes
    damaged.write_bytes(bytes(data))
    calls = []
    real = weight_store.encode_layer
    monkeypatch.setattr(weight_store, "encode_layer", lambda reader, i, *a: calls.append(i) or real(reader, i, *a))
    second, _ = _run(model_dir, tmp_path, "int4")
    assert calls == [1] and second == first


def test_a_folder_that_cannot_be_written_costs_only_the_reuse(checkpoint, tmp_path, monkeypatch, caplog):
    def full_disk(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(converted, "write_layer", full_disk)
    model_dir = checkpoint(VARIANT)
    with caplog.at_level(logging.WARNING, logger="engine.memory.converted"):
        tokens, _ = _run(model_dir, tmp_path, "int4")
    assert tokens and all(len(t) == 6 for t in tokens)
    assert "later runs will convert it again" in caplog.text and _kept_files(tmp_path) == []


def test_uncompressed_resident_layers_are_not_copied(checkpoint, tmp_path):
    Engine.load(checkpoint(VARIANT), dtype="float32", offload_dir=tmp_path).weights.close()
    assert _kept_files(tmp_path) == []


@pytest.mark.parametrize("fmt", ["int8", None])
def test_layers_kept_ready_for_their_kernel_are_readied_on_the_compute_thread(checkpoint, tmp_path, monkeypatch, fmt):
    """A layer kept in CPU memory in the form its kernel computes on needs no reads, copies or decompression, so
    it is never handed to the prefetch thread (whose Python work would contend with every op of the compute
    thread); the tokens are those of the run that prefetches it. (int8 weights kept in memory are always in the
    tile kernel's form; 4-bit ones only where the 4-bit kernel was measured faster at some row count, which on
    this tiny model depends on the machine, and otherwise are dequantized in the prefetcher.)"""
    policy = Policy(compress_weight=fmt is not None, **({"weight_format": fmt} if fmt else {}))
    engine = Engine.load(checkpoint(VARIANT), dtype="float32", policy=policy, offload_dir=tmp_path)
    reqs = [Request(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(["The quick", "def add("])]
    try:
        submitted = []
        submit = engine.weights._pool.submit
        monkeypatch.setattr(engine.weights._pool, "submit", lambda *a: submitted.append(a[1]) or submit(*a))
        inline = [c.token_ids for c in engine.generate(reqs)]
        assert submitted == [] and set(engine.weights.placement) == {"cpu"}
        monkeypatch.setattr(engine.weights, "_ready_as_kept", lambda i, device: False)
        prefetched = [c.token_ids for c in engine.generate(reqs)]
        assert len(submitted) > 0 and prefetched == inline
    finally:
        engine.weights.close()


def _same_size_new_weights(path):
    """Rewrite the safetensors file at `path` in place with other values of the same shapes (every layer weight
    negated), its size and its access and modification times kept, as `cp -p` or `rsync -a` would leave it."""
    import os

    from safetensors import safe_open
    from safetensors.torch import load_file, save

    st = path.stat()
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = {k: -v if ".layers." in k else v for k, v in load_file(str(path)).items()}
    data = save(tensors, metadata=meta)
    assert len(data) == st.st_size and data != path.read_bytes()
    with open(path, "r+b") as f:  # the same inode
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_weights_replaced_in_place_with_their_times_kept_are_converted_again(checkpoint, tmp_path, monkeypatch):
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(checkpoint(VARIANT), model_dir)
    offload = tmp_path / "offload"
    _run(model_dir, offload, "int4")
    for f in model_dir.glob("*.safetensors"):
        _same_size_new_weights(f)
    expected, _ = _run(model_dir, tmp_path / "fresh", "int4")  # the new weights, converted in a folder of their own
    calls = []
    real = weight_store.encode_layer
    monkeypatch.setattr(weight_store, "encode_layer", lambda reader, i, *a: calls.append(i) or real(reader, i, *a))
    second, _ = _run(model_dir, offload, "int4")
    assert sorted(calls) == list(range(load_model_spec(model_dir).num_layers)) and second == expected
    calls.clear()
    assert _run(model_dir, offload, "int4")[0] == expected and calls == []  # then reused, not hashed into a new key


def test_layer_files_swapped_with_their_records_are_converted_again(checkpoint, tmp_path, monkeypatch, caplog):
    model_dir = checkpoint(VARIANT)
    first, _ = _run(model_dir, tmp_path, "int4")
    folder = next(tmp_path.rglob("layer_0000.safetensors")).parent
    for suffix in (".safetensors", ".json"):  # layer 0's file and record in layer 1's place, and back
        a, b = folder / f"layer_0000{suffix}", folder / f"layer_0001{suffix}"
        a.rename(folder / "swap")
        b.rename(a)
        (folder / "swap").rename(b)
    calls = []
    real = weight_store.encode_layer
    monkeypatch.setattr(weight_store, "encode_layer", lambda reader, i, *a: calls.append(i) or real(reader, i, *a))
    with caplog.at_level(logging.WARNING, logger="engine.memory.offload"):
        second, _ = _run(model_dir, tmp_path, "int4")
    assert sorted(calls) == [0, 1] and second == first
    assert "record names layer 1, not layer 0" in caplog.text


def test_a_record_of_another_format_is_not_reused(checkpoint, tmp_path, caplog):
    from engine.memory.offload import stored_layer

    _run(checkpoint(VARIANT), tmp_path, "int4")
    folder = next(tmp_path.rglob("layer_0000.safetensors")).parent
    identity = json.loads((folder / "layer_0000.json").read_text())
    identity = {k: identity[k] for k in ("model", "format", "dtype")}
    assert stored_layer(folder, 0, identity) is not None
    assert stored_layer(folder, 0, identity | {"dtype": "bfloat16"}) is None
    assert stored_layer(folder, 0, identity | {"model": "0" * 64}) is None
    assert "record names dtype float32, not layer 0, model" in caplog.text
