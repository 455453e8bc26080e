"""Scoring a prompt from its prefill: the log-probability of each prompt token given the ones before it, read
from the hidden states the prefill computed anyway (the LM head runs over every position of the rows that ask,
a few positions at a time, so no [L, V] logits of a long prompt are held at once)."""

from __future__ import annotations

import torch

POSITIONS = 256  # positions per LM head call: [POSITIONS, V] float32 logits at a time


def prompt_logprobs(head, hidden: torch.Tensor, ids: list[int]) -> tuple[list[float], list[bool]]:
    """hidden [L, H] (the prefill's last-layer states at a prompt's L positions, on the head's device), `head`
    mapping [n, H] -> float32 logits [n, V] on the CPU, ids the prompt's L token ids -> for tokens 1..L-1, the
    log-probability of each given the tokens before it (log_softmax of the logits one position earlier) and
    whether it is the most likely token there."""
    targets = torch.tensor(ids[1:], dtype=torch.long)
    logprobs, greedy = [], []
    for s in range(0, len(targets), POSITIONS):
        logits = head(hidden[s : s + POSITIONS][: len(targets) - s])
        t = targets[s : s + POSITIONS]
        logprobs += logits.log_softmax(-1).gather(-1, t.view(-1, 1)).view(-1).tolist()
        greedy += is_argmax(logits, t).tolist()
    return logprobs, greedy


def is_argmax(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """logits [n, V], t [n] -> whether t is each row's argmax (the first index of its largest value, as
    `argmax` breaks ties). A max reduction without indices runs several times faster than argmax on the CPU, so
    only the rows whose target holds the largest value (the candidates) take an argmax, for the tie-break."""
    hit = logits.gather(-1, t.view(-1, 1)).view(-1) == logits.amax(-1)
    rows = hit.nonzero().view(-1)
    if len(rows):
        hit[rows] = logits[rows].argmax(-1) == t[rows]
    return hit
