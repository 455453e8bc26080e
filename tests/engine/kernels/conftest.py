import pytest

from engine.engine import Engine
from engine.kernels import compiled, decode_choice
from engine.policy import Policy
from engine.request import Request, SamplingParams
from tests.engine.reference import PROMPTS, hf_greedy, hf_model

MAX_NEW = 12


@pytest.fixture
def pinned():
    """Pin the own kernels to one instruction set for a test; the best set is chosen again afterwards."""
    mod = compiled.ops()
    yield lambda isa: mod.select_isa(isa)
    mod.select_isa("")


@pytest.fixture
def greedy_fp32_matches_transformers(checkpoint):
    """check(variant, compress_cache) for the decode kernel a test picked: greedy float32 tokens equal transformers'
    (over a 4-bit cache, which is lossy, they equal the chunked path's over the same cache)."""

    def check(variant: str, compress_cache: bool):
        model_dir = checkpoint(variant)
        policy = Policy(gbs=4, num_gb=1, compress_cache=compress_cache)
        engine = Engine.load(model_dir, dtype="float32", policy=policy)
        requests = [Request(str(i), p, SamplingParams(max_new_tokens=MAX_NEW)) for i, p in enumerate(PROMPTS)]
        got = [c.token_ids for c in engine.generate(requests)]
        if compress_cache:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(decode_choice, "decode_kernel", lambda *a: "chunked")
                assert got == [c.token_ids for c in engine.generate(requests)]
            return
        ref = hf_model(model_dir)
        assert got == [hf_greedy(ref, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in PROMPTS]

    return check
