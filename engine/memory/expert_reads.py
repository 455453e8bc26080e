"""A mixture layer on the disk tier read by expert: the layer's trunk (attention, norms, the router, the shared
expert) is read when the layer is taken, each routed expert only once a token of the step chose it.

A token runs `experts_per_token` of a layer's `num_experts` experts, so a decode step of a few rows touches part
of a layer (Qwen3-MoE: 8 of 128 per token). The router's choice starts the reads of the chosen experts, in the
order the mixture computes them (ascending), in a reader thread: the first expert computes while the next ones
are read. An expert read for one GPU batch of the block is kept for the others until the layer is handed back,
so a block's step reads each expert at most once."""

from __future__ import annotations

import time
from concurrent.futures import Executor, Future

from engine.memory.checkpoint_layers import LayerPlan, sub_plan
from engine.policy import Policy
from engine.spec import ModelSpec


def streams_experts(model: ModelSpec, policy: Policy) -> bool:
    """Whether the mixture layers on the disk tier are read by expert: every layer computes on the CPU in both
    phases (a layer moved to the GPU is read whole)."""
    return bool(model.num_experts) and policy.prefill_device == "cpu" and policy.decode_device == "cpu"


def expert_of(name: str, prefix: str) -> int | None:
    """The expert a stored tensor belongs to (`{prefix}experts.{e}.…`), or None for the layer's trunk."""
    head = prefix + "experts."
    if not name.startswith(head):
        return None
    e = name[len(head):].split(".", 1)[0]
    return int(e) if e.isdigit() else None


def split_experts(plan: LayerPlan, prefix: str) -> tuple[LayerPlan, dict[int, LayerPlan]]:
    """A layer's plan as the plan of its trunk and one plan per expert (each laid out in a buffer of its own)."""
    groups: dict[int | None, set[str]] = {}
    for p in plan.pieces:
        groups.setdefault(expert_of(p.name, prefix), set()).add(p.name)
    trunk = groups.pop(None, set())
    return sub_plan(plan, trunk), {e: sub_plan(plan, names) for e, names in sorted(groups.items())}


class StreamedExperts(dict):
    """A mixture layer's weights, its experts read when routed: `read_ahead(experts)` starts their reads in
    `pool` (`read(e) -> (weights, held)`, held is handed to `release`'s caller), and looking up an expert's tensor
    waits for its read. Lookups happen on the compute thread only."""

    def __init__(self, trunk: dict, prefix: str, read, pool: Executor):
        super().__init__(trunk)
        self._prefix, self._read, self._pool = prefix, read, pool
        self._reads: dict[int, Future] = {}
        self._merged: set[int] = set()
        self.experts_read = 0  # experts taken by the compute thread
        self.waited_s = 0.0  # its time waiting for their reads

    def read_ahead(self, experts: list[int]) -> None:
        """Start reading each of `experts` not read yet, in this order."""
        for e in experts:
            if e not in self._reads:
                self._reads[e] = self._pool.submit(self._read, e)

    def __missing__(self, name: str):
        self._take(name)
        return dict.__getitem__(self, name)

    def get(self, name: str, default=None):
        if not dict.__contains__(self, name):
            self._take(name, missing_ok=True)
        return dict.get(self, name, default)

    def _take(self, name: str, missing_ok: bool = False) -> None:
        e = expert_of(name, self._prefix)
        if e is None or e in self._merged:
            if missing_ok:
                return
            raise KeyError(name)
        self.read_ahead([e])
        t0 = time.perf_counter()
        weights, _held = self._reads[e].result()
        self.waited_s += time.perf_counter() - t0
        self.update(weights)
        self._merged.add(e)
        self.experts_read += 1

    def release(self) -> list:
        """What each expert read holds (its buffer), once every read started has ended; the layer is not used
        after."""
        held = []
        for future in self._reads.values():
            if not future.cancel():
                try:
                    held.append(future.result()[1])
                except Exception:  # an expert no token of the step waited for: its error is not the step's
                    continue
        self._reads.clear()
        self.clear()
        return held
