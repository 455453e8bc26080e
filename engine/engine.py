"""`Engine`: load a checkpoint once, then complete batches of requests with left padding, layer by layer."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import torch

from engine.batching import blocks
from engine.checkpoint import CheckpointReader, LayerWeights
from engine.compression.codecs import KVCodec, WeightCodec
from engine.compression.qlinear import stored_bytes
from engine.dtypes import resolve_dtype
from engine.errors import InvalidParamsError
from engine.kernels.backend import DEFAULT_BACKEND, load_kernels
from engine.kernels.native import int8_head
from engine.loop.grammar import SETTLE_SECONDS, Grammars, GuidedError
from engine.loop.loaded import LoadedModel
from engine.loop.row_state import RowState
from engine.loop.schedule import BlockExecutor
from engine.memory.heap import choose_heap
from engine.memory.room import memory_room
from engine.memory.tiers import BudgetError, Devices, human
from engine.memory.weight_store import WeightStore, globals_tier, head_in_int8
from engine.models import family_for
from engine.policy import Policy
from engine.prompt_ids import PromptError, request_prompt_ids
from engine.request import TRUNCATE, Completion, Request
from engine.spec import ModelSpec, load_model_spec
from engine.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, loaded: LoadedModel, eos_ids: tuple[int, ...], policy: Policy):
        self.loaded = loaded  # what the load fixed: model, weights and their placement, dtype, codecs, tokenizer
        self.eos_ids = eos_ids
        self._policy = policy  # the policy it loaded with; a call passes its own to `generate`
        self.phase_seconds: dict[str, float] = {}  # the last `generate`'s prefill and decode seconds
        self.schedule_counts: dict[str, int] = {}  # the last `generate`'s layer passes, refilled rows, shifts

    # what the load fixed, read through `loaded`; none is assigned from outside
    policy = property(lambda self: self._policy)
    spec = property(lambda self: self.loaded.spec)
    model = property(lambda self: self.loaded.model)
    gw = property(lambda self: self.loaded.global_weights)
    weights = property(lambda self: self.loaded.weights)
    devices = property(lambda self: self.loaded.devices)
    dtype = property(lambda self: self.loaded.dtype)
    kernels = property(lambda self: self.loaded.kernels)
    kv_codec = property(lambda self: self.loaded.kv_codec)
    tokenizer = property(lambda self: self.loaded.tokenizer)
    globals_on = property(lambda self: self.loaded.globals_on)  # where the embeddings and the LM head compute

    @property
    def backend(self) -> str:
        """The kernel backend in use ("native" or "ipex"; "auto" resolves to one of them at load)."""
        return self.kernels.name

    @property
    def layers(self) -> list[LayerWeights]:
        """Every layer's weights as computed on the CPU (loads disk layers; for inspection and tests)."""
        # copies: a disk layer read with O_DIRECT is a view of a buffer that the next read reuses
        return [{k: v.clone() for k, v in self.weights.get(i, "cpu").items()} for i in range(self.spec.num_layers)]

    @classmethod
    def load(cls, model_dir: str | Path, dtype: str = "auto", policy: Policy | None = None,
             budgets: dict[str, float | None] | None = None, simulate_gpu: bool = False,
             offload_dir: str | Path | None = None, backend: str = DEFAULT_BACKEND, tokenizer: bool = True) -> Engine:
        """Load a checkpoint and place it by `policy` (everything on the CPU by default). `budgets` caps each
        tier in bytes; `simulate_gpu` makes the gpu tier a separate CPU pool (tests on machines without CUDA).
        `backend` picks the CPU kernels (engine/kernels/native.py): "native", "ipex", or "auto" (ipex if it imports).
        `tokenizer=False` loads none: the engine then only runs token ids through `executor` (the planner's
        probe of the engine's own costs)."""
        spec = load_model_spec(model_dir)
        policy = policy or Policy()
        choose_heap(memory_room())  # mapped large blocks under a binding limit, else freed blocks reused
        torch_dtype = resolve_dtype(dtype)
        kernels = load_kernels(backend)
        devices = Devices(budgets, simulate_gpu=simulate_gpu, offload_dir=offload_dir)
        _check_gpu(policy, devices)
        devices.use_pinned_host(any(policy.layer_on_gpu(ph, j) for ph in ("prefill", "decode")
                                    for j in range(spec.num_layers)))
        t0 = time.perf_counter()
        reader = CheckpointReader(model_dir, spec)
        gw, where = reader.globals(torch_dtype), globals_tier(policy, spec.num_layers)
        if head_in_int8(policy, where):
            gw = int8_head(gw, spec.tie_word_embeddings, torch_dtype)
        devices.tiers[where].reserve(stored_bytes(gw.values()), "embeddings and head")
        gw = {k: v.to(devices.torch_device(where)) if isinstance(v, torch.Tensor) else v for k, v in gw.items()}
        if where == "cpu":
            gw = kernels.pack_head(gw, spec.tie_word_embeddings)
        wcodec, kvcodec = codecs_for(policy, torch_dtype)
        weights = WeightStore(reader, policy, devices, torch_dtype, codec=wcodec, offload_dir=offload_dir,
                              kernels=kernels)
        log.info("loaded %s (%d layers, %s, layers on %s, %s kernels) in %.2fs", model_dir, spec.num_layers,
                 torch_dtype, "/".join(weights.placement), kernels.name, time.perf_counter() - t0)
        eos_ids = eos_ids_of(model_dir, spec)
        loaded = LoadedModel(spec, family_for(spec, torch_dtype, kernels), gw, weights, devices, torch_dtype, kernels,
                             kvcodec, load_tokenizer(model_dir) if tokenizer else None,
                             pad=eos_ids[0] if eos_ids else 0, globals_on=where)
        return cls(loaded, eos_ids, policy)

    def generate(self, requests: list[Request], policy: Policy | None = None, batch_size: int | None = None,
                 truncate: str = "error") -> list[Completion]:
        """Complete every request; results come back in the order of `requests`. A bad row gets
        `finish_reason="error"`; it never fails the others. Rows run in blocks of `gbs * num_gb` prompts
        (engine/batching.py). What may change between calls is an argument: `policy` (the loaded one by default)
        may differ from the loaded policy in all but what the load fixed (`Policy.fixed_at_load`), and
        `batch_size` is a shorthand for one GPU batch of that many rows per block."""
        TRUNCATE.check(truncate)
        policy = self.call_policy(policy, batch_size)
        results: list[Completion | None] = [None] * len(requests)
        grammars = self.grammars()  # each distinct constraint compiled once in this call, in the background
        now, later = self._by_compile(requests, grammars)
        executor = self.executor(policy)
        try:
            for part in (now, later):  # rows whose constraint still compiles run after the others
                ready: list[tuple[int, RowState]] = []
                for n in part:
                    row = self._prepare(requests[n], truncate, grammars)
                    if isinstance(row, Completion):
                        results[n] = row
                    else:
                        ready.append((n, row))
                if ready:
                    self._run_rows(ready, executor, results)
        finally:
            self.weights.settle()  # no read-ahead of this call outlives it
        self.phase_seconds = dict(executor.seconds)
        self.schedule_counts = dict(executor.counts)
        return results

    def _by_compile(self, requests: list[Request], grammars: Grammars) -> tuple[list[int], list[int]]:
        """Start compiling the call's constraints, wait for them a moment (most take milliseconds), and split
        the rows: those that can run now, and those whose constraint is still compiling. A slow compile then
        holds up its own rows only, never the others (each compile's time is bounded: Grammars)."""
        guided = [r.params.guided for r in requests if r.params.guided is not None and r.forced_ids is None]
        if not guided:
            return list(range(len(requests))), []
        grammars.start(guided)
        grammars.settle(SETTLE_SECONDS)
        waiting = {n for n, r in enumerate(requests) if r.params.guided is not None and r.forced_ids is None
                   and not grammars.ready(r.params.guided)}
        return [n for n in range(len(requests)) if n not in waiting], sorted(waiting)

    def _run_rows(self, ready: list[tuple[int, RowState]], executor: BlockExecutor, results: list) -> None:
        """Run prepared rows in blocks (engine/batching.py) and put their completions in `results`."""
        policy = executor.policy
        grouped = blocks(ready, policy.block_size, policy.refill, policy.share_prefix and policy.weights_stay())
        self._check_budgets(executor, grouped)
        for block, waiting in grouped:
            rows, left = [row for _, row in block], [row for _, row in waiting]
            while rows:
                with torch.inference_mode():
                    executor.run_block(rows, left if policy.refill else None)  # refill pops the rows it takes
                rows, left = left[: policy.block_size], left[policy.block_size :]  # none fitted: a block of its own
        for n, row in ready:
            assert row.done, row.req.id
            results[n] = row.completion(self.tokenizer)

    def call_policy(self, policy: Policy | None = None, batch_size: int | None = None) -> Policy:
        """The policy of one call: `policy` (by default the loaded one), which must keep what the load fixed."""
        if policy is None:
            policy = self.policy
        else:
            loaded, asked = (p.fixed_at_load(self.spec.num_layers) for p in (self.policy, policy))
            differ = sorted(k for k, v in asked.items() if loaded[k] != v)
            if differ:
                raise InvalidParamsError(f"this engine was loaded with other {', '.join(differ)}: a call may change "
                                         "the block shape, refill and the cache's placement, not what the load "
                                         "fixed; load an engine with the new policy")
            _check_gpu(policy, self.devices)
        return dataclasses.replace(policy, gbs=batch_size, num_gb=1) if batch_size is not None else policy

    def executor(self, policy: Policy | None = None) -> BlockExecutor:
        """The block executor of this engine's weights under `policy` (the engine's own by default): it runs a
        block of `RowState`s through every layer, the zig-zag schedule."""
        return BlockExecutor(self.loaded, policy or self.policy)

    def _check_budgets(self, executor: BlockExecutor, blocks) -> None:
        """Refuse, before any work, a workload whose largest block does not fit a tier's budget."""
        for block, waiting in blocks:
            rows = [row for _, row in block]
            everyone = rows + [row for _, row in waiting]
            P = executor.shared_tokens(everyone)
            S = max(len(r.prompt_ids) for r in rows) - P
            T = executor.total_slots(everyone) - P
            need = executor.block_bytes(len(rows), S, T, shared=P)
            staging = self.weights.staging_bytes()  # two layers staged on the GPU away from their tier
            need["gpu"] += staging
            for tier, nbytes in need.items():
                t = self.devices.tiers[tier]
                if t.budget is not None and t.used + nbytes > t.budget:
                    what = ("KV cache, activations and two streamed layers' staging" if tier == "gpu" and staging
                            else "KV cache and activations")
                    raise BudgetError(
                        f"a block of {len(rows)} rows x {T} tokens needs {human(nbytes)} of {what} on the {tier} "
                        f"tier, which has {human(t.budget - t.used)} left of its {human(t.budget)} budget; lower "
                        f"--gbs/--num-gb, raise --{tier}-mem, or move cache or weights to another tier")

    def _prompt_ids(self, req: Request) -> list[int] | str:
        """The request's prompt token ids (given, rendered from its messages, or tokenized from its prompt) by the
        one rule of engine/prompt_ids.py, or why it has none (that row's error)."""
        try:
            return request_prompt_ids(self.tokenizer, self.spec.vocab_size, req)
        except PromptError as e:
            return str(e)

    def grammars(self) -> Grammars:
        """An empty cache of compiled constraints for one call (nothing is compiled until a row needs it)."""
        return Grammars(self.tokenizer, self.spec.vocab_size, self.eos_ids)

    def _prepare(self, req: Request, truncate: str, grammars: Grammars | None = None) -> RowState | Completion:
        ids = self._prompt_ids(req)
        if isinstance(ids, str):
            return Completion.failed(req.id, ids)
        context = self.spec.max_position_embeddings
        room = context - req.params.max_new_tokens
        if room < 1:
            return Completion.failed(req.id, f"max_new_tokens={req.params.max_new_tokens} leaves no room for the "
                                     f"prompt in the model's context of {context} tokens; lower it", len(ids))
        if len(ids) > room:
            if truncate != "left":
                return Completion.failed(req.id, _too_long(len(ids), req.params, context), len(ids))
            ids = ids[-room:]
        matcher = None
        if req.params.guided is not None:
            if req.forced_ids is not None:
                return Completion.failed(req.id, "a request with forced_ids cannot also be guided: drop one of "
                                         "them", len(ids))
            try:
                matcher = (grammars or self.grammars()).matcher(req.params.guided)
            except GuidedError as e:
                return Completion.failed(req.id, str(e), len(ids))
        return RowState(req, ids, self.eos_ids, matcher)


