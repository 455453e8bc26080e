"""The tokenizer loaded directly (without AutoTokenizer's config build) is the tokenizer AutoTokenizer gives."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from engine.tokenizer import DIRECT_CLASS, load_tokenizer, loads_directly
from tests.chat_checkpoints import CHAT_STYLES

TEXTS = ["The quick brown fox", " Q: What is 12 plus 30? A:", "def add(a, b):\n    return a + b\n", "", "Ünïcode ✓"]
CHAT = [{"role": "user", "content": "What is 12 plus 30?"}, {"role": "assistant", "content": "42"},
        {"role": "user", "content": "Same?"}]


def _same(a, b, chat: bool) -> None:
    assert type(a) is type(b)
    for text in TEXTS:
        assert a(text)["input_ids"] == b(text)["input_ids"]
        assert a(text, add_special_tokens=False)["input_ids"] == b(text, add_special_tokens=False)["input_ids"]
        ids = b(text)["input_ids"]
        assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
        assert a.decode(ids) == b.decode(ids)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "chat_template"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.all_special_ids == b.all_special_ids and len(a) == len(b)
    if chat:
        kw = dict(add_generation_prompt=True, tokenize=True, return_dict=False)
        assert a.apply_chat_template(CHAT[:1], **kw) == b.apply_chat_template(CHAT[:1], **kw)


@pytest.mark.parametrize("variant", ["opt", "llama_tied", "mistral", "qwen2"])
def test_a_checkpoint_tokenizer_is_the_one_autotokenizer_loads(checkpoint, variant):
    model = checkpoint(variant)
    assert loads_directly(model) == (variant != "qwen2")  # transformers maps qwen2 to its own class
    _same(load_tokenizer(model), AutoTokenizer.from_pretrained(str(model), local_files_only=True), chat=False)


@pytest.mark.parametrize("style", CHAT_STYLES)
def test_a_chat_tokenizer_renders_as_autotokenizer_does(chat_checkpoint, style):
    model = chat_checkpoint(style)
    _same(load_tokenizer(model), AutoTokenizer.from_pretrained(str(model), local_files_only=True), chat=True)


def test_the_demo_tokenizer_loads_directly_and_matches(demo_model_dir):
    assert loads_directly(demo_model_dir)
    _same(load_tokenizer(demo_model_dir), AutoTokenizer.from_pretrained(str(demo_model_dir)), chat=False)


def test_one_load_per_folder_until_its_files_change(checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(checkpoint("llama_tied"), model)
    first = load_tokenizer(model)
    assert load_tokenizer(model) is first and load_tokenizer(str(model) + "/") is first
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["tokenizer_class"] == DIRECT_CLASS
    cfg["model_max_length"] = 77
    cfg_path.write_text(json.dumps(cfg))
    again = load_tokenizer(model)
    assert again is not first and again.model_max_length == 77


def test_a_folder_with_an_auto_map_is_left_to_autotokenizer(checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(checkpoint("llama_tied"), model)
    cfg_path = model / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "auto_map": {"AutoConfig": "x.Y"}}))
    assert not loads_directly(model)
