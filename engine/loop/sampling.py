"""Choosing the next token: greedy, or temperature -> top-k -> top-p filtering and a draw from the row's own
seeded generator (so a request's tokens do not depend on the batch it runs in)."""

from __future__ import annotations

import torch

from engine.kernels.layer_ops import argmax_rows
from engine.request import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [V] float32 -> scaled and filtered logits [V] (removed tokens at -inf)."""
    x = logits / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=False)
        cum = sorted_x.softmax(-1).cumsum(-1)
        remove = cum <= (1 - params.top_p)
        remove[-1] = False  # always keep the most likely token
        x = x.masked_fill(torch.zeros_like(remove).scatter(0, order, remove), float("-inf"))
    return x


def next_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """logits [B, V] float32 -> chosen token ids [B]."""
    chosen = argmax_rows(logits)
    for b, p in enumerate(params):
        if not p.greedy:
            probs = filter_logits(logits[b], p).softmax(-1)
            chosen[b] = torch.multinomial(probs, 1, generator=generators[b])[0]
    return chosen


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax of the model's (unfiltered) logits at the chosen tokens: [B]."""
    return logits.log_softmax(-1).gather(-1, tokens.view(-1, 1)).view(-1)


def make_generator(params: SamplingParams) -> torch.Generator | None:
    return None if params.greedy else torch.Generator().manual_seed(params.seed)
