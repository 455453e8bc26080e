"""What a caller asks of the engine (`Request`, `SamplingParams`) and what it gets back (`Completion`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.errors import InvalidParamsError
from engine.guided import Guided
from engine.options import Flag, Option, OptionError, check_fields, option, options_of

FINISH_REASONS = ("stop", "length", "eos", "error")
TRUNCATE_CHOICES = ("error", "left")
DEFAULT_MAX_NEW_TOKENS = 64
MAX_SEED = 2**64 - 1  # a sampling seed is used as it is (torch.Generator.manual_seed), never reduced
# lm-eval gives the decoding options per request, in each task's generation kwargs, not as model_args
_PER_REQUEST = ("model_args", "lm-eval gives them per request: a task's generation_kwargs")
TRUNCATE = Option("truncate", kind="choice", choices=TRUNCATE_CHOICES, default="error", flag=Flag("--truncate"),
                  absent=(("model_args", "lm-eval's requests are cut on the left, as its hf backend cuts them"),),
                  help="A prompt longer than the context: 'error' fails that row, 'left' keeps its last tokens.")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding options for one request. `temperature == 0` means greedy; `top_k == 0` and `top_p == 1` disable
    those filters. `seed` makes sampling reproducible per request, independent of the batch it runs in.
    `prompt_logprobs` scores the prompt in the same forward pass as its prefill (with max_new_tokens=1 a request
    is scored and nothing more is decoded); `score_last` > 0 scores only its last `score_last` tokens (a
    continuation after its context, as lm-eval's loglikelihood asks): the LM head then runs at those positions
    only. `guided` constrains the answer while decoding (engine/guided.py: one of some choices, a regex, a JSON
    schema, any JSON object, an EBNF grammar); a dict is read by `Guided.from_mapping`."""

    max_new_tokens: int = option(DEFAULT_MAX_NEW_TOKENS, kind="int", low=1, absent=(_PER_REQUEST,),
                                 flag=Flag("--max-new-tokens"),
                                 help="Most tokens to generate per row (per-row column: max_new_tokens).")
    temperature: float = option(0.0, kind="number", low=0, hint="0 is greedy", absent=(_PER_REQUEST,),
                                flag=Flag("--temperature"),
                                help="Sampling temperature; 0 is greedy (per-row column: temperature).")
    top_p: float = option(1.0, kind="number", low=0, low_open=True, high=1, hint="1 disables it",
                          absent=(_PER_REQUEST,), flag=Flag("--top-p"),
                          help="Nucleus sampling mass in (0, 1]; 1 disables it (per-row column: top_p).")
    top_k: int = option(0, kind="int", low=0, hint="0 disables it", absent=(_PER_REQUEST,), flag=Flag("--top-k"),
                        help="Sample among the k likeliest tokens; 0 disables it (per-row column: top_k).")
    stop: tuple[str, ...] = option((), kind="texts", absent=(_PER_REQUEST,),
                                   flag=Flag("--stop", metavar="TEXT", default_text="none"),
                                   help="Stop string, repeatable; the completion is cut before it (per-row column: "
                                        "stop, a list of strings).")
    seed: int = option(0, kind="int", low=0, high=MAX_SEED, hint="torch's generators take 64-bit seeds",
                       absent=(_PER_REQUEST,), flag=Flag("--seed"),
                       help="Job seed, 0 to 2^64-1; a row without its own seed gets one derived from this and its id, "
                            "so rows differ and reruns are identical (per-row column: seed).")
    logprobs: bool = option(False, kind="bool", flag=Flag("--logprobs", default_text="off"),
                            absent=(_PER_REQUEST, ("ray", "the stage's output columns are Ray Data LLM's: none")),
                            help="Add a logprobs column: the log-probability of each generated token.")
    prompt_logprobs: bool = False  # also score the prompt: each token's log-probability given the ones before
    score_last: int = 0  # with prompt_logprobs: score only the prompt's last this many tokens (0: every token)
    guided: Guided | None = None  # what the answer must match, enforced while decoding (engine/loop/grammar.py)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.guided is not None and not isinstance(self.guided, Guided):
            object.__setattr__(self, "guided", Guided.from_mapping(self.guided))
        _check_int("score_last", self.score_last, low=0, hint="use 0 to score every prompt token or a positive count")
        if self.score_last and not self.prompt_logprobs:
            raise InvalidParamsError(f"score_last={self.score_last} scores part of the prompt: it needs "
                                     "prompt_logprobs=True")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_context(params: SamplingParams, context: int) -> None:
    """Refuse, as the declared option bounded by the model, a max_new_tokens that leaves no room for a prompt in
    the model's context of `context` tokens: before a job runs, rather than failing every row alone."""
    if params.max_new_tokens >= context:
        declared = options_of(SamplingParams)["max_new_tokens"]
        hint = f"the model's context holds {context} tokens: the prompt's and those generated"
        raise OptionError(dataclasses.replace(declared, high=context - 1, hint=hint), params.max_new_tokens)


def _check_int(name: str, value, low: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
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
