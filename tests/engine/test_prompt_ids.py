"""The prompt-ids rule (engine/prompt_ids.py): whatever stops a row from becoming prompt token ids fails that row
alone, with a message naming it: a chat template that raises, recurses, renders nothing or loops past its time
limit, token ids outside the vocabulary or negative. The other rows of the batch complete as they would alone."""

import shutil
import sys
import time

import numpy as np
import pytest

import engine.chat
from engine.engine import Engine
from engine.prompt_ids import PromptError, checked_ids, prompt_ids
from engine.request import Request, SamplingParams

# Qwen2's layout, with one way to fail per trigger message (one line: jinja keeps the text between tags)
FAULTY_TEMPLATE = (
    "{% macro deep(n) %}{{ deep(n) }}{% endmacro %}"
    "{% for m in messages %}"
    "{% if m['content'] == 'boom' %}{{ 1 / 0 }}{% endif %}"
    "{% if m['content'] == 'deep' %}{{ deep(1) }}{% endif %}"
    "{% if m['content'] == 'slow' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}{% endif %}"
    "{% if m['content'] != 'empty' %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt and messages[-1]['content'] != 'empty' %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def faulty(chat_checkpoint, tmp_path_factory):
    """A chat checkpoint whose template fails on some messages."""
    folder = shutil.copytree(chat_checkpoint("qwen2"), tmp_path_factory.mktemp("faulty") / "qwen2")
    (folder / "chat_template.jinja").write_text(FAULTY_TEMPLATE)
    return Engine.load(folder, dtype="float32")


def _ask(text: str, n: int = 4) -> Request:
    return Request(text, "", SamplingParams(max_new_tokens=n), messages=({"role": "user", "content": text},))


def test_bad_prompts_fail_their_rows_and_the_others_complete_as_alone(faulty, monkeypatch, one_thread):
    monkeypatch.setattr(engine.chat, "CHAT_TEMPLATE_SECONDS", 0.5)
    vocab = faulty.spec.vocab_size
    p = SamplingParams(max_new_tokens=4)
    good = [_ask("hello there"), Request("text", "The quick brown fox", p), Request("ids", "", p, prompt_ids=(5, 6))]
    bad = {
        "boom": ("the chat template failed on these messages: ZeroDivisionError: division by zero", _ask("boom")),
        "deep": ("recursed without end", _ask("deep")),
        "empty": ("rendered these messages as an empty prompt", _ask("empty")),
        "slow": ("still rendering these messages after 0.5 s", _ask("slow")),
        "big": (f"prompt_ids[2] is {vocab}, outside the model's vocabulary of {vocab} ids (0 to {vocab - 1})",
                Request("big", "", p, prompt_ids=(1, 2, vocab))),
        "neg": ("prompt_ids[0] is -1, token ids are never negative", Request("neg", "", p, prompt_ids=(-1, 3))),
        "nil": ("prompt_ids is empty", Request("nil", "", p, prompt_ids=())),
    }
    mixed = [good[0], *[r for _, r in bad.values()], *good[1:]]
    started = time.perf_counter()
    out = {c.id: c for c in faulty.generate(mixed)}
    assert time.perf_counter() - started < 30  # the looping template was stopped
    for name, (message, _) in bad.items():
        assert out[name].finish_reason == "error" and message in out[name].error, (name, out[name].error)
    alone = faulty.generate(good)
    assert [(out[c.id].token_ids, out[c.id].error) for c in alone] == [(c.token_ids, None) for c in alone]
    assert all(c.completion_tokens >= 1 for c in alone)


def test_the_rule_is_the_same_for_every_form_of_prompt(faulty):
    tok, vocab = faulty.tokenizer, faulty.spec.vocab_size
    text = "The quick brown fox"
    assert prompt_ids(tok, vocab, text=text) == list(tok(text)["input_ids"])
    assert prompt_ids(tok, vocab, token_ids=[np.int64(5), 6]) == [5, 6]
    with pytest.raises(PromptError, match=r"prompt_ids\[1\] is True; expected integer token ids"):
        prompt_ids(tok, vocab, token_ids=[5, True])
    with pytest.raises(PromptError, match="prompt is empty"):
        prompt_ids(tok, vocab, text="")
    with pytest.raises(PromptError, match=r"messages\[0\]\.role is None"):
        prompt_ids(tok, vocab, messages=[{"content": "hi"}])
    with pytest.raises(PromptError, match="failed on these messages: ZeroDivisionError"):
        prompt_ids(tok, vocab, messages=[{"role": "user", "content": "boom"}])
    assert checked_ids([0, vocab - 1], vocab, "x", "empty") == [0, vocab - 1]
    with pytest.raises(PromptError, match=rf"x\[1\] is {vocab + 5}, outside"):
        checked_ids([0, vocab + 5], vocab, "x", "empty")


def test_the_time_limit_traces_only_while_rendering_and_puts_the_tracer_back(faulty):
    def mine(frame, event, arg):
        return None

    before = sys.gettrace()
    sys.settrace(mine)
    try:
        ids = engine.chat.chat_prompt_ids(faulty.tokenizer, [{"role": "user", "content": "hello"}])
        assert sys.gettrace() is mine and ids
    finally:
        sys.settrace(before)


def test_a_looping_template_is_stopped_in_any_thread(faulty, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(engine.chat, "CHAT_TEMPLATE_SECONDS", 0.3)
    slow = [{"role": "user", "content": "slow"}]
    with ThreadPoolExecutor(max_workers=1) as pool:  # as where an actor or a Ray Data stage renders off the main thread
        error = pool.submit(pytest.raises, ValueError, engine.chat.chat_prompt_ids, faulty.tokenizer, slow).result(60)
    assert "still rendering these messages after 0.3 s" in str(error.value)
