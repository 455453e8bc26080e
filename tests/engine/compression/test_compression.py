"""4-bit compression in the engine: the compressed-weight path computes exactly what an uncompressed run of
the same weights rounded through quantize -> dequantize computes; sizes shrink as the format says."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.compression.codecs import WeightCodec
from engine.compression.int4 import dequantize, quantize
from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS

VARIANT = "qwen2"


def _reqs(n=10):
    return [Request(str(i), p, SamplingParams(max_new_tokens=n)) for i, p in enumerate(PROMPTS)]


def _fake_quantized_copy(src, dst):
    """The checkpoint with every layer Linear weight replaced by dequantize(quantize(w)), in float32."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    for name, t in weights.items():
        if ".layers." in name and name.endswith("proj.weight"):
            weights[name] = dequantize(quantize(t)).float().contiguous()
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("policy", [Policy(compress_weight=True, gbs=2),
                                    Policy(compress_weight=True, weight_cpu=0.5, gbs=3, num_gb=2)])
def test_compressed_weights_equal_uncompressed_rounded_weights(checkpoint, tmp_path, policy):
    src = checkpoint(VARIANT)
    rounded = _fake_quantized_copy(src, tmp_path / "rounded")
    expected = [c.token_ids for c in Engine.load(rounded, dtype="float32").generate(_reqs())]
    engine = Engine.load(src, dtype="float32", policy=policy, offload_dir=tmp_path / "off")
    assert [c.token_ids for c in engine.generate(_reqs())] == expected


def test_compressed_layers_are_what_is_stored(checkpoint, tmp_path):
    src = checkpoint(VARIANT)
    plain = Engine.load(src, dtype="float32", policy=Policy(weight_cpu=0.0), offload_dir=tmp_path / "a")
    packed = Engine.load(src, dtype="float32", policy=Policy(weight_cpu=0.0, compress_weight=True),
                         offload_dir=tmp_path / "b")
    ratio = sum(packed.weights.layer_bytes) / sum(plain.weights.layer_bytes)
    # head_dim 16 and hidden 64 fill whole groups of 64: 4 bits + 32 bits per 64 values, vs 32 bits
    assert 0.12 < ratio < 0.2, ratio
    files = list((tmp_path / "b").rglob("layer_*.safetensors"))
    assert files and all(".data" in "".join(load_file(f)) for f in files)


def test_compressed_cache_runs_under_placements(checkpoint, tmp_path):
    src = checkpoint(VARIANT)
    runs = []
    for policy in (Policy(compress_cache=True, gbs=2),
                   Policy(compress_cache=True, gbs=3, cache_gpu=0.4, cache_cpu=0.3, decode_device="gpu",
                          cpu_attention=True),
                   Policy(compress_cache=True, gbs=3, cache_gpu=0.4, cache_cpu=0.3, decode_device="gpu",
                          cpu_attention=False)):
        engine = Engine.load(src, dtype="float32", policy=policy, simulate_gpu=True, offload_dir=tmp_path)
        runs.append([c.token_ids for c in engine.generate(_reqs())])
    # the same 4-bit cache read on the CPU or moved compressed to the compute device: the same tokens
    assert runs[0] == runs[1] == runs[2]


def test_weight_codec_round_trip_is_within_the_group_bound():
    codec = WeightCodec(torch.float32)
    w = torch.randn(96, 130)
    tensors, meta = codec.encode({"mlp.up_proj.weight": w, "input_layernorm.weight": torch.ones(130)})
    out = codec.decode(tensors, meta, {})
    assert torch.equal(out["input_layernorm.weight"], torch.ones(130))
    err = (out["mlp.up_proj.weight"] - w).abs().max()
    assert err <= (w.max() - w.min()) / 15 / 2 + 1e-3
