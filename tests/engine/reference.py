"""Reference outputs from transformers' own `generate`, one prompt at a time (no padding)."""

from __future__ import annotations

import torch

PROMPTS = [
    "The quick brown fox",
    "Q: What is 12 plus 30? A:",
    "def add(a, b):\n    return",
    "Pack my box with five dozen liquor jugs. Product A: red kettle 2L. Product B:",
    "x",
]


def hf_model(model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model.eval()


def hf_greedy(model, tokenizer, prompt: str, max_new_tokens: int, eos_ids) -> list[int]:
    """Greedy continuation of `prompt`, cut after the first EOS like the engine does."""
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=0, pad_token_id=eos_ids[0],
                             eos_token_id=list(eos_ids))
    tokens = out[0, ids.shape[1]:].tolist()
    for n, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: n + 1]
    return tokens


def hf_logits(model, tokenizer, prompt: str, continuation: list[int]) -> torch.Tensor:
    """Float32 logits [len(continuation), V] that predicted each continuation token."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    ids = torch.tensor([prompt_ids + continuation])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    start = len(prompt_ids) - 1
    return logits[start : start + len(continuation)]
