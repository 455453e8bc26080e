"""Decode attention by measured kernel: SDPA and the chunked path agree, greedy float32 tokens equal transformers'
with SDPA decode over plain and 4-bit caches, and the choice is measured once per shape and cached."""

import pytest
import torch

from engine.compression.int4 import quantize
from engine.kernels import decode_choice as dk
from engine.kernels import rates as kernel_rates


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


def test_the_kernel_is_measured_once_per_shape_bucket_and_cached(tmp_path, monkeypatch):
    monkeypatch.undo()  # the autouse pin of the chunked path
    monkeypatch.setattr(kernel_rates, "DEFAULT_PATH", tmp_path / "rates.json")
    calls = []
    real = dk.measure

    def counted(*args, **kw):
        calls.append(args)
        return real(*args, repeats=1)

    monkeypatch.setattr(dk, "measure", counted)
    kernel_rates._memo.clear()
    q = torch.randn(3, 4, 1, 16)
    k = v = torch.randn(3, 2, 10, 16)
    out = dk.decode(q, k, v, torch.ones(3, 1, 1, 10, dtype=torch.bool))
    assert out.shape == q.shape and dk.decode_kernel("plain", torch.float32, 4, 4, 2, 16) in dk.KERNELS
    assert calls == [("plain", torch.float32, 4, 4, 2, 16)]  # batch 3 measured as 4, once
    assert f"decode-attention|plain|float32|4x4x2x16|{dk.MEASURE}" in (tmp_path / "rates.json").read_text()
    # lengths between the chunked path's chunk boundaries, as a decode's are (whole chunks flattered it)
    assert all(s % 64 for s in dk.SLOTS) and min(dk.SLOTS) > 64
    kernel_rates._memo.clear()


def test_the_measurement_fits_a_small_memory_room(monkeypatch):
    """Measured inside a job, the kernels' caches stay within a sixteenth of the memory left: fewer rows and
    only the lengths that fit, not 2 x 64 MiB beside a block that filled its budget."""
    from types import SimpleNamespace

    from engine.kernels import decode_choice as dk

    monkeypatch.setattr(dk, "memory_room", lambda: SimpleNamespace(available_bytes=32 << 20))
    out = dk.measure("plain", torch.float32, 1024, 8, 4, 64, repeats=1)
    assert out["batch_measured"] < 1024 and [t["rows"] for t in out["timings"]] == [dk.SLOTS[0]]
    assert dk.kv_bytes(out["batch_measured"], 4, dk.SLOTS[0], 64) <= (32 << 20) // 16
    monkeypatch.setattr(dk, "memory_room", lambda: SimpleNamespace(available_bytes=None))
    assert dk.measure("plain", torch.float32, 4, 8, 4, 64, repeats=1)["batch_measured"] == 4
