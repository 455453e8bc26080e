"""FlexGen's zig-zag block schedule: for each generation step, for each layer, for each GPU batch. A layer's
weights are loaded once per step and reused by every GPU batch of the block; the next layer loads in the
background while the current one computes. The loop is written once: the policy decides, through the weight
store, the activation and KV placement, and the per-phase compute device, what each load and store does."""

from __future__ import annotations

import time

import torch

from engine.kernels.attention import decode_mask, prefill_mask
from engine.loop.refill import Refill, choose_refill
from engine.loop.row_state import RowState
from engine.loop.sampling import chosen_logprobs, next_tokens
from engine.memory.disk_kv import DirectKVCache
from engine.memory.kv_cache import KVCache
from engine.memory.placement import PlacedActivations, PlacedKV, alloc, row_segments
from engine.models import StepContext
from engine.policy import Policy

ACT_DTYPE = torch.float32  # the residual stream between layers (see engine/models/llama.py)


COMPACT_SLOTS = 64  # with refill, shift the cache once at least this many (and T/4) leading slots are dead
DROP_SHARE = 0.125  # finished rows leave a GPU batch once they are this share of it (and no row waits)


class GpuBatch:
    """One GPU batch of a block: its rows (left-padded to the block's prompt length S), KV cache and
    activations, the last cache slot written (-1 before prefill) and each row's next position."""

    def __init__(self, rows: list[RowState], S: int, T: int, pad: int):
        self.rows, self.S, self.T = rows, S, T
        B = len(rows)
        self.ids = torch.full((B, S), pad, dtype=torch.long)
        self.valid = torch.zeros((B, T), dtype=torch.bool)
        for b, r in enumerate(rows):
            L = len(r.prompt_ids)
            self.ids[b, S - L :] = torch.tensor(r.prompt_ids)
            self.valid[b, S - L : S] = True
        self.next_pos = self.valid[:, :S].sum(-1, keepdim=True)  # after prefill: each row's prompt length
        self.slot = -1
        self.last: torch.Tensor | None = None  # tokens chosen at the previous step [B]
        self.refill: Refill | None = None  # rows entering this step
        self.shifts = 0

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rows)

    def context(self, window: int | None, cache) -> tuple[torch.Tensor, StepContext]:
        """Input ids and context of the next step (prefill while no slot is written)."""
        if self.slot < 0:
            positions = (self.valid[:, : self.S].cumsum(-1) - 1).clamp(min=0)
            return self.ids, StepContext(positions, prefill_mask(self.valid[:, : self.S], window), 0, cache)
        slot = self.slot + 1
        self.valid[:, slot] = True
        mask = decode_mask(self.valid, slot + 1, window)
        return self.last.view(-1, 1), StepContext(self.next_pos, mask, slot, cache)

    def take_refill(self, waiting: list[RowState]) -> None:
        """Give finished rows' slots to waiting rows that fit (shifting the cache when that makes room). Also
        drop the slots before the oldest live row's first once they are many: refilled rows keep the cursor
        from ever returning to the start, and decode attention walks every slot from 0."""
        if self.slot < 0:
            return
        live = [b for b, r in enumerate(self.rows) if not r.done]
        next_slot = self.slot + 1
        oldest = min((int(self.valid[b].nonzero()[0]) for b in live), default=next_slot)
        longest = max((len(r.prompt_ids) for r in waiting[:1]), default=1)  # waiting rows: longest first
        dead = min(oldest, next_slot + 1 - longest)  # leave room before the cursor for the next prompt
        if live and dead >= max(COMPACT_SLOTS, self.T // 4):  # decode attention reads every slot from 0
            self.shift(dead)
            next_slot, oldest = self.slot + 1, oldest - dead
        free = [b for b, r in enumerate(self.rows) if r.done]
        if not free or not waiting:
            return
        rows, shift = choose_refill(free, waiting, next_slot, oldest, self.T)
        if not rows:
            return
        if shift:
            self.shift(shift)
        end = self.slot + 1
        self.refill = Refill(free[: len(rows)], rows, end)
        for b, r in zip(self.refill.slots, rows):
            self.rows[b] = r
            self.valid[b] = False
            self.valid[b, end - len(r.prompt_ids) + 1 : end + 1] = True

    def drop_finished(self) -> None:
        """Finished rows leave the batch (their KV rows and activations too), so that no step computes them
        again; only once no waiting row can take their slots. Dropped once at least DROP_SHARE of the rows
        have finished: each drop copies the live rows' cache."""
        live = [b for b, r in enumerate(self.rows) if not r.done]
        if self.slot < 0 or not live or len(self.rows) - len(live) < max(1, DROP_SHARE * len(self.rows)):
            return
        self.kv.keep_rows(live)
        self.acts.keep_rows(live)
        self.rows = [self.rows[b] for b in live]
        self.valid, self.next_pos, self.last = self.valid[live], self.next_pos[live], self.last[live]

    def shift(self, first: int) -> None:
        """Drop cache slots [0, first): every later slot moves `first` places left."""
        count = self.slot + 1 - first
        self.kv.shift_slots(first, count)
        self.valid[:, :count] = self.valid[:, first : self.slot + 1].clone()
        self.valid[:, count:] = False
        self.slot -= first
        self.shifts += 1

    def choose(self, logits: torch.Tensor, tokenizer) -> None:
        rows = self.rows
        tokens = next_tokens(logits, [r.req.params for r in rows], [r.generator for r in rows])
        for b, r in enumerate(rows):
            forced = r.req.forced_ids
            if forced is not None and len(r.tokens) < len(forced):
                tokens[b] = forced[len(r.tokens)]
        want = any(r.req.params.logprobs for r in rows)
        lps = chosen_logprobs(logits, tokens).tolist() if want else [None] * len(rows)
        for r, t, lp in zip(rows, tokens.tolist(), lps):
            r.push(t, lp, tokenizer)
        self.last = tokens
        if self.slot < 0:
            self.slot = self.S - 1
        else:
            self.slot += 1
            self.next_pos = self.next_pos + 1
        if self.refill is not None:
            for b, n in zip(self.refill.slots, self.refill.lengths):
                self.next_pos[b] = n
            self.refill = None


class BlockExecutor:
    """Runs blocks of rows (up to gbs * num_gb) through the zig-zag loop under one `Policy`."""

    def __init__(self, spec, model, global_weights, weights, devices, policy: Policy, dtype, tokenizer, pad: int,
                 kv_codec=None, kernels=None, globals_on: str = "cpu"):
        self.spec, self.model, self.gw, self.weights = spec, model, global_weights, weights
        self.devices, self.policy, self.dtype, self.tokenizer, self.pad = devices, policy, dtype, tokenizer, pad
        self.globals_on = globals_on  # where the embeddings and the LM head live and compute
        self.kv_codec = kv_codec  # makes compressed caches; None keeps K/V in the compute dtype
        self.prefill_attention = kernels.prefill_attention if kernels is not None else None
        self.seconds = {"prefill": 0.0, "decode": 0.0}  # wall time of each phase's steps, over every block run
        # layer passes, rows computed over them, and refill work, likewise
        self.counts = {"steps": 0, "row_steps": 0, "refilled_rows": 0, "shifts": 0}
        self._held: list[tuple[str, int]] = []

    def device(self, phase: str, layer: int) -> str:
        return "gpu" if self.policy.layer_on_gpu(phase, layer) else "cpu"

    def run(self, rows: list[RowState], waiting: list[RowState] | None = None) -> None:
        """Complete `rows` (one block); with `waiting`, finished rows' slots take rows from it (refill), which
        are popped as they enter."""
        p, refill = self.policy, waiting is not None
        S = max(len(r.prompt_ids) for r in rows)
        T = self.total_slots(rows + (waiting or []))
        batches = [GpuBatch(rows[i : i + p.gbs], S, T, self.pad) for i in range(0, len(rows), p.gbs)]
        try:
            for b in batches:
                b.kv = self._make_kv(len(b.rows), T)
                acts = {"gpu": p.act_gpu, "cpu": p.act_cpu, "disk": p.act_disk}
                b.acts = PlacedActivations.create(self.devices, acts, (len(b.rows), S, self.spec.hidden_size),
                                                  ACT_DTYPE)
            while True:
                for b in batches if refill else ():
                    self._refill(b, waiting)
                for b in batches if not waiting else ():
                    b.drop_finished()
                live = [b for b in batches if not b.done]
                if not live:
                    break
                phase = "prefill" if live[0].slot < 0 else "decode"
                t0 = time.perf_counter()
                self._step(live, phase)
                self.counts["steps"] += 1
                self.counts["row_steps"] += sum(len(b.rows) for b in live)
                self.seconds[phase] += time.perf_counter() - t0
        finally:
            for tier, nbytes in self._held:
                self.devices.tiers[tier].release(nbytes)
            self._held.clear()

    def _refill(self, b: GpuBatch, waiting: list[RowState]) -> None:
        shifts = b.shifts
        b.take_refill(waiting)
        self.counts["refilled_rows"] += len(b.refill.rows) if b.refill else 0
        self.counts["shifts"] += b.shifts - shifts

    @staticmethod
    def total_slots(rows: list[RowState]) -> int:
        """Cache slots of a block: its longest prompt plus its largest max_new_tokens (refilled rows fit too)."""
        return max(len(r.prompt_ids) for r in rows) + max(r.req.params.max_new_tokens for r in rows)

    def _alloc(self, tier: str):
        def make(shape, dtype):
            t = alloc(self.devices, tier, shape, dtype, "KV cache")
            self._held.append((tier, t.numel() * t.element_size()))
            return t

        return make

    def _make_kv(self, B: int, T: int) -> PlacedKV:
        spec, p = self.spec, self.policy
        fractions = {"gpu": p.cache_gpu, "cpu": p.cache_cpu, "disk": p.cache_disk}
        segments = []
        for tier, rows in row_segments(B, fractions):
            n = rows.stop - rows.start
            shape = (spec.num_layers, n, spec.num_kv_heads, T, spec.head_dim, self.dtype)
            if tier == "disk" and not self.kv_codec:  # read and written with direct I/O (engine/memory/disk_kv.py)
                cache = DirectKVCache(*shape, offload_dir=self.devices.offload_dir)
                self.devices.tiers["disk"].reserve(cache.nbytes(), "KV cache")
                self._held.append(("disk", cache.nbytes()))
            else:
                make = self.kv_codec.cache if self.kv_codec else KVCache
                cache = make(*shape, alloc=self._alloc(tier))
            segments.append((tier, rows, cache))
        return PlacedKV(self.devices, segments, p.cpu_attention, self.prefill_attention)

    def _step(self, live: list[GpuBatch], phase: str) -> None:
        """One generation step of every live GPU batch, layer by layer; rows refilled in a batch prefill in the
        same layer pass, after the batch's decode (with the weights loaded once for both). The embeddings and
        the LM head run where they live (`globals_on`)."""
        window, ctxs, refills, g = self.spec.sliding_window, [], {}, self.globals_on
        for b in live:
            ids, ctx = b.context(window, b.kv)
            self.model.begin_step(ctx)
            b.acts.carry = len(live) == 1  # one GPU batch: its hidden states go straight to the next layer
            b.acts.store(self._embed(ids, ctx), g)
            ctxs.append(ctx)
            if b.refill is not None:
                ids, rctx = b.refill.inputs(self.pad, window, b.kv, self.prefill_attention)
                self.model.begin_step(rctx)
                refills[id(b)] = [rctx, self._embed(ids, rctx), g]
        L = self.spec.num_layers
        for j in range(L):
            dev = self.device(phase, j)
            w = self.weights.get(j, dev)
            if j + 1 < L:
                self.weights.prefetch(j + 1, self.device(phase, j + 1))
            else:
                self.weights.prefetch(0, self.device("decode", 0))
            for b, ctx in zip(live, ctxs):
                b.kv.compute, b.kv.decode = dev, phase == "decode"
                b.acts.store(self.model.layer(w, b.acts.load(dev), self._on(ctx, dev), j), dev)
                if id(b) in refills:
                    rctx, h, where = refills[id(b)]
                    h = self.model.layer(w, self.devices.move(h, where, dev), self._on(rctx, dev), j)
                    refills[id(b)] = [rctx, h, dev]
            del w
        for b in live:
            logits = self._head(b.acts.load(g, last=True))
            if id(b) in refills:
                _, h, where = refills[id(b)]
                logits[b.refill.slots] = self._head(self.devices.move(h[:, -1], where, g))
            b.choose(logits, self.tokenizer)

    def _embed(self, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Token ids [B, S] (on the CPU) -> hidden states [B, S, H] on the embeddings' device."""
        g = self.globals_on
        return self.model.embed(self.gw, self.devices.move(ids, "cpu", g), self._on(ctx, g))

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """Last positions [B, H] on the head's device -> float32 logits [B, V] on the CPU, where tokens are
        chosen."""
        return self.devices.move(self.model.head(self.gw, h), self.globals_on, "cpu")

    def _on(self, ctx: StepContext, dev: str) -> StepContext:
        """The step context with its tensors on compute device `dev` (a no-op unless that is CUDA)."""
        target = self.devices.torch_device(dev)
        if ctx.positions.device == target:
            return ctx
        moved = getattr(ctx, "_moved", None)
        if moved is None:
            rope = tuple(t.to(target) for t in ctx.rope) if ctx.rope is not None else None
            moved = StepContext(ctx.positions.to(target), ctx.mask.to(target), ctx.start, ctx.cache, rope)
            ctx._moved = moved
        return moved

    def block_bytes(self, rows: int, S: int, T: int) -> dict[str, int]:
        """Bytes a block of `rows` rows (prompt length S, total length T) needs per tier for its KV cache and
        activations, plus the CPU staging of two layers read from disk (the one computing, the one prefetched)."""
        spec, p = self.spec, self.policy
        elem = torch.empty((), dtype=self.dtype).element_size()
        need = dict.fromkeys(("gpu", "cpu", "disk"), 0)
        for start in range(0, rows, p.gbs):
            B = min(p.gbs, rows - start)
            kv = {"gpu": p.cache_gpu, "cpu": p.cache_cpu, "disk": p.cache_disk}
            for tier, r in row_segments(B, kv):
                per_slot = self.kv_codec.bytes_per_head_slot(spec.head_dim) if self.kv_codec else spec.head_dim * elem
                need[tier] += int(2 * spec.num_layers * spec.num_kv_heads * T * per_slot) * (r.stop - r.start)
            acts = {"gpu": p.act_gpu, "cpu": p.act_cpu, "disk": p.act_disk}
            for tier, r in row_segments(B, acts):
                need[tier] += (r.stop - r.start) * S * spec.hidden_size * ACT_DTYPE.itemsize
        if "disk" in self.weights.placement:
            need["cpu"] += 2 * max(self.weights.layer_bytes)
        return need
