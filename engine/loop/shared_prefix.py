"""A prefix every row of a block shares (a few-shot prompt's instructions and examples, a chat's system prompt):
the rows' longest common run of leading token ids, prefilled once as a one-row batch inside the block's first
layer pass (each layer's weights still load once), its K/V kept once per layer. Each row's cache then holds only
its own tokens, at positions after the prefix, and attends over the prefix through
engine/kernels/shared_attention.py. Rows that score their prompt get the prefix's log-probabilities,
computed once."""

from __future__ import annotations

import torch

from engine.kernels.attention import ScoreRule, attend, prefill_mask
from engine.loop.prompt_logprobs import prompt_logprobs
from engine.models import StepContext

MIN_SHARED = 32  # fewer shared tokens are prefilled with each row: one more pass of a short row saves little


def shared_length(prompts: list[list[int]]) -> int:
    """Leading token ids every prompt shares, leaving each at least one token of its own (its first logits come
    from its own last position); 0 when that is fewer than MIN_SHARED, or for a single prompt (nothing to share
    with)."""
    if len(prompts) < 2:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        if n < MIN_SHARED:
            return 0
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n if n >= MIN_SHARED else 0


class SharedPrefix:
    """The shared prefix of a block: its ids, and per layer its K and V [1, KVH, P, D] on tier `home`. During the
    block's first layer pass it is also the cache of its own prefill (`attend`) and holds its hidden states."""

    def __init__(self, ids: list[int], k: list[torch.Tensor], v: list[torch.Tensor], home: str, devices,
                 logprobs_needed: str | None = None):
        self.ids, self.k, self.v, self.home, self.devices = ids, k, v, home, devices
        # what rows that score their prompt need of it, computed once at its pass' end: "all" its tokens'
        # log-probabilities and those of each row's first own token, "first" only the latter (rows scoring their
        # last own tokens), or None
        self.logprobs_needed = logprobs_needed
        self.computed = False  # its K/V are in place (its layer pass has run)
        self.hidden: torch.Tensor | None = None  # [1, P, H] during the first layer pass, on `where`
        self.where = home
        self.contexts: dict[str, StepContext] = {}
        self.logprobs: tuple[list[float], list[bool], torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def inputs(self) -> tuple[torch.Tensor, StepContext]:
        """Input ids [1, P] and the prefill context of the prefix (positions from 0, causal)."""
        P = len(self.ids)
        positions = torch.arange(P).view(1, P)
        mask = prefill_mask(torch.ones(1, P, dtype=torch.bool))
        return torch.tensor([self.ids]), StepContext(positions, mask, 0, self, phase="prefill")

    def begin(self, hidden: torch.Tensor, where: str, contexts: dict[str, StepContext]) -> None:
        self.hidden, self.where, self.contexts = hidden, where, contexts

    def layer(self, model, w, i: int, dev: str) -> None:
        """Layer `i` (weights `w`) of the prefix's prefill on compute device `dev`."""
        h = self.devices.move(self.hidden, self.where, dev)
        self.hidden, self.where = model.layer(w, h, self.contexts[dev], i), dev

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale: float | None = None, *, device: str,
               phase: str, rule: ScoreRule | None = None):
        """The prefix's own prefill: keep its K/V [1, KVH, P, D] on its tier and attend over them as computed."""
        self.devices.copy_into(self.k[layer], k_new, device, self.home)
        self.devices.copy_into(self.v[layer], v_new, device, self.home)
        return attend(q, k_new, v_new, mask, scale, rule)

    def kv(self, layer: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's K, V of `layer` on compute device `device`."""
        move = self.devices.move
        return move(self.k[layer], self.home, device), move(self.v[layer], self.home, device)

    def finish_pass(self, head, to_head) -> None:
        """The layer pass is over: with `logprobs_needed`, score the prefix from its last-layer hidden states (moved to the
        head's device by `to_head(h, where)`): its tokens 1..P-1 ("all" only), and the log-probabilities at its last
        position, which score each row's first own token. Its hidden states and contexts are dropped."""
        if self.logprobs_needed:
            h = to_head(self.hidden, self.where)[0]
            lp, greedy = prompt_logprobs(head, h, self.ids) if self.logprobs_needed == "all" else ([], [])
            self.logprobs = lp, greedy, head(h[-1:])[0].log_softmax(-1)
        self.hidden, self.contexts, self.computed = None, {}, True

    def logprobs_for(self, first_own: int) -> tuple[list[float], list[bool]]:
        """A row's prompt log-probabilities over the prefix ("all") and its own first token."""
        lp, greedy, last = self.logprobs
        return lp + [float(last[first_own])], greedy + [bool(last.argmax() == first_own)]
