"""GPTQ, AWQ and FP8 checkpoints load as downloaded: greedy float32 tokens equal transformers' on the same weights
dequantized (FP8: transformers' own dequantizing FP8 loader; GPTQ/AWQ: a checkpoint of the packer's dequantized
weights, tests/quantized_checkpoints.py), with dense and 4-bit runs and weights on disk; other
quantization_configs are refused naming the method."""

import json
import shutil

import pytest
import torch

from engine.checkpoint import CheckpointReader
from engine.compression import codecs
from engine.compression.codecs import WeightCodec
from engine.compression.int4 import dequantize
from engine.engine import Engine
from engine.errors import UnsupportedModelError
from engine.policy import Policy
from engine.quantized import int4_formats
from engine.quantized.layer import split_quantized
from engine.quantized.repack import repacked_layer, to_qtensor
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec
from tests.engine.reference import PROMPTS, hf_greedy, hf_model
from tests.quantized_checkpoints import make_quantized

MAX_NEW = 10
GPTQ = dict(group_size=128, sym=True, desc_act=False)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """`quantized(method, family, **options)`: (checkpoint, reference) folders, built once per module."""
    made = {}

    def get(method, family="llama", **kw):
        key = (method, family, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = make_quantized(tmp_path_factory.mktemp(method), method, family, **kw)
        return made[key]

    return get


def _reqs():
    return [Request(str(i), p, SamplingParams(max_new_tokens=MAX_NEW)) for i, p in enumerate(PROMPTS)]


def _expected(ref_dir, engine):
    model = hf_model(ref_dir)
    out = [hf_greedy(model, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in PROMPTS]
    assert any(len(t) == MAX_NEW for t in out), "the reference stopped early everywhere: test too weak"
    return out


def _tokens(engine):
    return [c.token_ids for c in engine.generate(_reqs())]


@pytest.mark.parametrize("method,family,kw", [
    ("gptq", "qwen2", GPTQ),  # q/k/v biases, group 128 = two groups of 64
    ("gptq", "llama", dict(group_size=64, sym=False, desc_act=True)),  # act-order: a shuffled g_idx
    ("awq", "llama", dict(group_size=64)),
])
def test_int4_checkpoint_dense_run_matches_transformers(quantized, method, family, kw):
    quant, ref = quantized(method, family, **kw)
    engine = Engine.load(quant, dtype="float32")
    assert _tokens(engine) == _expected(ref, engine)


def test_fp8_checkpoint_matches_transformers_own_dequantizing_loader(quantized):
    """The reference is transformers' FineGrainedFP8 loader on the FP8 checkpoint itself (on a CPU it dequantizes)."""
    quant, _ = quantized("fp8", weight_block_size=(32, 32))
    engine = Engine.load(quant, dtype="float32")
    assert _tokens(engine) == _expected(quant, engine)


def test_gptq_4bit_run_computes_on_the_checkpoint_codes(quantized, tmp_path, monkeypatch):
    """With 4-bit weights, GPTQ layers are repacked, never quantized again (symmetric: exactly the checkpoint's
    values), on every tier: tokens equal the reference's."""
    quant, ref = quantized("gptq", "qwen2", **GPTQ)

    def refuse(*a, **k):
        raise AssertionError("a repacked layer was quantized again")

    monkeypatch.setattr(codecs, "quantize", refuse)
    runs = []
    for policy in (Policy(compress_weight=True), Policy(compress_weight=True, weight_cpu=0.0),
                   Policy(compress_weight=True, weight_cpu=0.5, gbs=2)):
        engine = Engine.load(quant, dtype="float32", policy=policy, offload_dir=tmp_path / "off")
        runs.append(_tokens(engine))
    assert runs[0] == runs[1] == runs[2] == _expected(ref, engine)


def test_awq_repacked_is_within_its_bound_and_runs_on_its_values(quantized, tmp_path):
    """AWQ's zeros are asymmetric: m = -z s rounds once to float16, within s / 128 of each value; a 4-bit run
    gives the tokens of a dense run of exactly the repacked values."""
    quant, _ = quantized("awq", group_size=64)
    reader = CheckpointReader(quant, load_model_spec(quant))
    codec = WeightCodec(torch.float32)
    parts, _ = split_quantized(reader.stored_layer(0), reader.quant)
    rounded = {}
    for name, p in parts.items():
        w = int4_formats.unpack(p, reader.quant, name)
        got = dequantize(to_qtensor(w, codec.config, torch.float32))
        exact = int4_formats.dense(w, torch.float32)
        bound = w.scales.float()[w.g_idx].T / 128
        assert ((got - exact).abs() <= bound).all(), name
        rounded[name] = got
    assert any((rounded[n] != int4_formats.dense(int4_formats.unpack(p, reader.quant, n), torch.float32)).any()
               for n, p in parts.items()), "no value was rounded: the bound is not exercised"
    # the dense run of the repacked values: a checkpoint of them, every layer's weights as the repack gives them
    same = _repacked_values_checkpoint(quant, tmp_path / "same", reader, codec)
    dense = _tokens(Engine.load(same, dtype="float32"))
    packed = Engine.load(quant, dtype="float32", policy=Policy(compress_weight=True), offload_dir=tmp_path / "o")
    assert _tokens(packed) == dense


def _repacked_values_checkpoint(quant, dst, reader, codec):
    from safetensors.torch import load_file, save_file

    shutil.copytree(quant, dst)
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["quantization_config"]
    (dst / "config.json").write_text(json.dumps(cfg))
    state = load_file(dst / "model.safetensors")
    for i in range(reader.spec.num_layers):
        parts, _ = split_quantized(reader.stored_layer(i), reader.quant)
        for name, p in parts.items():
            base = f"model.layers.{i}.{name.removesuffix('.weight')}"
            for part in p:
                del state[f"{base}.{part}"]
            qt = to_qtensor(int4_formats.unpack(p, reader.quant, name), codec.config, torch.float32)
            state[f"{base}.weight"] = dequantize(qt).contiguous()
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_act_order_gptq_is_quantized_from_its_dense_layer(quantized, tmp_path):
    """A shuffled g_idx does not line up with groups of 64: the layer is dequantized and the codec quantizes it."""
    quant, _ = quantized("gptq", "llama", group_size=64, sym=False, desc_act=True)
    reader = CheckpointReader(quant, load_model_spec(quant))
    assert repacked_layer(reader, 0, WeightCodec(torch.float32)) is None
    engine = Engine.load(quant, dtype="float32", policy=Policy(compress_weight=True), offload_dir=tmp_path)
    assert all(len(c.token_ids) for c in engine.generate(_reqs()))


def test_quantized_layers_on_disk_are_not_read_as_plain_weights(quantized, tmp_path):
    quant, ref = quantized("fp8", weight_block_size=(32, 32))
    engine = Engine.load(quant, dtype="float32", policy=Policy(weight_cpu=0.0), offload_dir=tmp_path)
    assert not engine.weights.plans and len(engine.weights.files) == 2  # converted once into the offload folder
    assert _tokens(engine) == _expected(quant, engine)


@pytest.mark.parametrize("qc,named", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits=8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "'gemv'"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}, "'static'"),
    ({"quant_method": "compressed-tensors"}, "'compressed-tensors'"),
])
def test_other_quantization_configs_are_refused_naming_the_method(quantized, tmp_path, qc, named):
    quant, _ = quantized("awq", group_size=64)
    bad = tmp_path / "bad"
    shutil.copytree(quant, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(cfg | {"quantization_config": qc}))
    with pytest.raises(UnsupportedModelError, match=named) as e:
        Engine.load(bad, dtype="float32")
    assert "gptq (bits=4" in str(e.value) and "awq" in str(e.value) and "fp8" in str(e.value)


