"""Chat prompts: token ids equal transformers' `apply_chat_template`, greedy completions equal its `generate` on
the rendered prompt, EOS ids from generation_config.json (each family's end-of-turn token among them), a system
message handled as each template does, and bad conversations as row errors."""

import pytest
import torch

from engine.engine import Engine
from engine.request import Request, SamplingParams
from tests.chat_checkpoints import CHAT_STYLES, END_OF_TURN, STYLES, set_generation_eos
from tests.engine.reference import hf_model

CONVERSATIONS = [
    [{"role": "user", "content": "What is 12 plus 30?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Product A: red kettle 2L. Product B: kettle red 2 l. Same?"}],
    [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "return a + b"},
     {"role": "user", "content": "  The quick brown fox  "}],
]


def _turns(style: str) -> list[list[dict]]:
    """The conversations `style`'s template renders: Mistral's and Gemma 2's raise on a system message."""
    return [c for c in CONVERSATIONS if STYLES[style]["system"] != "refused" or c[0]["role"] != "system"]


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


@pytest.mark.parametrize("style", CHAT_STYLES)
def test_a_system_message_is_rendered_folded_or_refused_as_the_template_does(chat_checkpoint, style, one_thread):
    """Each template's own way with a system message: a turn of its own, folded into the first user turn (Gemma 3),
    or refused (Mistral, Gemma 2): then that row fails in one line carrying the template's message, and the
    rows beside it complete."""
    from transformers import AutoTokenizer

    model_dir = chat_checkpoint(style)
    engine = Engine.load(model_dir, dtype="float32")
    ref = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    system, plain = CONVERSATIONS[1], CONVERSATIONS[0]
    p = SamplingParams(max_new_tokens=2)
    out = engine.generate([Request("plain", "", p, messages=tuple(plain)), Request("system", "", p, messages=tuple(system)),
                           Request("after", "", p, messages=tuple(plain))])
    assert out[0].error is None and out[2].error is None and out[2].completion_tokens == 2
    if STYLES[style]["system"] == "refused":
        with pytest.raises(Exception) as refusal:
            _hf_ids(ref, system)
        assert out[1].finish_reason == "error" and "\n" not in out[1].error
        assert out[1].error == f"the chat template rejected these messages: {refusal.value}"
        return
    ids = engine._prompt_ids(Request("system", "", p, messages=tuple(system)))
    assert out[1].error is None and ids == _hf_ids(ref, system)
    text = ref.decode(ids)
    assert system[0]["content"] in text
    if STYLES[style]["system"] == "folded":  # Gemma 3: no system turn, the first user turn opens with it
        assert text.startswith(f"<bos><start_of_turn>user\n{system[0]['content']}\n\n{system[1]['content']}")
        assert "system" not in text


def _tied(model_dir) -> bool:
    import json

    return json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False)


def _edit_weights(model_dir, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    weights = load_file(path)
    edit(weights)
    save_file(weights, path, metadata={"format": "pt"})


@pytest.mark.parametrize("style", CHAT_STYLES)
def test_generation_stops_at_the_family_end_of_turn_token(chat_checkpoint, style, one_thread, tmp_path):
    """The end-of-turn token the template closes turns with is one of the EOS ids read from generation_config.json,
    and a row stops on it as transformers' `generate` does. The random model is made to emit it: with an output
    head of its own, the head rows of that token and of a token first emitted at step 3 swap (so the answer is cut
    right there); with a head tied to the embeddings, the token's row grows until it is the first token emitted."""
    import shutil

    model_dir = shutil.copytree(chat_checkpoint(style), tmp_path / style)
    engine = Engine.load(model_dir, dtype="float32")
    eot = engine.tokenizer.convert_tokens_to_ids(END_OF_TURN[style])
    assert eot in engine.eos_ids and eot != engine.tokenizer.unk_token_id
    messages = tuple(CONVERSATIONS[0])
    ids = _hf_ids(engine.tokenizer, list(messages))
    stop_at = 3
    if not _tied(model_dir):
        free = engine.generate([Request("a", "", SamplingParams(max_new_tokens=8), messages=messages)])[0]
        stop_token = free.token_ids[stop_at]
        assert stop_token not in free.token_ids[:stop_at] and eot not in free.token_ids

        def swap(w):
            w["lm_head.weight"][[eot, stop_token]] = w["lm_head.weight"][[stop_token, eot]].clone()

        _edit_weights(model_dir, swap)
        expected = free.token_ids[:stop_at] + [eot]
    else:
        for scale in (4.0, -4.0, 16.0, -16.0, 64.0, -64.0):
            def grow(w, scale=scale):
                w["model.embed_tokens.weight"][eot] *= scale

            trial = shutil.copytree(chat_checkpoint(style), tmp_path / f"{style}-{scale:g}")
            _edit_weights(trial, grow)
            if _hf_greedy(hf_model(trial), ids, 1) == [eot]:
                model_dir = trial
                break
        else:
            pytest.fail(f"no scale of {END_OF_TURN[style]}'s row made it the first token")
        expected = [eot]
    engine = Engine.load(model_dir, dtype="float32")
    c = engine.generate([Request("a", "", SamplingParams(max_new_tokens=8), messages=messages)])[0]
    assert c.token_ids == expected and c.finish_reason == "eos"
    assert c.token_ids == _hf_greedy(hf_model(model_dir), ids, 8)


def test_qwen3_reasoning_renders_as_transformers_does_with_thinking_left_on(chat_checkpoint, one_thread):
    """Qwen3's template drops the <think> block of an assistant turn before the last user message, keeps it after,
    and reads `enable_thinking`: the engine passes none, so (as transformers does by default) the prompt ends at
    the assistant header and the model opens its own <think> block; `enable_thinking=False` would close an empty
    one there instead."""
    from transformers import AutoTokenizer

    model_dir = chat_checkpoint("qwen3")
    engine = Engine.load(model_dir, dtype="float32")
    ref = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    answer = {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n42"}
    earlier = [{"role": "user", "content": "What is 12 plus 30?"}, answer, {"role": "user", "content": "Same?"}]
    last = earlier[:2]
    think = ref.convert_tokens_to_ids(["<think>", "</think>"])
    for messages, kept in ((earlier, False), (last, True)):
        ids = engine._prompt_ids(Request("q", "", SamplingParams(), messages=tuple(messages)))
        assert ids == _hf_ids(ref, messages)
        assert ids == list(ref.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True,
                                                   tokenize=True, return_dict=False))
        text = ref.decode(ids)
        assert ("add them" in text) == kept and all((t in ids) == kept for t in think)
        assert "<|im_start|>assistant\n42<|im_end|>" in text or kept
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        off = list(ref.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False,
                                           tokenize=True, return_dict=False))
        assert off[: len(ids)] == ids and ref.decode(off[len(ids):]) == "<think>\n\n</think>\n\n"
    out = engine.generate([Request("q", "", SamplingParams(max_new_tokens=4), messages=tuple(last))])[0]
    assert out.error is None and out.prompt_tokens == len(_hf_ids(ref, last))
