"""The one rule that turns a row into prompt token ids, for every caller: the engine (`Engine._prompt_ids`), the
planning sample (pipeline/input/sample.py) and the Ray Data stage. A row gives its prompt as text (tokenized by
the checkpoint's tokenizer), as a conversation (rendered by its chat template, engine/chat.py) or as token ids
(an OpenAI Batch line's `prompt: [...]`, or ids measured earlier). Whatever goes wrong there is a `PromptError`
naming what is wrong and the fix, which fails that row alone: a conversation the template rejects, raises on,
recurses on or renders past its time limit, a prompt that gives no tokens, ids that are not integers or lie
outside the model's vocabulary (its embedding has `vocab_size` rows: a larger id would fail the whole batch)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from engine.chat import chat_prompt_ids, messages_problem


class PromptError(ValueError):
    """Why one row has no prompt token ids; its message is that row's error."""


def prompt_ids(tokenizer, vocab_size: int | None, *, text=None, messages=None, token_ids=None) -> list[int]:
    """The prompt's token ids from the first of `token_ids`, `messages`, `text` that is given, checked against
    `vocab_size` (None: not checked here; the engine checks again). Raises PromptError."""
    if token_ids is not None:
        return checked_ids(token_ids, vocab_size, "prompt_ids", "prompt_ids is empty; give at least one token")
    if messages is not None:
        problem = messages_problem(messages)
        if problem:
            raise PromptError(problem)
        try:
            ids = chat_prompt_ids(tokenizer, messages)
        except ValueError as e:
            raise PromptError(str(e)) from e
        return checked_ids(ids, vocab_size, "the rendered messages' token", "the chat template rendered these "
                           "messages as an empty prompt; check that it writes every role they use")
    return checked_ids(_tokenize(tokenizer, text), vocab_size, "the prompt's token",
                       "the prompt gives no tokens; give text that the tokenizer reads")


def request_prompt_ids(tokenizer, vocab_size: int | None, req) -> list[int]:
    """A `Request`'s prompt ids: its `prompt_ids`, else its `messages`, else its `prompt`. Raises PromptError."""
    return prompt_ids(tokenizer, vocab_size, text=req.prompt, messages=req.messages, token_ids=req.prompt_ids)


def _tokenize(tokenizer, text) -> list[int]:
    if not isinstance(text, str) or not text:
        what = "empty" if text == "" else f"not a string ({type(text).__name__})"
        raise PromptError(f"prompt is {what}; give a non-empty string")
    if tokenizer is None:
        raise PromptError("this engine was loaded without a tokenizer; give the prompt as token ids")
    try:
        return tokenizer(text)["input_ids"]
    except Exception as e:  # a tokenizer that fails on one text fails that row, not its batch
        raise PromptError(f"the tokenizer failed on this prompt: {type(e).__name__}: {' '.join(str(e).split())}") from e


def checked_ids(ids: Sequence, vocab_size: int | None, what: str, empty: str) -> list[int]:
    """`ids` as a list of ints, each in [0, vocab_size); raises PromptError naming the first bad one (`what[n]`),
    or saying `empty`."""
    ids = list(ids)
    if not ids:
        raise PromptError(empty)
    if all(type(t) is int for t in ids) and min(ids) >= 0 and (vocab_size is None or max(ids) < vocab_size):
        return ids  # the common case, checked in C-speed passes
    for n, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise PromptError(f"{what}[{n}] is {t!r}; expected integer token ids")
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = "token ids are never negative" if t < 0 else (
                f"outside the model's vocabulary of {vocab_size} ids (0 to {vocab_size - 1})")
            raise PromptError(f"{what}[{n}] is {t}, {bound}; give token ids of this model's tokenizer")
    return [int(t) for t in ids]
