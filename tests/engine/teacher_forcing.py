"""Teacher forcing through the engine's decode path: log-probabilities and perplexity of texts, token by token
(so a compressed KV cache is part of what is measured); the tests' check of decode, beside the prefill's
prompt log-probabilities (engine/loop/prompt_logprobs.py) that `--score` uses."""

from __future__ import annotations

import math

from engine.request import Request, SamplingParams


def continuation_logprobs(engine, texts: list[str], prefix_tokens: int = 1) -> list[list[float]]:
    """For each text, the log-probabilities of its tokens after the first `prefix_tokens`, each predicted
    from the tokens before it (teacher forcing)."""
    requests = []
    for n, text in enumerate(texts):
        ids = engine.tokenizer(text)["input_ids"]
        if len(ids) <= prefix_tokens:
            raise ValueError(f"text {n} has {len(ids)} tokens; it needs more than prefix_tokens={prefix_tokens}")
        forced = tuple(ids[prefix_tokens:])
        params = SamplingParams(max_new_tokens=len(forced), logprobs=True)
        requests.append(Request(str(n), text, params, forced_ids=forced, prompt_ids=tuple(ids[:prefix_tokens])))
    return [c.logprobs for c in engine.generate(requests)]


def perplexity(engine, texts: list[str], prefix_tokens: int = 1) -> float:
    lps = [lp for row in continuation_logprobs(engine, texts, prefix_tokens) for lp in row]
    return math.exp(-sum(lps) / len(lps))
