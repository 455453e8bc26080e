"""Decode attention by the kernel of a fixed rule: SDPA and the chunked path agree, greedy float32 tokens equal
transformers' with SDPA decode over plain and 4-bit caches, and the rule names the own kernel wherever it is built
and takes the head size, else the chunked path over a 4-bit cache and SDPA over a plain one."""

import pytest
import torch

from engine.compression.int4 import quantize
from engine.kernels import decode_choice as dk


@pytest.mark.parametrize("kind", ["plain", "4bit"])
def test_sdpa_and_chunked_decode_agree(kind):
    torch.manual_seed(0)
    q = torch.randn(3, 8, 1, 32)
    k, v = torch.randn(3, 2, 40, 32), torch.randn(3, 2, 40, 32)
    if kind == "4bit":
        k, v = quantize(k, dk.KV_CONFIG), quantize(v, dk.KV_CONFIG)
    mask = torch.rand(3, 1, 1, 40) > 0.3
    mask[..., -1] = True
    torch.testing.assert_close(dk.sdpa(q, k, v, mask), dk.decode_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt", "mistral_window"])
@pytest.mark.parametrize("compress_cache", [False, True])
def test_greedy_fp32_with_sdpa_decode_matches_transformers(greedy_fp32_matches_transformers, variant, compress_cache,
                                                           sdpa_decode):
    greedy_fp32_matches_transformers(variant, compress_cache)


@pytest.mark.parametrize("machine", ["amx", "avx2", "scalar"])
def test_the_rule_names_the_own_kernel_where_it_takes_the_shape(monkeypatch, machine):
    monkeypatch.undo()  # the autouse pin of the chunked path
    monkeypatch.setattr(dk, "kernel_class", lambda: machine)
    own = machine != "scalar"
    assert dk.decode_kernel("plain", torch.bfloat16, 3, 8, 2, 64) == ("own" if own else "sdpa")
    assert dk.decode_kernel("4bit", torch.float32, 3, 8, 2, 128) == ("own" if own else "chunked")
    assert dk.decode_kernel("plain", torch.float32, 3, 8, 2, 24) == "sdpa"  # a head size the own kernel refuses
    assert dk.decode_kernel("4bit", torch.float32, 3, 8, 2, 320) == "chunked"
    q = torch.randn(3, 4, 1, 16)
    k = v = torch.randn(3, 2, 10, 16)
    out = dk.decode(q, k, v, torch.ones(3, 1, 1, 10, dtype=torch.bool))
    torch.testing.assert_close(out, dk.sdpa(q, k, v, torch.ones(3, 1, 1, 10, dtype=torch.bool)))
