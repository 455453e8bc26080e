"""FlexGen's zig-zag block schedule: for each generation step, for each layer, for each GPU batch. A layer's
weights are loaded once per step and reused by every GPU batch of the block; the next layer loads in the
background while the current one computes. The loop is written once: the policy decides, through the weight
store, the activation and KV placement, and the per-phase compute device, what each load and store does."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from engine import trace
from engine.kernels.attention import decode_mask, prefill_mask
from engine.loop.grammar import advance, mask_logits
from engine.loop.loaded import LoadedModel
from engine.loop.prompt_logprobs import prompt_logprobs
from engine.loop.refill import Refill, choose_refill
from engine.loop.row_state import RowState
from engine.loop.sampling import chosen_logprobs, next_tokens
from engine.loop.shared_prefix import SharedPrefix, shared_length
from engine.memory.disk_kv import DirectKVCache
from engine.memory.footprint import (
    ACT_DTYPE,
    act_row_bytes,
    disk_kv_buffer_bytes,
    disk_staged_bytes,
    kv_row_bytes,
    prefix_bytes,
    prefix_tier,
    streamed_dense_bytes,
)
from engine.memory.kv_cache import KVCache
from engine.memory.placement import PlacedActivations, PlacedKV, alloc, row_segments
from engine.models import StepContext
from engine.policy import Policy

COMPACT_SLOTS = 64  # with refill, shift the cache once at least this many (and T/4) leading slots are dead
DROP_SHARE = 0.125  # finished rows leave a GPU batch once they are this share of it (and no row waits)


class GpuBatch:
    """One GPU batch of a block: its rows (their own tokens, after the block's `shared` prefix tokens, left-padded
    to length S), its KV cache (T slots) and activations (made for it by the executor, by the policy's
    placement), the last cache slot written (-1 before prefill), each row's next position, the tokens chosen at
    the previous step and the rows that enter at the next step (refill)."""

    def __init__(self, rows: list[RowState], S: int, T: int, pad: int, kv: PlacedKV, acts: PlacedActivations,
                 shared: int = 0):
        self.rows, self.S, self.T, self.shared = rows, S, T, shared
        self.kv, self.acts = kv, acts
        B = len(rows)
        self.ids = torch.full((B, S), pad, dtype=torch.long)
        self.valid = torch.zeros((B, T), dtype=torch.bool)
        for b, r in enumerate(rows):
            L = len(r.own_ids)
            self.ids[b, S - L :] = torch.tensor(r.own_ids)
            self.valid[b, S - L : S] = True
        self.next_pos = self.valid[:, :S].sum(-1, keepdim=True) + shared  # after prefill: each prompt's length
        self.slot = -1
        self.last: torch.Tensor | None = None  # tokens chosen at the previous step [B]
        self.refill: Refill | None = None  # rows entering this step
        self.shifts = 0

    @property
    def phase(self) -> str:
        """The phase of the batch's next step: "prefill" while no cache slot is written, then "decode"."""
        return "prefill" if self.slot < 0 else "decode"

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rows)

    def context(self) -> tuple[torch.Tensor, StepContext]:
        """Input ids and the (CPU) context of the next step over the batch's cache (sliding windows are the model's:
        its `begin_step` narrows the mask for the layers that slide)."""
        if self.slot < 0:
            positions = (self.valid[:, : self.S].cumsum(-1) - 1).clamp(min=0) + self.shared
            mask = prefill_mask(self.valid[:, : self.S])
            return self.ids, StepContext(positions, mask, 0, self.kv, phase="prefill")
        slot = self.slot + 1
        self.valid[:, slot] = True
        mask = decode_mask(self.valid, slot + 1)
        return self.last.view(-1, 1), StepContext(self.next_pos, mask, slot, self.kv, phase="decode")

    def take_refill(self, waiting: list[RowState]) -> None:
        """Give finished rows' slots to waiting rows that fit (shifting the cache when that makes room). Also
        drop the slots before the oldest live row's first once they are many: refilled rows keep the cursor
        from ever returning to the start, and decode attention walks every slot from 0."""
        if self.slot < 0:
            return
        live = [b for b, r in enumerate(self.rows) if not r.done]
        next_slot = self.slot + 1
        oldest = min((int(self.valid[b].nonzero()[0]) for b in live), default=next_slot)
        longest = max((len(r.own_ids) for r in waiting[:1]), default=1)  # waiting rows: longest first
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
        self.refill = Refill(free[: len(rows)], rows, end, self.shared)
        for b, r in zip(self.refill.slots, rows):
            self.rows[b] = r
            self.valid[b] = False
            self.valid[b, end - len(r.own_ids) + 1 : end + 1] = True

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
        want = any(r.req.params.logprobs for r in rows)
        allowed = mask_logits(logits, rows, keep=want)  # constrained rows: only what their grammar allows
        tokens = next_tokens(allowed, [r.req.params for r in rows], [r.generator for r in rows])
        for b, r in enumerate(rows):
            forced = r.req.forced_ids
            if forced is not None and len(r.tokens) < len(forced):
                tokens[b] = forced[len(r.tokens)]
        lps = chosen_logprobs(logits, tokens).tolist() if want else [None] * len(rows)
        for r, t, lp in zip(rows, tokens.tolist(), lps):
            live = not r.done
            r.push(t, lp, tokenizer)
            if live and r.matcher is not None:
                advance(r, t)
        self.last = tokens
        if self.slot < 0:
            self.slot = self.S - 1
        else:
            self.slot += 1
            self.next_pos = self.next_pos + 1
        if self.refill is not None:
            for b, n in zip(self.refill.slots, self.refill.lengths):
                self.next_pos[b] = self.shared + n
            self.refill = None


