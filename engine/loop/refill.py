"""Refill: when rows of a GPU batch finish, their slots take the next waiting rows of the shard.

A GPU batch shares one cache cursor: every live row writes the same slot at each decode step. A refilled row's
prompt is placed so that it ends at the slot the ongoing rows write at that step; its prefill runs in the same
layer pass as their decode (each layer's weights are loaded once for both), after the decode, so that its K/V
overwrite what the freed slot's decode wrote there. Its positions start at 0 (after the block's shared prefix,
where it has one) and its mask covers only its own slots, so it computes what it would have computed alone.
When the cursor runs out of slots, the cache is shifted left past the slots no live row can see any more."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.kernels.attention import ScoreRule, attend, prefill_mask
from engine.kernels.shared_attention import shared_prefix_attention
from engine.loop.row_state import RowState
from engine.models import StepContext

SCAN = 4  # waiting rows examined per free slot when the next ones do not fit the batch's remaining slots


class RefillKV:
    """The cache a refill prefill sees: its new K/V go into the batch's rows `rows` at slot `start`; attention
    runs over the new K/V (a prefill's keys are all its own), as for a batch's first prefill, and over the
    block's shared prefix where it has one."""

    def __init__(self, kv, rows: list[int], attention=None):
        self.kv, self.rows, self.attention = kv, rows, attention or attend

    def attend(self, layer: int, q, k_new, v_new, start: int, mask, scale: float | None = None, *, device: str,
               phase: str, rule: ScoreRule | None = None):
        assert phase == "prefill", phase  # a refill's pass is its rows' prefill, whatever the batch's phase
        self.kv.store_rows(layer, k_new, v_new, start, self.rows, device)
        if self.kv.prefix is not None:
            return shared_prefix_attention(q, k_new, v_new, mask, self.kv.prefix.kv(layer, device), scale,
                                           rule=rule)
        if rule is not None:  # the backend's prefill kernel knows no score rule
            return attend(q, k_new, v_new, mask, scale, rule)
        return self.attention(q, k_new, v_new, mask, scale)


@dataclass
class Refill:
    """Rows entering GPU batch slots `slots` at one step; their own tokens (after the block's shared prefix),
    left-padded to a common length, end at cache slot `end`. During that step their prefill's hidden states [R, L, H] are `hidden`, on compute device
    `where`, and `contexts` holds their prefill context on each compute device the step uses (both set when
    the step begins, by `begin`)."""

    slots: list[int]
    rows: list[RowState]
    end: int
    shared: int = 0  # the block's shared prefix tokens: the rows' positions start after them
    hidden: torch.Tensor | None = None
    where: str = "cpu"
    contexts: dict[str, StepContext] = field(default_factory=dict)

    def begin(self, hidden: torch.Tensor, where: str, contexts: dict[str, StepContext]) -> None:
        """The step starts: the rows' embeddings [R, L, H] on `where`, their context on each compute device."""
        self.hidden, self.where, self.contexts = hidden, where, contexts

    def layer(self, model, w, i: int, dev: str, devices) -> None:
        """Layer `i` (weights `w`) of the rows' prefill on compute device `dev`."""
        h = devices.move(self.hidden, self.where, dev)
        self.hidden, self.where = model.layer(w, h, self.contexts[dev], i), dev

    @property
    def lengths(self) -> list[int]:
        return [len(r.own_ids) for r in self.rows]

    def inputs(self, pad: int, kv, attention) -> tuple[torch.Tensor, StepContext]:
        """Input ids [R, L] and the prefill context of the refill rows."""
        L = max(self.lengths)
        ids = torch.full((len(self.rows), L), pad, dtype=torch.long)
        valid = torch.zeros((len(self.rows), L), dtype=torch.bool)
        for i, r in enumerate(self.rows):
            n = len(r.own_ids)
            ids[i, L - n :] = torch.tensor(r.own_ids)
            valid[i, L - n :] = True
        positions = (valid.cumsum(-1) - 1).clamp(min=0) + self.shared
        ctx = StepContext(positions, prefill_mask(valid), self.end - L + 1, RefillKV(kv, self.slots, attention),
                          phase="prefill")
        return ids, ctx


def fits(row: RowState, next_slot: int, shift: tuple[int, int], total: int) -> tuple[int, int] | None:
    """The shifts (lo, hi) that keep both the row and the batch's live rows in `total` slots, given the
    shifts already allowed: the prompt must end at next_slot - m (so it needs next_slot - m + 1 >= its length)
    and its last fed token must land before `total` (next_slot - m + max_new_tokens <= total)."""
    lo = max(shift[0], next_slot + row.req.params.max_new_tokens - total)
    hi = min(shift[1], next_slot + 1 - len(row.own_ids))
    return (lo, hi) if lo <= hi else None


def choose_refill(free: list[int], waiting: list[RowState], next_slot: int, oldest_live: int,
                  total: int) -> tuple[list[RowState], int]:
    """Take up to len(free) rows from `waiting` (in order, looking SCAN rows ahead per slot past rows that do not
    fit) and the cache shift they need (0: none). `oldest_live` is the first slot a live row still reads."""
    chosen, shift, i = [], (0, oldest_live), 0
    while i < len(waiting) and len(chosen) < len(free) and i < SCAN * len(free):
        allowed = fits(waiting[i], next_slot, shift, total)
        if allowed is None:
            i += 1
            continue
        shift = allowed
        chosen.append(waiting.pop(i))
    if not chosen:
        return [], 0
    return chosen, (shift[1] if shift[0] > 0 else 0)  # when shifting at all, reclaim as much as allowed
