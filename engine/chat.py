"""Chat prompts: a conversation (`messages`, a list of `{role, content}`) becomes prompt token ids through the
checkpoint's own chat template, exactly as transformers' `apply_chat_template(..., add_generation_prompt=True)`
renders and tokenizes it. The template writes the BOS itself, so the text is tokenized without special tokens
(transformers does the same; tokenizing the rendered text as a plain prompt would double the BOS)."""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import TemplateError

MESSAGE_KEYS = ("role", "content")


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
    ValueError when the template is missing or rejects the conversation (e.g. roles that do not alternate)."""
    if not has_chat_template(tokenizer):
        raise ValueError("the checkpoint has no chat template (tokenizer_config.json chat_template or "
                         "chat_template.jinja); send a prompt instead of messages")
    try:
        ids = tokenizer.apply_chat_template(conversation(messages), add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    except (TemplateError, TypeError, KeyError, ValueError) as e:  # the template's raise_exception(...) included
        raise ValueError(f"the chat template rejected these messages: {' '.join(str(e).split())}") from e
    return [int(t) for t in ids]