def prefix_logprobs_needed(rows: list[RowState], shared: int) -> str | None:
    """What rows that score their prompt need of a shared prefix of `shared` tokens (SharedPrefix.logprobs_needed):
    "all" where one scores every token or more than its own, "first" where one scores exactly its own tokens (the
    first of them from the prefix's last position), else None (rows scoring their last own tokens need nothing of
    it)."""
    asks = [r.req.params.score_last for r in rows if r.req.params.prompt_logprobs]
    own = [len(r.prompt_ids) - shared for r in rows if r.req.params.prompt_logprobs]
    if any(last == 0 or last > n for last, n in zip(asks, own)):
        return "all"
    return "first" if any(last == n for last, n in zip(asks, own)) else None


class BlockExecutor:
    """Runs blocks of rows (up to gbs * num_gb) through the zig-zag loop: the loaded model under one `Policy`."""

    def __init__(self, loaded: LoadedModel, policy: Policy):
        self.loaded, self.policy = loaded, policy
        self.seconds = {"prefill": 0.0, "decode": 0.0}  # wall time of each phase's steps, over every block run
        # layer passes, rows computed over them, and refill work, likewise
        # and the shared prefixes: their tokens (once per block), the rows that used them, and the prompt tokens
        # those rows did not compute (each row but one of a block: the prefix's tokens)
        self.counts = {"steps": 0, "row_steps": 0, "refilled_rows": 0, "shifts": 0, "shared_tokens": 0,
                       "shared_rows": 0, "saved_tokens": 0}
        self._held: list[tuple[str, int]] = []  # (tier, bytes) reserved for the running block's buffers
        self._prefix: SharedPrefix | None = None  # the running block's shared prefix

    def device(self, phase: str, layer: int) -> str:
        return "gpu" if self.policy.layer_on_gpu(phase, layer) else "cpu"

    def run_block(self, rows: list[RowState], waiting: list[RowState] | None = None) -> None:
        """Complete `rows` (one block); with `waiting`, finished rows' slots take rows from it (refill), which
        are popped as they enter."""
        p, refill, everyone, queued = self.policy, waiting is not None, rows + (waiting or []), len(waiting or [])
        P = self.shared_tokens(everyone)
        for r in everyone:
            r.shared = P
        S = max(len(r.prompt_ids) for r in rows) - P
        T = self.total_slots(everyone) - P
        try:
            if P:
                self._prefix = self._make_prefix(rows[0].prompt_ids[:P], prefix_logprobs_needed(everyone, P))
            batches = [self._batch(rows[i : i + p.gbs], S, T) for i in range(0, len(rows), p.gbs)]
            while True:
                for b in batches if refill else ():
                    self._refill(b, waiting)
                for b in batches if not waiting else ():
                    b.drop_finished()
                live = [b for b in batches if not b.done]
                if not live:
                    break
                phase = live[0].phase
                assert all(b.phase == phase for b in live), "a block's GPU batches step in one phase"
                t0 = time.perf_counter()
                with trace.scope(phase):
                    self._step(live, phase)
                self.counts["steps"] += 1
                self.counts["row_steps"] += sum(len(b.rows) for b in live)
                self.seconds[phase] += time.perf_counter() - t0
        finally:
            for tier, nbytes in self._held:
                self.loaded.devices.tiers[tier].release(nbytes)
            self._held.clear()
            self._prefix = None
        if P:
            ran = len(rows) + queued - len(waiting or [])
            self.counts["shared_tokens"] += P
            self.counts["shared_rows"] += ran
            self.counts["saved_tokens"] += P * (ran - 1)

    def shared_tokens(self, rows: list[RowState]) -> int:
        """Leading prompt tokens that `rows` (a block and the rows waiting to refill it) share and compute once
        (engine/loop/shared_prefix.py); 0 when sharing is off, or where a sliding window would have rows' late
        tokens stop seeing the first ones."""
        window = self.loaded.spec.sliding_window
        if not self.policy.share_prefix or (window is not None and self.total_slots(rows) > window):
            return 0
        return shared_length([r.prompt_ids for r in rows])

    def _make_prefix(self, ids: list[int], logprobs_needed: str | None) -> SharedPrefix:
        """The block's shared prefix with its K/V buffers, on the tier that holds most of the KV cache (the disk
        tier's rows attend on the CPU); `logprobs_needed`: what of it rows that score their prompt need
        (`prefix_logprobs_needed`)."""
        m, home = self.loaded, prefix_tier(self.policy)
        make = self._alloc(home)
        shape = (1, m.spec.num_kv_heads, len(ids), m.spec.head_dim)
        k, v = ([make(shape, m.dtype) for _ in range(m.spec.num_layers)] for _ in range(2))
        return SharedPrefix(ids, k, v, home, m.devices, logprobs_needed)

    def _batch(self, rows: list[RowState], S: int, T: int) -> GpuBatch:
        """A GPU batch of `rows` with its KV cache (T slots) and activation buffers (S positions), placed by the
        policy; their tier reservations are held until the block ends."""
        p, B, devices = self.policy, len(rows), self.loaded.devices
        kv = self._make_kv(B, T)
        fractions = {"gpu": p.act_gpu, "cpu": p.act_cpu, "disk": p.act_disk}
        acts = PlacedActivations.create(devices, fractions, (B, S, self.loaded.spec.hidden_size), ACT_DTYPE)
        self._held += [(tier, buf.numel() * buf.element_size()) for (tier, _), buf in zip(acts.segments, acts.buffers)]
        return GpuBatch(rows, S, T, self.loaded.pad, kv, acts, len(self._prefix or ()))

    def _refill(self, b: GpuBatch, waiting: list[RowState]) -> None:
        shifts = b.shifts
        b.take_refill(waiting)
        self.counts["refilled_rows"] += len(b.refill.rows) if b.refill else 0
        self.counts["shifts"] += b.shifts - shifts

    @staticmethod
    def total_slots(rows: list[RowState]) -> int:
        """Cache slots of a block without sharing: its longest prompt plus its largest max_new_tokens (refilled
        rows fit too); with a shared prefix, its tokens are not in the rows' caches."""
        return max(len(r.prompt_ids) for r in rows) + max(r.req.params.max_new_tokens for r in rows)

    def _alloc(self, tier: str):
        def make(shape, dtype):
            t = alloc(self.loaded.devices, tier, shape, dtype, "KV cache")
            self._held.append((tier, t.numel() * t.element_size()))
            return t

        return make

    def _make_kv(self, B: int, T: int) -> PlacedKV:
        m, p = self.loaded, self.policy
        fractions = {"gpu": p.cache_gpu, "cpu": p.cache_cpu, "disk": p.cache_disk}
        segments = []
        for tier, rows in row_segments(B, fractions):
            n = rows.stop - rows.start
            shape = (m.spec.num_layers, n, m.spec.num_kv_heads, T, m.spec.head_dim, m.dtype)
            if tier == "disk" and not m.kv_codec:  # read and written with direct I/O (engine/memory/disk_kv.py)
                cache = DirectKVCache(*shape, offload_dir=m.devices.offload_dir)
                m.devices.tiers["disk"].reserve(cache.nbytes(), "KV cache")
                self._held.append(("disk", cache.nbytes()))
            else:
                make = m.kv_codec.cache if m.kv_codec else KVCache
                cache = make(*shape, alloc=self._alloc(tier))
            segments.append((tier, rows, cache))
        return PlacedKV(m.devices, segments, p.cpu_attention, m.kernels.prefill_attention, self._prefix)

    def _step(self, live: list[GpuBatch], phase: str) -> None:
        """One generation step of every live GPU batch, layer by layer: each layer's weights are fetched once
        for all of them. Rows refilled in a batch prefill in the same layer pass, after the batch's decode. The
        embeddings and the LM head run where they live (`globals_on`)."""
        m, L = self.loaded, self.loaded.spec.num_layers
        on = [self.device(phase, j) for j in range(L)]  # each layer's compute device in this phase
        carry = len(live) == 1  # one GPU batch: its hidden states go straight to the next layer
        prefix = self._prefix if self._prefix is not None and not self._prefix.computed else None
        if prefix is not None:  # the block's first pass: its shared prefix computes first, at each layer
            self._begin_prefix(prefix, set(on))
        contexts = [self._begin(b, set(on), carry) for b in live]
        for j, dev in enumerate(on):
            w = m.weights.get(j, dev)
            m.weights.prefetch(*((j + 1, on[j + 1]) if j + 1 < L else (0, self.device("decode", 0))))
            if prefix is not None:
                prefix.layer(m.model, w, j, dev)
            for b, ctx in zip(live, contexts):
                b.acts.store(m.model.layer(w, b.acts.load(dev, carry=carry), ctx[dev], j), dev, carry=carry)
                if b.refill is not None:
                    b.refill.layer(m.model, w, j, dev, m.devices)
            del w
        if prefix is not None:
            prefix.finish_pass(self._head, lambda h, where: m.devices.move(h, where, m.globals_on))
        for b in live:
            if phase == "prefill":
                self._score_prompts(b.rows, lambda: b.acts.load(m.globals_on, carry=carry))  # noqa: B023
            logits = self._head(b.acts.load(m.globals_on, last=True, carry=carry))
            if b.refill is not None:
                r = b.refill
                self._score_prompts(r.rows, lambda: m.devices.move(r.hidden, r.where, m.globals_on))  # noqa: B023
                logits[r.slots] = self._head(m.devices.move(r.hidden[:, -1], r.where, m.globals_on))
            with trace.scope(trace.SAMPLING):
                b.choose(logits, m.tokenizer)

    def _begin(self, b: GpuBatch, devices: set[str], carry: bool) -> dict[str, StepContext]:
        """Start a step of batch `b` (and of its refill rows' prefill): embed the inputs and store them; the
        step's context on each compute device in `devices` (and the globals')."""
        m, g = self.loaded, self.loaded.globals_on
        ids, ctx = b.context()
        contexts = self._contexts(m.model.begin_step(ctx), devices | {g})
        b.acts.store(self._embed(ids, contexts[g]), g, carry=carry)
        if b.refill is not None:
            ids, rctx = b.refill.inputs(m.pad, b.kv, m.kernels.prefill_attention)
            rcontexts = self._contexts(m.model.begin_step(rctx), devices | {g})
            b.refill.begin(self._embed(ids, rcontexts[g]), g, rcontexts)
        return contexts

    def _score_prompts(self, rows: list[RowState], hidden) -> None:
        """The rows that asked for their prompt's log-probabilities get them from the prefill's last-layer hidden
        states (`hidden()`: [B, S, H] on the head's device, each row's own tokens left-padded to S), through the
        same LM head as generation; the shared prefix's part was scored once. A row that scores only its last
        tokens (`score_last`) within its own has the head run at those positions only."""
        wanted = [b for b, r in enumerate(rows) if r.req.params.prompt_logprobs]
        if not wanted:
            return
        h = hidden()
        for b in wanted:
            r, own, last = rows[b], rows[b].own_ids, rows[b].req.params.score_last
            if 0 < last < len(own):
                r.prompt_logprobs, r.prompt_greedy = prompt_logprobs(self._head, h[b, h.shape[1] - last - 1 :],
                                                                   own[-last - 1 :])
                continue
            lp, greedy = prompt_logprobs(self._head, h[b, h.shape[1] - len(own) :], own)
            if r.shared:
                shared_lp, shared_greedy = self._prefix.logprobs_for(own[0])
                lp, greedy = shared_lp + lp, shared_greedy + greedy
            r.prompt_logprobs, r.prompt_greedy = (lp[-last:], greedy[-last:]) if last else (lp, greedy)

    def _begin_prefix(self, prefix: SharedPrefix, devices: set[str]) -> None:
        """Start the shared prefix's prefill: its embeddings, and its context on each compute device."""
        g = self.loaded.globals_on
        ids, ctx = prefix.inputs()
        contexts = self._contexts(self.loaded.model.begin_step(ctx), devices | {g})
        prefix.begin(self._embed(ids, contexts[g]), g, contexts)

    def _embed(self, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Token ids [B, S] (on the CPU) -> hidden states [B, S, H] on the embeddings' device (`ctx.device`)."""
        m = self.loaded
        return m.model.embed(m.global_weights, m.devices.move(ids, "cpu", ctx.device), ctx)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """Last positions [B, H] on the head's device -> float32 logits [B, V] on the CPU, where tokens are
        chosen."""
        m = self.loaded
        return m.devices.move(m.model.head(m.global_weights, h), m.globals_on, "cpu")

    def _contexts(self, ctx: StepContext, devices: set[str]) -> dict[str, StepContext]:
        """The step context (made on the CPU) as seen on each compute device: its tensors moved there once per
        step (no copy unless that device is CUDA)."""
        out = {}
        for dev in sorted(devices):
            target = self.loaded.devices.torch_device(dev)
            if ctx.positions.device == target:
                out[dev] = replace(ctx, device=dev)
                continue
            rope = tuple(tuple(t.to(target) for t in table) for table in ctx.rope) if ctx.rope is not None else None
            windowed = ctx.window_mask.to(target) if ctx.window_mask is not None else None
            out[dev] = replace(ctx, positions=ctx.positions.to(target), mask=ctx.mask.to(target), rope=rope,
                               window_mask=windowed, device=dev)
        return out

    def block_bytes(self, rows: int, S: int, T: int, shared: int = 0) -> dict[str, int]:
        """Bytes a block of `rows` rows (prompt length S, total length T, after `shared` prefix tokens) needs per
        tier, by engine/memory/footprint.py: each GPU batch's KV cache (T slots a row) and activations (S
        positions a row) on their row segments, the shared prefix's K/V (one row, uncompressed) on `prefix_tier`,
        and on the CPU the two one-layer buffers of a plain disk-tier cache and the layers staged from disk
        (the one computing, the one prefetched: footprint.disk_staged_bytes), with the dense buffers they are
        dequantized into where resident layers need none (footprint.streamed_dense_bytes)."""
        spec, p, compressed = self.loaded.spec, self.policy, self.loaded.kv_codec is not None
        elem = torch.empty((), dtype=self.loaded.dtype).element_size()
        need = dict.fromkeys(("gpu", "cpu", "disk"), 0)
        if shared:
            need[prefix_tier(p)] += prefix_bytes(spec, shared, elem)
        for start in range(0, rows, p.gbs):
            B = min(p.gbs, rows - start)
            for tier, r in row_segments(B, {"gpu": p.cache_gpu, "cpu": p.cache_cpu, "disk": p.cache_disk}):
                need[tier] += (r.stop - r.start) * kv_row_bytes(spec, T, elem, compressed)
                if tier == "disk" and not compressed:
                    need["cpu"] += (r.stop - r.start) * disk_kv_buffer_bytes(spec, T, elem)
            for tier, r in row_segments(B, {"gpu": p.act_gpu, "cpu": p.act_cpu, "disk": p.act_disk}):
                need[tier] += (r.stop - r.start) * act_row_bytes(spec, S)
        if "disk" in self.loaded.weights.placement:
            need["cpu"] += (disk_staged_bytes(spec, elem, p, max(self.loaded.weights.layer_bytes))
                            + streamed_dense_bytes(spec, elem, p))
        return need
