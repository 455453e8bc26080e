"""Tiny random-weight chat checkpoints carrying the chat template strings that Llama 3 Instruct, Qwen2 Instruct and
Mistral Instruct v0.1 publish in their tokenizer files, with each family's special tokens, BOS behaviour and
generation_config.json EOS ids. The template strings are data, reproduced as published."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.checkpoints import _TEXT, llama_config, perturb_norms

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}"
)

# style: special tokens (the first ones are bos/eos), the template, where it is stored, whether plain text gets a
# BOS, the model variant, and generation_config.json's EOS tokens
STYLES = {
    "llama3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"], bos="<|begin_of_text|>", eos="<|end_of_text|>",
                   template=LLAMA3_TEMPLATE, file="tokenizer_config.json", variant="llama_gqa_llama3",
                   gen_eos=["<|end_of_text|>", "<|eot_id|>"]),
    "qwen2": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                  template=QWEN2_TEMPLATE, file="chat_template.jinja", variant="qwen2",
                  gen_eos=["<|im_end|>", "<|endoftext|>"]),
    "mistral": dict(specials=["<unk>", "<s>", "</s>"], bos="<s>", eos="</s>", template=MISTRAL_TEMPLATE,
                    file="tokenizer_config.json", variant="mistral", gen_eos=["</s>"]),
}
CHAT_STYLES = tuple(STYLES)


def make_chat_tokenizer(out: Path, style: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    s = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=s["specials"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT + "[INST] user assistant system You are a helpful assistant. [/INST]"], trainer)
    if s["bos"]:  # like Llama 3 and Mistral, plain text is tokenized with a leading BOS
        tok.post_processor = processors.TemplateProcessing(
            single=f"{s['bos']} $A", pair=f"{s['bos']} $A {s['bos']} $B", special_tokens=[(s["bos"], tok.token_to_id(s["bos"]))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=s["bos"], eos_token=s["eos"], pad_token=s["eos"])
    fast.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    if s["file"] == "chat_template.jinja":
        (out / "chat_template.jinja").write_text(s["template"])
    else:
        path = out / "tokenizer_config.json"
        cfg = json.loads(path.read_text())
        cfg["chat_template"] = s["template"]
        path.write_text(json.dumps(cfg, indent=2))
    return fast


def make_chat_checkpoint(out: Path, style: str, seed: int = 0) -> Path:
    """A random-weight checkpoint of `style` ("llama3", "qwen2", "mistral") with its chat template."""
    from jobs.bench.models import save_random_model

    s = STYLES[style]
    out.mkdir(parents=True, exist_ok=True)
    tok = make_chat_tokenizer(out, style)
    cfg = llama_config(len(tok), s["variant"])
    cfg.bos_token_id = tok.bos_token_id
    cfg.eos_token_id = tok.eos_token_id
    save_random_model(out, cfg, torch.float32, seed, adjust=lambda model: perturb_norms(model, seed))
    set_generation_eos(out, [tok.convert_tokens_to_ids(t) for t in s["gen_eos"]])
    return out


def set_generation_eos(model_dir: Path, eos_ids: list[int]) -> None:
    """Write `eos_ids` as generation_config.json's eos_token_id (the ids `generate` stops on)."""
    path = model_dir / "generation_config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg["eos_token_id"] = eos_ids
    path.write_text(json.dumps(cfg, indent=2))
