"""Greedy float32 tokens equal transformers' `generate`, token for token, for every supported family, with
prompts of different lengths batched together (left padding) and in batches of one."""

import pytest

from engine.engine import Engine
from engine.request import Request, SamplingParams
from tests.checkpoints import VARIANTS
from tests.engine.reference import PROMPTS, hf_greedy, hf_model

MAX_NEW = 12


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_fp32_matches_transformers(checkpoint, variant):
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32")
    ref = hf_model(model_dir)
    expected = [hf_greedy(ref, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in PROMPTS]
    requests = [Request(str(i), p, SamplingParams(max_new_tokens=MAX_NEW)) for i, p in enumerate(PROMPTS)]
    for batch_size in (len(PROMPTS), 2, 1):
        got = engine.generate(requests, batch_size=batch_size)
        assert [c.token_ids for c in got] == expected, f"batch_size={batch_size}"
        assert [c.id for c in got] == [r.id for r in requests]
    assert any(len(e) == MAX_NEW for e in expected), "reference stopped early everywhere: test too weak"


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "opt"])
def test_the_row_local_part_of_a_layer_in_small_row_chunks_keeps_the_tokens(checkpoint, variant, monkeypatch):
    """Prefill's norm, MLP and residual add run over chunks of rows (engine.models.by_rows); chunks of 3 rows
    (several per prompt, some cut mid-prompt) still give transformers' tokens."""
    import engine.models as models
    from engine.models import llama, opt

    model_dir = checkpoint(variant)
    eng = Engine.load(model_dir, dtype="float32")
    calls = []

    def by_rows(fn, h, width, *aligned):
        monkeypatch.setattr(models, "CHUNK_BYTES", 3 * 4 * width)
        calls.append(h.numel() // h.shape[-1])
        return models.by_rows(fn, h, width, *aligned)

    for family in (llama, opt):
        monkeypatch.setattr(family, "by_rows", by_rows)
    ref = hf_model(model_dir)
    expected = [hf_greedy(ref, eng.tokenizer, p, MAX_NEW, eng.eos_ids) for p in PROMPTS]
    got = eng.generate([Request(str(i), p, SamplingParams(max_new_tokens=MAX_NEW)) for i, p in enumerate(PROMPTS)])
    assert [c.token_ids for c in got] == expected
    assert max(calls) > 3, "no call had more rows than a chunk: the chunked path did not run"
