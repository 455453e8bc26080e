"""Chat prompts: a conversation (`messages`, a list of `{role, content}`) becomes prompt token ids through the
checkpoint's own chat template, exactly as transformers' `apply_chat_template(..., add_generation_prompt=True)`
renders and tokenizes it. The template writes the BOS itself, so the text is tokenized without special tokens
(transformers does the same; tokenizing the rendered text as a plain prompt would double the BOS).

A template is code that runs on every row: whatever it does wrong on one conversation (raises, recurses without
end, loops past CHAT_TEMPLATE_SECONDS) is a `ValueError` naming what happened, which the prompt-ids rule
(engine/prompt_ids.py) makes that row's error."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager

from jinja2 import TemplateError

from engine.errors import one_line

MESSAGE_KEYS = ("role", "content")
# A chat template renders a conversation in about a millisecond; one still running after this many seconds is
# taken to be looping (e.g. nested `range(100000)`), and its row fails. Read at each render (tests lower it).
CHAT_TEMPLATE_SECONDS = 2.0
TEMPLATE_FILENAME = "<template>"  # the file name of the code jinja compiles a template string into


class ChatTemplateTimeout(Exception):
    """Raised inside a template's own code when its render runs past its time limit."""


def messages_problem(messages) -> str | None:
    """Why `messages` is not a conversation the engine can render, or None if it is: a non-empty list of
    objects with a non-empty string `role` and a string `content` (content parts and tool calls are not
    supported)."""
    if messages is None:
        return "messages is null in this row; expected a list of {role, content} objects"
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        return f"messages holds a {type(messages).__name__}; expected a list of {{role, content}} objects"
    if len(messages) == 0:
        return "messages is an empty list; give at least one {role, content} object"
    for n, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{n}] is a {type(m).__name__}; expected a {{role, content}} object"
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            return f"messages[{n}].role is {role!r}; expected a role such as 'system', 'user' or 'assistant'"
        if not isinstance(content, str):
            return (f"messages[{n}].content is a {type(content).__name__}; expected a string (content parts and "
                    "tool calls are not supported)")
    return None


def conversation(messages: Sequence[dict]) -> list[dict]:
    """Plain dicts without null fields: a Parquet struct column gives every message each struct field, null
    where a row lacks it, and transformers drops null fields the same way before rendering."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template and a generation prompt. Raises
    ValueError, in one line, when the template is missing, rejects the conversation (e.g. roles that do not
    alternate), fails on it in any other way, or runs past CHAT_TEMPLATE_SECONDS."""
    if not has_chat_template(tokenizer):
        raise ValueError("the checkpoint has no chat template (tokenizer_config.json chat_template or "
                         "chat_template.jinja); send a prompt instead of messages")
    seconds = CHAT_TEMPLATE_SECONDS
    try:
        with time_limit(seconds):
            ids = tokenizer.apply_chat_template(conversation(messages), add_generation_prompt=True, tokenize=True,
                                                return_dict=False)
    except ChatTemplateTimeout:
        raise ValueError(f"the chat template was still rendering these messages after {seconds:g} s (a loop "
                         "that does not end?); fix the template") from None
    except RecursionError:
        raise ValueError("the chat template recursed without end on these messages (RecursionError); fix the "
                         "template's macros") from None
    except (TemplateError, TypeError, KeyError, ValueError) as e:  # the template's raise_exception(...) included
        raise ValueError(f"the chat template rejected these messages: {one_line(e)}") from e
    except Exception as e:  # the template's own code failed (e.g. a division by zero)
        raise ValueError(f"the chat template failed on these messages: {type(e).__name__}: {one_line(e)}; fix the "
                         "template") from e
    return [int(t) for t in ids]


@contextmanager
def time_limit(seconds: float):
    """Raise ChatTemplateTimeout inside template code that runs past `seconds`. A trace function on this thread
    sees every call and line of the template's compiled code (and of nothing else), so a runaway loop or macro is
    stopped where it runs, in whichever thread renders; the thread's earlier trace function is put back after.
    Tracing makes a render slower (under a millisecond for a short conversation), which a job pays once per row."""
    deadline = time.monotonic() + seconds
    fired = False

    def on_line(frame, event, arg):
        nonlocal fired
        if not fired and time.monotonic() > deadline:
            fired = True  # once: jinja's error handling runs template-named code too
            raise ChatTemplateTimeout
        return on_line

    def on_call(frame, event, arg):
        return on_line(frame, event, arg) if frame.f_code.co_filename == TEMPLATE_FILENAME else None

    before = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(before)

