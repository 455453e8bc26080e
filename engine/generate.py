"""`Engine`: load a checkpoint once, then complete batches of requests with left padding, layer by layer."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from engine.attention import decode_mask, prefill_mask
from engine.dtypes import resolve_dtype
from engine.errors import InvalidParamsError
from engine.kv_cache import KVCache
from engine.models import StepContext, family_for
from engine.request import TRUNCATE_CHOICES, Completion, Request
from engine.rows import RowState
from engine.sampling import chosen_logprobs, next_tokens
from engine.spec import ModelSpec, load_model_spec
from engine.tokenizer import load_tokenizer
from engine.weights import CheckpointReader, LayerWeights

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, spec: ModelSpec, tokenizer, global_weights: LayerWeights, layers: list[LayerWeights],
                 dtype: torch.dtype, eos_ids: tuple[int, ...]):
        self.spec = spec
        self.tokenizer = tokenizer
        self.gw = global_weights
        self.layers = layers
        self.dtype = dtype
        self.eos_ids = eos_ids
        self.model = family_for(spec, dtype)

    @classmethod
    def load(cls, model_dir: str | Path, dtype: str = "auto") -> Engine:
        spec = load_model_spec(model_dir)
        torch_dtype = resolve_dtype(dtype)
        t0 = time.perf_counter()
        reader = CheckpointReader(model_dir, spec)
        gw = reader.globals(torch_dtype)
        layers = list(reader.layers(torch_dtype))
        log.info("loaded %s (%d layers, %s) in %.2fs", model_dir, spec.num_layers, torch_dtype,
                 time.perf_counter() - t0)
        return cls(spec, load_tokenizer(model_dir), gw, layers, torch_dtype, _eos_ids(model_dir, spec))

    def generate(self, requests: list[Request], batch_size: int = 8, truncate: str = "error") -> list[Completion]:
        """Complete every request; results come back in the order of `requests`. A bad row gets
        `finish_reason="error"`; it never fails the others."""
        if truncate not in TRUNCATE_CHOICES:
            raise InvalidParamsError(f"truncate={truncate!r} is invalid: use one of {', '.join(TRUNCATE_CHOICES)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidParamsError(f"batch_size={batch_size!r} is invalid: use a positive integer")
        results: list[Completion | None] = [None] * len(requests)
        ready: list[tuple[int, RowState]] = []
        for n, req in enumerate(requests):
            row = self._prepare(req, truncate)
            if isinstance(row, Completion):
                results[n] = row
            else:
                ready.append((n, row))
        ready.sort(key=lambda item: len(item[1].prompt_ids))  # similar lengths pad less
        for i in range(0, len(ready), batch_size):
            chunk = ready[i : i + batch_size]
            with torch.inference_mode():
                self._run_batch([row for _, row in chunk])
            for n, row in chunk:
                results[n] = row.completion(self.tokenizer)
        return results

    def _prepare(self, req: Request, truncate: str) -> RowState | Completion:
        if not isinstance(req.prompt, str) or not req.prompt:
            what = "empty" if req.prompt == "" else f"not a string ({type(req.prompt).__name__})"
            return Completion.failed(req.id, f"prompt is {what}; give a non-empty string")
        ids = list(self.tokenizer(req.prompt)["input_ids"])
        context = self.spec.max_position_embeddings
        room = context - req.params.max_new_tokens
        if room < 1:
            return Completion.failed(req.id, f"max_new_tokens={req.params.max_new_tokens} leaves no room for the "
                                     f"prompt in the model's context of {context} tokens; lower it", len(ids))
        if len(ids) > room:
            if truncate != "left":
                return Completion.failed(
                    req.id, f"prompt has {len(ids)} tokens; with max_new_tokens={req.params.max_new_tokens} it "
                    f"exceeds the model's context of {context}; shorten it, lower max_new_tokens, or truncate left",
                    len(ids))
            ids = ids[-room:]
        return RowState(req, ids, self.eos_ids)

    def _forward(self, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """ids [B, S] -> float32 logits [B, V] of the last position."""
        self.model.begin_step(ctx)
        h = self.model.embed(self.gw, ids, ctx)
        for i, lw in enumerate(self.layers):
            h = self.model.layer(lw, h, ctx, i)
        return self.model.head(self.gw, h[:, -1])

    def _run_batch(self, rows: list[RowState]) -> None:
        spec, window = self.spec, self.spec.sliding_window
        B, S = len(rows), max(len(r.prompt_ids) for r in rows)
        T = S + max(r.req.params.max_new_tokens for r in rows)
        pad = self.eos_ids[0] if self.eos_ids else 0
        ids = torch.full((B, S), pad, dtype=torch.long)
        valid = torch.zeros((B, T), dtype=torch.bool)
        for b, r in enumerate(rows):
            L = len(r.prompt_ids)
            ids[b, S - L :] = torch.tensor(r.prompt_ids)
            valid[b, S - L : S] = True
        cache = KVCache(spec.num_layers, B, spec.num_kv_heads, T, spec.head_dim, self.dtype)
        positions = (valid[:, :S].cumsum(-1) - 1).clamp(min=0)
        logits = self._forward(ids, StepContext(positions, prefill_mask(valid[:, :S], window), 0, cache))
        lengths = valid[:, :S].sum(-1, keepdim=True)
        want_logprobs = any(r.req.params.logprobs for r in rows)
        for step in range(T - S):
            tokens = next_tokens(logits, [r.req.params for r in rows], [r.generator for r in rows])
            lps = chosen_logprobs(logits, tokens).tolist() if want_logprobs else [None] * B
            for r, t, lp in zip(rows, tokens.tolist(), lps):
                r.push(t, lp, self.tokenizer)
            if all(r.done for r in rows):
                break
            slot = S + step
            valid[:, slot] = True
            ctx = StepContext(lengths + step, decode_mask(valid, slot + 1, window), slot, cache)
            logits = self._forward(tokens.view(B, 1), ctx)


def _eos_ids(model_dir: str | Path, spec: ModelSpec) -> tuple[int, ...]:
    """EOS ids from config.json and, when present, generation_config.json (which `generate` also honours)."""
    ids = list(spec.eos_token_ids)
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        value = json.loads(gen.read_text()).get("eos_token_id")
        for t in value if isinstance(value, list) else [value]:
            if t is not None and t not in ids:
                ids.append(int(t))
    return tuple(ids)
