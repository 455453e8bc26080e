"""The bytes the engine holds, per unit: one layer's weights in each stored format, the embeddings and head, one
token's K and V in one layer in each cache format, one row's activations between layers, a shared prefix's K/V,
and the layers held while weights stream. The engine checks a block against its budgets with these figures
(`engine.loop.schedule.BlockExecutor.block_bytes`); the planner multiplies the same figures by its placement
fractions (planner/memory_model.py) and the GPU benchmark sizes its policies with them, so that what a plan
promises is what the engine then needs. Every figure is in bytes."""

from __future__ import annotations

import math
from collections import Counter

import torch

from engine.compression.int4 import DEFAULT_CONFIG, PARAM_DTYPE
from engine.kernels import int4_tiles, int8_rows, int8_tiles
from engine.memory.expert_reads import streams_experts
from engine.memory.weight_store import globals_tier, head_in_int8
from engine.policy import Policy
from engine.quantized.mxfp4 import BLOCK as MXFP4_BLOCK
from engine.quantized.mxfp4_layer import keeps_packed
from engine.spec import ModelSpec

ACT_DTYPE = torch.float32  # the residual stream between layers, whatever the compute dtype (engine/models/llama.py)
GROUP = DEFAULT_CONFIG.group_size  # 4-bit groups of weights (along in) and of the KV cache (along head_dim)
GROUP_PARAM_BYTES = 2 * PARAM_DTYPE.itemsize  # a 4-bit group's min and scale
INT8_SCALE_BYTES = 4  # a row-wise int8 weight's float32 scale per output row (engine/compression/int8.py)
STAGED_LAYERS = 2  # layers held while weights stream: the one computing and the one prefetched


def linear_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of each Linear weight of one layer: q, k, v, o and the MLP (gate, up, down or fc1, fc2), or a
    mixture's experts (gate, up, down each), its router and its shared expert and gate."""
    h, f = model.hidden_size, model.ffn_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    mlp = [(f, h), (h, f)] if model.family == "opt" else [(f, h), (f, h), (h, f)]
    if model.num_experts:
        fe, fs = model.expert_ffn_size, model.shared_expert_ffn_size
        shared = [(fs, h), (fs, h), (h, fs)] if fs else []
        mlp = [(fe, h), (fe, h), (h, fe)] * model.num_experts + shared + router_shapes(model)
    return [(q, h), (kv, h), (kv, h), (h, q), *mlp]


def router_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of a mixture's routers: the experts' and the shared expert's gate (kept as they are by every
    codec: engine/compression/codecs.py ROUTERS)."""
    if not model.num_experts:
        return []
    return [(model.num_experts, model.hidden_size)] + ([(1, model.hidden_size)] if model.shared_expert_ffn_size else [])


def linear_params(model: ModelSpec) -> int:
    """P_lin = sum of out * in over one layer's Linear weights (elements), what a layer stores."""
    return sum(o * i for o, i in linear_shapes(model))


def active_linear_params(model: ModelSpec) -> int:
    """The Linear parameters one token computes with in a layer: P_lin, less the experts a mixture's token does not
    run (it runs `experts_per_token` of `num_experts`). The GEMM work per token is 2 x this."""
    idle = model.num_experts - model.experts_per_token
    return linear_params(model) - idle * 3 * model.hidden_size * model.expert_ffn_size


def expected_experts(model: ModelSpec, routed: int) -> float:
    """The distinct experts of a mixture layer that `routed` tokens choose, each token `experts_per_token` of
    `num_experts` with routing uniform: E * (1 - (1 - k/E)^routed). Skewed routing chooses fewer: this is what a
    step reads at most, on average."""
    E, k = model.num_experts, model.experts_per_token
    return E * (1.0 - (1.0 - k / E) ** routed) if E else 0.0


def expert_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy) -> float:
    """One routed expert as `policy` stores it: its gate, up and down weights in the weight format (dense when not
    compressed; mxfp4_bytes where kept in the checkpoint's MXFP4), and its biases dense where the model has them."""
    h, f = model.hidden_size, model.expert_ffn_size
    size = (mxfp4_bytes if keeps_packed(model, policy)
            else {"int8": int8_bytes, "bf16": bf16_bytes}.get(policy.weight_format, int4_bytes)
            if policy.compress_weight else lambda o, i: o * i * dtype_bytes)
    return sum(size(o, i) for o, i in [(f, h), (f, h), (h, f)]) + (2 * f + h) * dtype_bytes * model.expert_bias


def routed_layer_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy, routed: int) -> float:
    """What a step routing `routed` tokens reads of a disk layer: the whole stored layer, or, where experts
    stream, the layer less the experts no token chose (`expected_experts`)."""
    W = stored_layer_bytes(model, dtype_bytes, policy)
    if not streams_experts(model, policy):
        return W
    return W - (model.num_experts - expected_experts(model, routed)) * expert_bytes(model, dtype_bytes, policy)


