"""The trained demo model: compressed runs stay close to the uncompressed one, measured where it matters
(a model with confident predictions, unlike random weights)."""

import json

import pytest

from engine.generate import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.score import perplexity
from tests.conftest import REPO

DATA = REPO / "examples" / "demo-data"
COMPRESSED = {
    "weights": Policy(compress_weight=True),
    "cache": Policy(compress_cache=True),
    "weights+cache": Policy(compress_weight=True, compress_cache=True),
}


def _held_out(n_per_task: int = 12) -> list[dict]:
    rows = []
    for f in sorted(DATA.glob("*.jsonl")):
        if f.stem != "train":
            rows += [json.loads(line) for line in f.read_text().splitlines()[:n_per_task]]
    return rows


@pytest.fixture(scope="module")
def greedy_fp32(demo_model_dir):
    reqs = [Request(r["id"], r["input"], SamplingParams(max_new_tokens=12)) for r in _held_out()]
    engine = Engine.load(demo_model_dir, dtype="float32")
    return reqs, [c.token_ids for c in engine.generate(reqs)]


@pytest.mark.parametrize("name", list(COMPRESSED))
def test_compressed_greedy_agrees_on_90_percent_of_tokens(demo_model_dir, greedy_fp32, name):
    reqs, expected = greedy_fp32
    engine = Engine.load(demo_model_dir, dtype="float32", policy=COMPRESSED[name])
    got = [c.token_ids for c in engine.generate(reqs)]
    pairs = [(a, b) for x, y in zip(expected, got) for a, b in zip(x, y)]
    agree = sum(a == b for a, b in pairs) / len(pairs)
    assert len(pairs) >= 100 and agree >= 0.90, f"{name}: top-1 agreement {agree:.3f} over {len(pairs)} tokens"


def test_weight_and_cache_compression_raise_perplexity_by_at_most_5_percent(demo_model_dir):
    texts = [r["input"] + " " + r["references"][0] for r in _held_out(8)]
    base = perplexity(Engine.load(demo_model_dir, dtype="float32"), texts)
    packed = perplexity(Engine.load(demo_model_dir, dtype="float32", policy=COMPRESSED["weights+cache"]), texts)
    assert packed <= base * 1.05, f"perplexity {base:.3f} -> {packed:.3f} ({packed / base - 1:+.1%})"
