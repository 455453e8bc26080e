"""Chat prompts: token ids equal transformers' `apply_chat_template`, greedy completions equal its `generate` on
the rendered prompt, EOS ids from generation_config.json, and bad conversations as row errors."""

import pytest
import torch

from engine.engine import Engine
from engine.request import Request, SamplingParams
from tests.chat_checkpoints import CHAT_STYLES, STYLES, set_generation_eos
from tests.engine.reference import hf_model

CONVERSATIONS = [
    [{"role": "user", "content": "What is 12 plus 30?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Product A: red kettle 2L. Product B: kettle red 2 l. Same?"}],
    [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "return a + b"},
     {"role": "user", "content": "  The quick brown fox  "}],
]


def _turns(style: str) -> list[list[dict]]:
    """Mistral's template takes no system message (it raises on one)."""
    return [c for c in CONVERSATIONS if style != "mistral" or c[0]["role"] != "system"]


def _hf_ids(tokenizer, messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def _hf_greedy(model, ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation, stopping on the checkpoint's own generation_config EOS ids."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                             min_new_tokens=0, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("style", CHAT_STYLES)
def test_chat_prompt_ids_equal_transformers_with_one_bos(chat_checkpoint, style, one_thread):
    engine = Engine.load(chat_checkpoint(style), dtype="float32")
    tok = engine.tokenizer
    reqs = [Request(str(i), "", SamplingParams(max_new_tokens=1), messages=tuple(m))
            for i, m in enumerate(_turns(style))]
    out = engine.generate(reqs)
    for req, c in zip(reqs, out):
        expected = _hf_ids(tok, list(req.messages))
        assert c.error is None and c.prompt_tokens == len(expected)
        assert engine._prompt_ids(req) == expected
        if STYLES[style]["bos"]:
            assert expected[0] == tok.bos_token_id and expected.count(tok.bos_token_id) == 1
            assert tok(tok.decode(expected))["input_ids"][:2] == [tok.bos_token_id] * 2  # what a plain prompt would do


@pytest.mark.parametrize("style", CHAT_STYLES)
def test_greedy_chat_completions_equal_transformers_generate(chat_checkpoint, style, one_thread):
    model_dir = chat_checkpoint(style)
    engine = Engine.load(model_dir, dtype="float32")
    ref = hf_model(model_dir)
    assert engine.eos_ids == tuple(ref.generation_config.eos_token_id)
    reqs = [Request(str(i), "", SamplingParams(max_new_tokens=12), messages=tuple(m))
            for i, m in enumerate(_turns(style))]
    out = engine.generate(reqs, batch_size=4)
    for req, c in zip(reqs, out):
        expected = _hf_greedy(ref, _hf_ids(engine.tokenizer, list(req.messages)), 12)
        assert c.token_ids == expected, f"{style} {req.id}"


def test_several_eos_ids_from_generation_config_stop_like_transformers(chat_checkpoint, one_thread, tmp_path):
    """generation_config.json names two EOS ids; the second is a token the model greedily emits mid-answer, so
    both engines must stop right there (and config.json's own eos id, not listed there, must not stop a row)."""
    import shutil

    model_dir = shutil.copytree(chat_checkpoint("llama3"), tmp_path / "llama3")
    engine = Engine.load(model_dir, dtype="float32")
    messages = CONVERSATIONS[1]
    ids = _hf_ids(engine.tokenizer, messages)
    free = engine.generate([Request("a", "", SamplingParams(max_new_tokens=10), messages=tuple(messages))])[0]
    stop_at = 3
    assert len(free.token_ids) > stop_at
    stop_token = free.token_ids[stop_at]
    assert stop_token not in free.token_ids[:stop_at], "pick a token that first appears at stop_at"
    set_generation_eos(model_dir, [engine.tokenizer.convert_tokens_to_ids("<|eot_id|>"), stop_token])
    engine = Engine.load(model_dir, dtype="float32")
    assert stop_token in engine.eos_ids and engine.spec.eos_token_ids[0] not in engine.eos_ids
    c = engine.generate([Request("a", "", SamplingParams(max_new_tokens=10), messages=tuple(messages))])[0]
    assert c.token_ids == free.token_ids[: stop_at + 1] and c.finish_reason == "eos"
    assert c.token_ids == _hf_greedy(hf_model(model_dir), ids, 10)
    assert c.text == engine.tokenizer.decode(free.token_ids[:stop_at], skip_special_tokens=True)


def test_bad_conversations_fail_their_row_only(chat_checkpoint, tiny_llama_dir, one_thread):
    engine = Engine.load(chat_checkpoint("mistral"), dtype="float32")
    p = SamplingParams(max_new_tokens=2)
    bad = {
        "not-a-list": "hello",
        "empty": [],
        "no-content": [{"role": "user"}],
        "content-parts": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "no-role": [{"content": "hi"}],
        "roles-do-not-alternate": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    }
    reqs = [Request(k, "", p, messages=v) for k, v in bad.items()]
    reqs.insert(2, Request("good", "", p, messages=tuple(CONVERSATIONS[0])))
    out = {c.id: c for c in engine.generate(reqs)}
    assert out["good"].error is None and out["good"].completion_tokens == 2
    for k in bad:
        assert out[k].finish_reason == "error" and out[k].error, k
    assert "must alternate" in out["roles-do-not-alternate"].error
    assert "content" in out["content-parts"].error and "role" in out["no-role"].error
    plain = Engine.load(tiny_llama_dir, dtype="float32")  # a checkpoint without a chat template
    c = plain.generate([Request("x", "", p, messages=tuple(CONVERSATIONS[0]))])[0]
    assert c.finish_reason == "error" and "no chat template" in c.error