def int4_row_bytes(n: int, group: int = GROUP) -> int:
    """n values in 4 bits, grouped along them (the last group padded): ceil(n / group) * (group / 2 + min and
    scale)."""
    return math.ceil(n / group) * (group // 2 + GROUP_PARAM_BYTES)


def int4_bytes(out: int, inp: int) -> int:
    """A 4-bit [out, in] weight grouped along in: out * int4_row_bytes(in)."""
    return out * int4_row_bytes(inp)


def int8_bytes(out: int, inp: int) -> int:
    """A row-wise 8-bit [out, in] weight: out * in codes + out float32 scales."""
    return out * inp + out * INT8_SCALE_BYTES


def int8_head_bytes(out: int, inp: int) -> int:
    """The int8 head as the engine keeps it: in the int8 kernel's tiles where the project's kernels are built (out
    padded to a multiple of 16, in to one of 64, and an int32 code sum per output beside each scale;
    engine/kernels/int8_tiles.py), else as stored."""
    if not int8_rows.available():
        return int8_bytes(out, inp)
    padded = math.ceil(out / int8_tiles.TILE) * int8_tiles.TILE
    return padded * math.ceil(inp / int8_tiles.INPUTS) * int8_tiles.INPUTS + padded * (INT8_SCALE_BYTES + 4)


def bf16_bytes(out: int, inp: int) -> int:
    """A bfloat16 [out, in] weight (engine/compression/bf16.py)."""
    return 2 * out * inp


def mxfp4_bytes(out: int, inp: int) -> int:
    """An MXFP4 [out, in] weight in its checkpoint form (engine/kernels/mxfp4_linear.py): 17 bytes per block of 32
    values along in (16 of codes, one of scale), 4.25 bits a weight."""
    return out * (inp // MXFP4_BLOCK) * (MXFP4_BLOCK // 2 + 1)


def expert_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of a mixture's routed experts' weights: each expert's gate, up and down."""
    h, fe = model.hidden_size, model.expert_ffn_size
    return [(fe, h), (fe, h), (h, fe)] * model.num_experts


def layer_bytes(model: ModelSpec, dtype_bytes: int, compressed: bool, weight_format: str = "int4",
                mxfp4_experts: bool = False) -> float:
    """W: one layer as stored and moved. Dense: params_per_layer * dtype_bytes; compressed: int4_bytes, int8_bytes
    or bf16_bytes (by `weight_format`) of each Linear weight plus the norms and biases, which stay dense. With
    `mxfp4_experts` (gpt-oss's experts kept in the checkpoint's MXFP4: engine/quantized/mxfp4_layer.py), the routed
    experts' weights are mxfp4_bytes whatever the format."""
    shapes = linear_shapes(model)
    coded = shapes[: len(shapes) - len(router_shapes(model))] if compressed else []
    packed = expert_shapes(model) if mxfp4_experts else []
    coded = list((Counter(coded) - Counter(packed)).elements())
    size = {"int8": int8_bytes, "bf16": bf16_bytes}.get(weight_format, int4_bytes)
    plain = model.params_per_layer - sum(o * i for o, i in coded + packed)
    return sum(size(o, i) for o, i in coded) + sum(mxfp4_bytes(o, i) for o, i in packed) + plain * dtype_bytes


def stored_layer_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy) -> float:
    """W of one layer in the form `policy` stores it (dense, or compressed in its weight format; MXFP4 experts in
    their checkpoint form where the run keeps them so: `keeps_packed`)."""
    return layer_bytes(model, dtype_bytes, policy.compress_weight, policy.weight_format,
                       keeps_packed(model, policy))


def fused_linear_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of a layer's Linear weights as stored, projections fused (engine/kernels/fuse.py): qkv, o, and
    gate_up and down of the MLP or of each expert and the shared expert (OPT: fc1, fc2)."""
    h, f = model.hidden_size, model.ffn_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    mlp = [(f, h), (h, f)] if model.family == "opt" else [(2 * f, h), (h, f)]
    if model.num_experts:
        fe, fs = model.expert_ffn_size, model.shared_expert_ffn_size
        mlp = [(2 * fe, h), (h, fe)] * model.num_experts + ([(2 * fs, h), (h, fs)] if fs else [])
    return [(q + 2 * kv, h), (h, q), *mlp]


def int4_kernel_layout_bytes(model: ModelSpec) -> int:
    """Bytes the int4 kernel's layout keeps beside the codes of one CPU-resident layer (engine.compression.int4.pack_int4):
    each fused Linear [out, in] with out padded to a multiple of 16, in int4_bytes' own format."""
    return sum(int4_bytes(-(-o // 16) * 16, i) for o, i in fused_linear_shapes(model))


def global_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy | None = None) -> float:
    """Embeddings (V * H), the head when untied (V * H), the final norm (H) and OPT's learned positions and
    projections; placed on `globals_tier`. Where `policy` keeps the head in int8 (`head_in_int8`), the head is
    its own int8_head_bytes(V, H) instead (beside the embeddings, tied or not)."""
    h, v = model.hidden_size, model.vocab_size
    int8_head = policy is not None and head_in_int8(policy, globals_tier(policy, model.num_layers))
    n = v * h * (1 if model.tie_word_embeddings or int8_head else 2) + h
    if model.family == "opt":
        proj = model.word_embed_proj_dim or h
        n += (model.max_position_embeddings + 2) * h + (2 * proj * h if proj != h else 0)
    return n * dtype_bytes + (int8_head_bytes(v, h) if int8_head else 0)


def kv_slot_bytes(model: ModelSpec, dtype_bytes: int, compressed: bool) -> float:
    """K and V of one token in one layer: 2 * KVH * D * dtype_bytes, or 2 * KVH * int4_row_bytes(D) in 4 bits."""
    per_head = int4_row_bytes(model.head_dim) if compressed else model.head_dim * dtype_bytes
    return 2 * model.num_kv_heads * per_head


def kv_row_bytes(model: ModelSpec, slots: int, dtype_bytes: int, compressed: bool) -> float:
    """The KV cache of one row: all `slots` slots of every layer are preallocated, L * slots * kv_slot_bytes."""
    return model.num_layers * slots * kv_slot_bytes(model, dtype_bytes, compressed)


def prefix_bytes(model: ModelSpec, shared: int, dtype_bytes: int) -> float:
    """A block's shared prefix: one uncompressed row of `shared` slots, kv_row_bytes(shared)."""
    return kv_row_bytes(model, shared, dtype_bytes, False)


def prefix_tier(policy: Policy) -> str:
    """Where a block's shared prefix lives, whole: on the gpu tier when it holds at least half of the KV cache,
    else in CPU memory (the disk tier's rows attend on the CPU)."""
    return "gpu" if policy.cache_gpu >= policy.cache_cpu + policy.cache_disk else "cpu"


def disk_kv_buffer_bytes(model: ModelSpec, slots: int, dtype_bytes: int) -> float:
    """CPU memory per row of a plain KV cache on the disk tier (engine/memory/disk_kv.py): the two buffers its
    K and V of one layer move through, 2 * slots * KVH * D * dtype_bytes (each buffer is rounded up to 4 KiB per
    GPU batch, which is not counted)."""
    return slots * kv_slot_bytes(model, dtype_bytes, False)


def act_row_bytes(model: ModelSpec, positions: int) -> float:
    """The hidden states of one row between layers: positions * H in ACT_DTYPE (float32)."""
    return positions * model.hidden_size * ACT_DTYPE.itemsize


def unpack_scratch_bytes(model: ModelSpec, policy: Policy) -> int:
    """The uint8 scratch a set of dense buffers unpacks 4-bit codes into (engine/compression/codecs.py `dense`):
    one byte per weight of the layer's largest (fused) Linear; none for the other formats."""
    return max(o * i for o, i in fused_linear_shapes(model)) if policy.weight_format == "int4" else 0


def dense_buffer_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy) -> float:
    """The two reused sets of buffers compressed layers are dequantized into (engine/compression/codecs.py): two
    dense layers, 2 * params_per_layer * dtype_bytes, and each set's unpacking scratch."""
    return 2 * (model.params_per_layer * dtype_bytes + unpack_scratch_bytes(model, policy))


def keeps_tiles(policy: Policy) -> bool:
    """Whether compressed layers resident in CPU memory compute in the project's kernel for their format at every
    row count, needing no dense copy (engine.kernels.native.qweight: 4-bit and int8 weights kept in the kernels'
    tiles alone): every layer computes on the CPU and the kernels are built. Layers read from disk still
    dequantize (`streamed_dense_bytes`)."""
    built = {"int4": int4_tiles.available, "int8": int8_rows.available}.get(policy.weight_format)
    return built is not None and built() and policy.prefill_device == "cpu" and policy.decode_device == "cpu"


def streamed_dense_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy) -> float:
    """CPU memory the layers read from disk need beside their staging where resident layers keep their tiles: the
    dense buffers they are dequantized into (elsewhere those buffers are counted for every compressed run). Where
    a mixture's experts stream, the routed experts of every layer share one set (a layer's experts are handed
    back before the next layer's are read), and the two layers' sets hold their trunks only."""
    if not (policy.compress_weight and keeps_tiles(policy)):
        return 0.0
    if not streams_experts(model, policy):
        return dense_buffer_bytes(model, dtype_bytes, policy)
    experts = model.num_experts * 3 * model.hidden_size * model.expert_ffn_size * dtype_bytes
    return dense_buffer_bytes(model, dtype_bytes, policy) - experts + unpack_scratch_bytes(model, policy)


def staged_bytes(layer: float) -> float:
    """Layers held while weights stream (from disk into CPU memory, or onto the GPU): STAGED_LAYERS * one layer."""
    return STAGED_LAYERS * layer


def disk_staged_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy, layer: float) -> float:
    """CPU memory the layers read from disk are held in, `layer` the widest one's stored bytes: `staged_bytes`,
    or, where a mixture's experts stream (engine/memory/expert_reads.py), the layer computing with every expert
    it may read and only the trunk of the one prefetched (its experts are read once routed, after the layer
    before it is handed back)."""
    if not streams_experts(model, policy):
        return staged_bytes(layer)
    return 2 * layer - model.num_experts * expert_bytes(model, dtype_bytes, policy)