@pytest.mark.parametrize("group,sym,v2", [(-1, False, False), (128, True, True), (128, False, False), (32, True, False)])
def test_gptq_weights_unpack_and_repack_to_the_packer_values(group, sym, v2):
    """Every group size and both zero conventions unpack to the packer's values exactly; groups of 128 and one per
    row repack into groups of 64 (symmetric: exactly; else within s / 128), groups of 32 do not."""
    from engine.quantized.config import QuantFormat
    from tests.quantized_checkpoints import gptq_quantize

    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(3))
    parts, ref = gptq_quantize(w, group if group > 0 else 256, sym, False, torch.Generator(), v2=v2)
    fmt = QuantFormat("gptq", 4, group, zero_offset=0 if v2 else 1)
    unpacked = int4_formats.unpack(parts, fmt, "x.weight")
    assert torch.equal(int4_formats.dense(unpacked, torch.float32), ref)
    qt = to_qtensor(unpacked, WeightCodec(torch.float32).config, torch.float32)
    if group == 32:
        assert qt is None
        return
    bound = 0 if sym else unpacked.scales.float()[unpacked.g_idx].T / 128
    assert ((dequantize(qt) - ref).abs() <= bound).all()


def test_a_quantized_lm_head_is_read_dequantized_with_the_globals():
    from engine.quantized.config import QuantFormat
    from engine.quantized.layer import dense_weights
    from tests.quantized_checkpoints import gptq_quantize

    w = torch.randn(320, 128, generator=torch.Generator().manual_seed(4))
    parts, ref = gptq_quantize(w, 128, True, False, torch.Generator())
    emb = torch.randn(320, 128, dtype=torch.float16)
    out = dense_weights({"embed_tokens.weight": emb} | {f"lm_head.{p}": t for p, t in parts.items()},
                        QuantFormat("gptq", 4, 128, zero_offset=1), torch.float32)
    assert set(out) == {"embed_tokens.weight", "lm_head.weight"}
    assert torch.equal(out["lm_head.weight"], ref) and torch.equal(out["embed_tokens.weight"], emb.float())


@pytest.mark.parametrize("block", [(32, 32), None])
def test_fp8_blocks_cut_by_the_edge_and_one_scale_per_tensor(block):
    """DeepSeek's dequantization: block (i // rows, k // cols), the last block of a dimension partial."""
    from engine.quantized import fp8
    from engine.quantized.config import QuantFormat

    gen = torch.Generator().manual_seed(5)
    w = torch.randn(70, 100, generator=gen).to(torch.float8_e4m3fn)
    s = torch.rand(3, 4, generator=gen) if block else torch.rand((), generator=gen)
    got = fp8.dense(w, s, QuantFormat("fp8", 8, block=block), torch.float32, "x.weight")
    expect = torch.tensor([[float(w[i, k].float()) * float(s[i // 32, k // 32] if block else s)
                            for k in range(100)] for i in range(70)])
    assert torch.equal(got, expect)
