"""Per-family transformer functions. Each family object exposes the same four steps, which the generation
loop (and later the block schedule) calls layer by layer:

    begin_step(ctx) -> ctx     per step, shared by all layers: the context with the step's tables (rotary cos/sin)
    embed(gw, ids, ctx) -> h   token ids [B, S] -> hidden [B, S, H]
    layer(lw, h, ctx, i) -> h  one transformer layer with its KV cache, on the compute device `ctx.device`
    head(gw, h) -> logits      hidden [B, H] -> float32 logits [B, V]

Linear layers, norms, rotary positions and gating go through the backend's kernels (engine/kernels/native.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from engine import trace
from engine.compression.qlinear import QWeight
from engine.kernels.attention import ScoreRule
from engine.kernels.native import NativeKernels
from engine.spec import ModelSpec

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class StepContext:
    """What one forward step over a batch needs besides weights, as seen on one compute device: positions
    [B, S], attention mask [B, 1, S, T], the first cache slot this step writes, the batch's cache, the step's
    rotary tables (families with rotary positions), the compute device ("cpu" or "gpu": where these tensors
    are and the layer computes) and the phase ("prefill" or "decode"). The cache does the attention
    (`ctx.attend`), because where and how attention runs depends on where the cache lives, whether it is
    compressed, the compute device and the phase: all of them reach it as arguments."""

    positions: torch.Tensor
    mask: torch.Tensor
    start: int
    cache: object  # engine.memory.placement.PlacedKV or engine.loop.refill.RefillKV
    rope: tuple | None = None  # one table per rotary kind of the model (ModelSpec.rope_layers)
    device: str = "cpu"
    phase: str = "prefill"
    window_mask: torch.Tensor | None = None  # `mask` within the sliding window, for the layers that slide

    def __post_init__(self) -> None:
        assert self.phase in PHASES, self.phase

    def attend(self, layer: int, q, k_new, v_new, scale: float | None = None, sliding: bool = False,
               rule: ScoreRule | None = None) -> torch.Tensor:
        """Store this step's K/V [B, KVH, S, D] of `layer` in the cache and attend q [B, NH, S, D] -> [B, NH, S, D],
        through the sliding window's mask where `sliding`, under the score `rule` where the model has one."""
        mask = self.window_mask if sliding else self.mask
        with trace.scope(trace.ATTENTION):
            return self.cache.attend(layer, q, k_new, v_new, self.start, mask, scale, device=self.device,
                                     phase=self.phase, rule=rule)


CHUNK_BYTES = 16 << 20  # the widest row-local temporary a chunk of rows may take (see by_rows)


def by_rows(fn, h: torch.Tensor, width: int, *aligned: torch.Tensor) -> torch.Tensor:
    """h [*, H] updated in place, chunk of rows by chunk: `fn(rows, *aligned_rows)` gets a [r, H] view (and the
    same rows of each tensor in `aligned`, [*, H'] each) and writes into it. For the row-local part of a layer
    (norm, MLP, residual add) over many rows (prefill): each chunk's temporaries (`width` float32 values per row at
    most) stay small enough to be reused from the heap and cached, instead of mapped fresh and faulted in per call
    (on the CPU; a GPU takes the rows at once). Each row's arithmetic is the same either way."""
    rows = max(1, CHUNK_BYTES // (4 * width))
    flat = h.view(-1, h.shape[-1])
    others = [t.reshape(-1, t.shape[-1]) for t in aligned]
    if flat.shape[0] <= rows or h.device.type != "cpu":
        fn(flat, *others)
    else:
        for chunks in zip(flat.split(rows), *(t.split(rows) for t in others)):
            fn(*chunks)
    return h


def head_weight(gw, spec: ModelSpec):
    """The LM head's weight: an int8 head where one was made (engine.kernels.native.int8_head), else `lm_head.weight`
    (reordered for oneDNN where the kernels chose to: NativeKernels.pack_head), or the embeddings where they are
    tied."""
    w = gw.get("lm_head.weight")
    if isinstance(w, QWeight) or (w is not None and not spec.tie_word_embeddings):
        return w
    return gw["embed_tokens.weight"]


ACTIVATIONS = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu,  # ModelSpec.activation -> the MLP's function
               "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}


class Family:
    """What every family's steps read: the model's spec, the compute dtype, the backend's kernels and the MLP's
    activation function."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, kernels: NativeKernels):
        self.spec = spec
        self.dtype = dtype
        self.kernels = kernels
        self.act = ACTIVATIONS[spec.activation]


def family_for(spec: ModelSpec, dtype: torch.dtype, kernels: NativeKernels | None = None):
    kernels = kernels or NativeKernels()
    if spec.family == "opt":
        from engine.models.opt import OPTModel

        return OPTModel(spec, dtype, kernels)
    from engine.models.llama import LlamaModel

    return LlamaModel(spec, dtype, kernels)