def _too_long(tokens: int, params, context: int) -> str:
    """The error of a row longer than the model's context: a scored row (one token asked for, and dropped) can
    only be shortened, a generating row can also generate less."""
    if params.prompt_logprobs and params.max_new_tokens == 1:
        return (f"the row to score has {tokens} tokens, more than the {context - 1} that the model's context of "
                f"{context} holds beside the one token a scored row asks for; shorten its prompt or continuation, "
                "or truncate left (which drops the prompt's first tokens)")
    return (f"prompt has {tokens} tokens; with max_new_tokens={params.max_new_tokens} it exceeds the model's "
            f"context of {context}; shorten it, lower max_new_tokens, or truncate left")


def eos_ids_of(model_dir: str | Path, spec: ModelSpec) -> tuple[int, ...]:
    """The ids that end a row: generation_config.json's `eos_token_id` (one id or several, e.g. Llama 3's
    <|end_of_text|> and <|eot_id|>), which is what transformers' `generate` stops on; config.json's when that
    file is absent or names none."""
    gen = Path(model_dir) / "generation_config.json"
    value = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None
    if value is None:
        return tuple(spec.eos_token_ids)
    return tuple(dict.fromkeys(int(t) for t in (value if isinstance(value, list) else [value])))


_eos_ids = eos_ids_of  # the name jobs/bench/planner.py imports


def _check_gpu(policy: Policy, devices: Devices) -> None:
    if policy.uses_gpu() and not devices.gpu_available:
        raise InvalidParamsError(
            "the policy places data or compute on the gpu tier but no CUDA device is available; "
            "use a CPU-only policy (all fractions on cpu/disk, --prefill-device cpu --decode-device cpu)")


def codecs_for(policy: Policy, dtype: torch.dtype):
    """The weight and KV-cache codecs a policy asks for (None = uncompressed)."""
    return (WeightCodec(dtype, format=policy.weight_format) if policy.compress_weight else None), (KVCodec() if policy.compress_cache else None)
