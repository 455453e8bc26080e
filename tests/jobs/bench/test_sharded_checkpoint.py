"""The shard-by-shard random checkpoint (the 7B and 13B bench presets): it loads in transformers and in the engine,
greedy fp32 tokens agree, a stopped build resumes to the same bytes, and only the large presets take this path."""

from __future__ import annotations

import hashlib
import json

import torch

from engine.engine import Engine
from engine.request import Request, SamplingParams
from jobs.bench import models as bm
from jobs.bench.sharded_checkpoint import checkpoint_bytes, write_sharded_random

SMALL = bm.Preset(64, 160, 3, 4, 2, 300, max_position_embeddings=128, tie_word_embeddings=False)


def _digest(folder) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.glob("*.safetensors"))}


def test_loads_in_transformers_and_engine_with_equal_greedy_tokens(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "ckpt"
    bm.make_word_tokenizer(out, SMALL.vocab_size)
    write_sharded_random(out, SMALL.hf_config(), torch.bfloat16)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]  # as HF writes it
    assert len(set(index["weight_map"].values())) == SMALL.num_hidden_layers + 1  # one shard per layer + globals
    assert index["metadata"]["total_size"] == checkpoint_bytes(SMALL.hf_config(), torch.bfloat16)
    assert index["metadata"]["total_size"] == sum(f.stat().st_size for f in out.glob("*.safetensors")) - sum(
        8 + int.from_bytes(f.read_bytes()[:8], "little") for f in out.glob("*.safetensors"))  # less the headers

    ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in ref.parameters())
    assert n_params * 2 == index["metadata"]["total_size"]  # nothing missing, nothing left at its init
    prompts = bm.prompt_ids(3, 7, SMALL.vocab_size, seed=1)
    with torch.no_grad():
        want = [ref.generate(torch.tensor([p]), do_sample=False, max_new_tokens=6, min_new_tokens=6,
                             pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    eng = Engine.load(out, dtype="float32")
    got = eng.generate([Request(str(i), "", SamplingParams(max_new_tokens=6), prompt_ids=tuple(p))
                        for i, p in enumerate(prompts)])
    assert [list(c.token_ids) for c in got] == want


def test_a_stopped_build_resumes_to_the_same_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_sharded_random(a, SMALL.hf_config(), torch.bfloat16)
    write_sharded_random(b, SMALL.hf_config(), torch.bfloat16)
    first = _digest(b)
    victim = sorted(b.glob("model-*.safetensors"))[2]
    victim.unlink()
    (b / "model.safetensors.index.json").unlink()
    (b / f".{victim.name}.tmp").write_bytes(b"torn")  # what a killed build leaves
    write_sharded_random(b, SMALL.hf_config(), torch.bfloat16)
    assert _digest(b) == first == _digest(a)
    assert (b / "model.safetensors.index.json").is_file()


def test_only_checkpoints_over_the_threshold_are_streamed():
    seven = bm.PRESETS["7b"].hf_config()
    assert 14e9 < checkpoint_bytes(seven, torch.bfloat16) < 15.5e9
    assert checkpoint_bytes(bm.PRESETS["13b"].hf_config(), torch.bfloat16) > 24 << 30
    assert checkpoint_bytes(bm.PRESETS["550m"].hf_config(), torch.bfloat16) < bm.STREAM_ABOVE_BYTES
