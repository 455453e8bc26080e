"""What a caller asks of the engine (`Request`, `SamplingParams`) and what it gets back (`Completion`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import InvalidParamsError
from engine.guided import Guided

FINISH_REASONS = ("stop", "length", "eos", "error")
TRUNCATE_CHOICES = ("error", "left")
DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class SamplingParams:
    """Decoding options for one request. `temperature == 0` means greedy; `top_k == 0` and `top_p == 1` disable
    those filters. `seed` makes sampling reproducible per request, independent of the batch it runs in.
    `prompt_logprobs` scores the prompt in the same forward pass as its prefill (with max_new_tokens=1 a request
    is scored and nothing more is decoded); `score_last` > 0 scores only its last `score_last` tokens (a
    continuation after its context, as lm-eval's loglikelihood asks): the LM head then runs at those positions
    only. `guided` constrains the answer while decoding (engine/guided.py: one of some choices, a regex, a JSON
    schema, any JSON object, an EBNF grammar); a dict is read by `Guided.from_mapping`."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int = 0
    logprobs: bool = False
    prompt_logprobs: bool = False  # also score the prompt: each token's log-probability given the ones before
    score_last: int = 0  # with prompt_logprobs: score only the prompt's last this many tokens (0: every token)
    guided: Guided | None = None  # what the answer must match, enforced while decoding (engine/loop/grammar.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.guided is not None and not isinstance(self.guided, Guided):
            object.__setattr__(self, "guided", Guided.from_mapping(self.guided))
        _check_int("max_new_tokens", self.max_new_tokens, low=1, hint="use a positive integer such as 64")
        _check_float("temperature", self.temperature, ok=lambda v: v >= 0, hint="use 0 for greedy or a value > 0")
        _check_float("top_p", self.top_p, ok=lambda v: 0 < v <= 1, hint="use a value in (0, 1]; 1 disables it")
        _check_int("top_k", self.top_k, low=0, hint="use 0 to disable it or a positive integer")
        _check_int("seed", self.seed, low=0, hint="use a non-negative integer")
        _check_int("score_last", self.score_last, low=0, hint="use 0 to score every prompt token or a positive count")
        if self.score_last and not self.prompt_logprobs:
            raise InvalidParamsError(f"score_last={self.score_last} scores part of the prompt: it needs "
                                     "prompt_logprobs=True")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise InvalidParamsError(f"stop={s!r}: each stop string must be a non-empty string")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, value, low: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidParamsError(f"{name}={value!r} is invalid: {hint}")


def _check_float(name: str, value, ok, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise InvalidParamsError(f"{name}={value!r} is invalid: {hint}")


@dataclass(frozen=True)
class Request:
    """One prompt to complete. `id` is carried to the `Completion` unchanged. With `messages` (a list of
    `{role, content}`), the prompt is that conversation rendered by the checkpoint's chat template
    (engine/chat.py) and `prompt` is not used. With `forced_ids`, the engine emits those tokens instead of
    choosing (with `logprobs=True` this scores a continuation, e.g. for perplexity, through the same decode
    path and KV cache as generation)."""

    id: str
    prompt: str
    params: SamplingParams = field(default_factory=SamplingParams)
    forced_ids: tuple[int, ...] | None = None  # teacher forcing: these tokens are emitted instead of sampled
    prompt_ids: tuple[int, ...] | None = None  # an already tokenized prompt (then `prompt` is not tokenized)
    messages: tuple[dict, ...] | None = None  # a chat conversation (then `prompt` is not used)


@dataclass
class Completion:
    """The result for one `Request`. A row that could not run has `finish_reason == "error"` and a message in
    `error`; the other rows of its batch are unaffected."""

    id: str
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "error"
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    # with `prompt_logprobs`: for prompt tokens 1..n-1, the log-probability of each given the ones before, and
    # whether it was the most likely token there (the first token has no context, so neither list covers it);
    # with `score_last`, for the last that many of them only
    prompt_logprobs: list[float] | None = None
    prompt_greedy: list[bool] | None = None

    @classmethod
    def failed(cls, id: str, message: str, prompt_tokens: int = 0) -> Completion:
        return cls(id=id, finish_reason="error", error=message, prompt_tokens=prompt_tokens)
