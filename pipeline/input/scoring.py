"""Scoring rows instead of completing them (`flexbatch run --score`, `score=True`): each row's prompt, and the
text of its optional `continuation` column after it, go through the prefill once and come back as the
log-probability of every token given the ones before (engine `SamplingParams.prompt_logprobs`).

The prompt and the continuation are tokenized separately and their ids joined, as lm-evaluation-harness joins
`context_enc + continuation_enc`: the continuation's tokens are then exactly the last ones of the row, whatever
the tokenizer would have merged across the boundary. A scored row asks the engine for one new token
(`max_new_tokens=1`: the prefill makes its logits anyway, and no decode step runs); that token is dropped, so a
scored row's `completion` is "" and its `completion_tokens` 0, its `finish_reason` "length" (OpenAI's for
`max_tokens: 0`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pyarrow as pa

from engine.prompt_ids import PromptError, checked_ids, request_prompt_ids
from engine.request import Completion, Request, SamplingParams
from pipeline.input.utf8 import NotUtf8

CONTINUATION_COLUMN = "continuation"
SCORE_COLUMNS = ("prompt_logprobs", "continuation_logprob", "continuation_is_greedy")


# row columns a scored row does not use: it generates nothing, so an answer constraint would never apply (and
# is not compiled: a bad one fails no row), as its max_new_tokens column is overridden
UNUSED_COLUMNS = ("guided",)


def scoring_params(params: SamplingParams) -> SamplingParams:
    """`params` for a row that is scored, not completed: the prompt scored, one token asked for (and dropped),
    no answer constraint."""
    return dataclasses.replace(params, max_new_tokens=1, prompt_logprobs=True, stop=(), logprobs=False, guided=None)


def continuation_problem(value) -> str | None:
    """Why a row's continuation cannot be scored, or None (a null continuation scores the prompt alone)."""
    if isinstance(value, NotUtf8):
        return value.problem(f"column {CONTINUATION_COLUMN!r}")
    if value is None or isinstance(value, str) and value:
        return None
    if value == "":
        return (f"column {CONTINUATION_COLUMN!r} is empty in this row; give the text to score after the prompt, or "
                "null to score the prompt alone")
    return (f"column {CONTINUATION_COLUMN!r} holds a {type(value).__name__} in this row; expected a string (or "
            "null to score the prompt alone)")


def continuation_ids(tokenizer, text: str, vocab_size: int | None) -> list[int]:
    """The continuation's token ids, without the special tokens a tokenizer adds at the start of a text."""
    try:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception as e:  # a tokenizer that fails on one text fails that row, not its batch
        raise PromptError(f"the tokenizer failed on the continuation: {type(e).__name__}: {e}") from e
    return checked_ids(ids, vocab_size, "the continuation's token",
                       "the continuation gives no tokens; give text that the tokenizer reads, or null")


def scoring_items(items: Sequence[Request | Completion], continuations: Sequence | None, tokenizer,
                  vocab_size: int | None) -> tuple[list[Request | Completion], list[int]]:
    """`items` as scoring requests: each request's prompt ids (its own, or its prompt's or conversation's by the
    engine's rule) followed by its continuation's ids, and scoring params. Returns the items and each row's
    continuation length in tokens (0: none). A row whose prompt or continuation has no ids fails alone."""
    out: list[Request | Completion] = []
    lengths: list[int] = []
    for i, item in enumerate(items):
        text = continuations[i] if continuations is not None else None
        if not isinstance(item, Request):
            out.append(item)
            lengths.append(0)
            continue
        problem = continuation_problem(text)
        if problem:
            out.append(Completion.failed(item.id, problem))
            lengths.append(0)
            continue
        try:
            ids = request_prompt_ids(tokenizer, vocab_size, item)
            tail = continuation_ids(tokenizer, text, vocab_size) if text is not None else []
        except PromptError as e:
            out.append(Completion.failed(item.id, str(e)))
            lengths.append(0)
            continue
        out.append(dataclasses.replace(item, prompt_ids=tuple(ids + tail), params=scoring_params(item.params)))
        lengths.append(len(tail))
    return out, lengths


def scored(c: Completion, continuation_tokens: int) -> Completion:
    """A scored row's completion: the token the engine made is dropped. A continuation that `--truncate left`
    cut into (it no longer has a token before it) fails the row."""
    if c.finish_reason == "error":
        return c
    scores = c.prompt_logprobs or []
    if continuation_tokens > len(scores):
        return Completion.failed(c.id, f"the continuation's {continuation_tokens} tokens do not fit after the "
                                 f"{c.prompt_tokens} prompt tokens kept by --truncate left; shorten the row or use a "
                                 "model with a longer context", prompt_tokens=c.prompt_tokens)
    return dataclasses.replace(c, text="", completion_tokens=0, token_ids=[], logprobs=None, finish_reason="length")


def continuation_score(c: Completion, continuation_tokens: int) -> tuple[float | None, bool | None]:
    """(summed log-probability, whether every token was the most likely) of the row's last
    `continuation_tokens` tokens; (None, None) for a row without a continuation or that failed."""
    if c.prompt_logprobs is None or continuation_tokens == 0 or c.finish_reason == "error":
        return None, None
    lps = c.prompt_logprobs[-continuation_tokens:]
    return math.fsum(lps), all(c.prompt_greedy[-continuation_tokens:])


def score_columns(completions: Sequence[Completion], continuation_tokens: Sequence[int]) -> dict[str, pa.Array]:
    """The scoring output columns, row for row: `prompt_logprobs` (tokens 1..n-1 of prompt + continuation),
    `continuation_logprob` and `continuation_is_greedy` (null without a continuation, or for an error row)."""
    pairs = [continuation_score(c, n) for c, n in zip(completions, continuation_tokens)]
    return {
        "prompt_logprobs": pa.array([c.prompt_logprobs if c.finish_reason != "error" else None for c in completions],
                                    pa.list_(pa.float32())),
        "continuation_logprob": pa.array([p[0] for p in pairs], pa.float64()),
        "continuation_is_greedy": pa.array([p[1] for p in pairs], pa.bool_()),
    }
