"""Peak memory per tier, as the engine allocates it (FlexGen's home + working memory, Appendix A.3).

Home memory is what the engine reserves on a tier and checks against its budget: the layers placed there, the
embeddings and head (on the tier of the device they compute on: `engine.memory.weight_store.globals_tier`), the KV cache of a whole block (preallocated for all T slots, so prefill
and decode hold the same), the activations of a block, and two disk layers staged on the CPU when any layer lives
on disk (`engine.loop.schedule.BlockExecutor.block_bytes`, `engine.memory.weight_store.WeightStore`). Working memory is what
the engine does not account: the intermediates of one layer on one GPU batch, the dense buffers of compressed
weights, and the weights staged on the GPU. Every term is in bytes."""

from __future__ import annotations

import math

from engine.kernels import int4_tiles
from engine.memory.weight_store import globals_tier, head_in_int8, weight_placement
from engine.policy import Policy
from engine.spec import ModelSpec
from planner.workload import TIERS, Affine, Workload

GROUP = 64  # 4-bit group size (engine.compression.int4.DEFAULT_CONFIG)
GROUP_PARAM_BYTES = 4  # float16 min and scale per group


def linear_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of each Linear weight of one layer: q, k, v, o and the MLP (gate, up, down or fc1, fc2)."""
    h, f = model.hidden_size, model.ffn_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    mlp = [(f, h), (h, f)] if model.family == "opt" else [(f, h), (f, h), (h, f)]
    return [(q, h), (kv, h), (kv, h), (h, q), *mlp]


def linear_params(model: ModelSpec) -> int:
    """P_lin = sum of out * in over one layer's Linear weights (elements): the GEMM work per token is 2 P_lin."""
    return sum(o * i for o, i in linear_shapes(model))


def int4_bytes(out: int, inp: int) -> int:
    """Bytes of a 4-bit [out, in] weight grouped along in: out * ceil(in / 64) * (64 / 2 + 4)."""
    return out * math.ceil(inp / GROUP) * (GROUP // 2 + GROUP_PARAM_BYTES)


def int8_bytes(out: int, inp: int) -> int:
    """Bytes of a row-wise 8-bit [out, in] weight (engine/compression/int8.py): out * in codes + out float32 scales."""
    return out * inp + out * 4


def bf16_bytes(out: int, inp: int) -> int:
    """Bytes of a bfloat16 [out, in] weight (engine/compression/bf16.py)."""
    return 2 * out * inp


def layer_bytes(model: ModelSpec, dtype_bytes: int, compressed: bool, weight_format: str = "int4") -> float:
    """W: one layer as stored and moved. Dense: params_per_layer * dtype_bytes; compressed: int4_bytes, int8_bytes
    or bf16_bytes (by `weight_format`) of each Linear weight plus the norms and biases, which stay dense."""
    dense = model.params_per_layer * dtype_bytes
    if not compressed:
        return dense
    other = model.params_per_layer - linear_params(model)
    size = {"int8": int8_bytes, "bf16": bf16_bytes}.get(weight_format, int4_bytes)
    return sum(size(o, i) for o, i in linear_shapes(model)) + other * dtype_bytes


def int4_kernel_layout_bytes(model: ModelSpec) -> int:
    """Bytes the int4 kernel's layout keeps beside the codes of one CPU-resident layer (engine.compression.int4.pack_int4):
    each fused Linear [out, in] with out padded to a multiple of 16, in int4_bytes' own format."""
    h, f = model.hidden_size, model.ffn_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    mlp = [(f, h), (h, f)] if model.family == "opt" else [(2 * f, h), (h, f)]
    return sum(int4_bytes(-(-o // 16) * 16, i) for o, i in [(q + 2 * kv, h), (h, q), *mlp])


def stored_layer_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy) -> float:
    """W of one layer in the form `policy` stores it (dense, or compressed in its weight format)."""
    return layer_bytes(model, dtype_bytes, policy.compress_weight, policy.weight_format)


def global_bytes(model: ModelSpec, dtype_bytes: int, policy: Policy | None = None) -> float:
    """Embeddings (V * H), the head when untied (V * H), the final norm (H) and OPT's learned positions and
    projections; placed on `globals_tier`. Where `policy` keeps the head in int8 (`head_in_int8`), the head is
    its own V * H int8 codes and V float32 scales instead (beside the embeddings, tied or not)."""
    h, v = model.hidden_size, model.vocab_size
    int8_head = policy is not None and head_in_int8(policy, globals_tier(policy, model.num_layers))
    n = v * h * (1 if model.tie_word_embeddings or int8_head else 2) + h
    if model.family == "opt":
        proj = model.word_embed_proj_dim or h
        n += (model.max_position_embeddings + 2) * h + (2 * proj * h if proj != h else 0)
    return n * dtype_bytes + (v * h + 4 * v if int8_head else 0)


def kv_slot_bytes(model: ModelSpec, dtype_bytes: int, compressed: bool) -> float:
    """K and V of one token in one layer: 2 * KVH * D * dtype_bytes, or 2 * KVH * ceil(D / 64) * 36 in 4 bits."""
    per_head = (math.ceil(model.head_dim / GROUP) * (GROUP // 2 + GROUP_PARAM_BYTES) if compressed
                else model.head_dim * dtype_bytes)
    return 2 * model.num_kv_heads * per_head


def kv_block_bytes(model: ModelSpec, work: Workload, rows: int, compressed: bool) -> float:
    """The KV cache of a block: rows * T * L * kv_slot_bytes, T = max prompt + gen (all slots preallocated), plus
    the shared prefix's one uncompressed row: shared_len * L * kv_slot_bytes."""
    shared = work.shared_len * model.num_layers * kv_slot_bytes(model, work.dtype_bytes, False)
    return rows * work.total_len * model.num_layers * kv_slot_bytes(model, work.dtype_bytes, compressed) + shared


def act_block_bytes(model: ModelSpec, work: Workload, rows: int) -> float:
    """The activations of a block: rows * S_max * H * dtype_bytes."""
    return rows * work.max_prompt_len * model.hidden_size * work.dtype_bytes


def disk_staging_bytes(model: ModelSpec, work: Workload, policy: Policy) -> float:
    """Two layers read from disk held on the CPU (the one computing, the one prefetched): 2 * W. Counted when
    any layer lives on disk."""
    return 2 * stored_layer_bytes(model, work.dtype_bytes, policy)


def intermediate_bytes(model: ModelSpec, gbs: int, tokens: int, dtype_bytes: int) -> float:
    """Scratch of one layer on one GPU batch of `gbs` rows x `tokens` tokens: the q, k, v, attention output and
    MLP tensors, gbs * tokens * (2 q + 2 kv + 2 H + 3 F) * dtype_bytes, plus the float32 attention scores
    gbs * NH * tokens^2 * 4 in prefill."""
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    per_token = 2 * q + 2 * kv + 2 * model.hidden_size + 3 * model.ffn_size
    scores = gbs * model.num_heads * tokens * tokens * 4 if tokens > 1 else 0
    return gbs * tokens * per_token * dtype_bytes + scores


def layers_on(policy: Policy, phase: str, num_layers: int) -> dict[str, int]:
    """How many layers compute on each device in `phase`: split runs layers below the split layer on the CPU."""
    device = getattr(policy, f"{phase}_device")
    if device == "split":
        k = min(getattr(policy, f"{phase}_split_layer"), num_layers)
        return {"cpu": k, "gpu": num_layers - k}
    return {"cpu": num_layers if device == "cpu" else 0, "gpu": num_layers if device == "gpu" else 0}


def streams_to_gpu(policy: Policy, num_layers: int) -> bool:
    """Whether some layer computes on the GPU (in either phase) with its weights away from it, so that two layers
    are staged there (engine.memory.weight_store); a split with its GPU layers resident stages none."""
    placement = weight_placement(policy, num_layers)
    return any(placement[j] != "gpu" and (policy.layer_on_gpu("prefill", j) or policy.layer_on_gpu("decode", j))
               for j in range(num_layers))


def working_bytes(model: ModelSpec, work: Workload, policy: Policy, phase: str) -> dict[str, float]:
    """Unaccounted scratch per compute device used in `phase`: intermediate_bytes, plus 2 dense layer buffers
    (2 * params_per_layer * dtype_bytes) with compressed weights, plus 2 stored layers staged on the GPU when it
    computes layers whose weights live elsewhere (`streams_to_gpu`)."""
    tokens = work.max_prompt_len if phase == "prefill" else 1
    out = dict.fromkeys(TIERS, 0.0)
    for device, count in layers_on(policy, phase, model.num_layers).items():
        if count == 0:
            continue
        out[device] += intermediate_bytes(model, policy.gbs, tokens, work.dtype_bytes)
        if policy.compress_weight:
            out[device] += 2 * model.params_per_layer * work.dtype_bytes
        if device == "gpu" and streams_to_gpu(policy, model.num_layers):
            out[device] += 2 * stored_layer_bytes(model, work.dtype_bytes, policy)
    return out


def packs_int4(policy: Policy) -> bool:
    """Whether CPU-resident 4-bit layers may be kept in aten's int4 layout beside their codes: they compute on
    the CPU only (engine.kernels.native.pack_resident), which this model counts when no layer computes on the
    GPU, and the project's 4-bit kernel is not built (its tiles replace the codes instead of doubling them)."""
    return (policy.compress_weight and policy.weight_format == "int4" and not int4_tiles.available()
            and policy.prefill_device == "cpu" and policy.decode_device == "cpu")


def home_bytes(model: ModelSpec, work: Workload, policy: Policy, rows: int,
               charged_scratch: bool = False) -> dict[str, Affine]:
    """Home memory per tier, linear in the fractions (the disk staging term is separate: it is a step):
    L * W * weight_<tier> + KV * cache_<tier> + A * act_<tier>, plus the int4 kernel's layout of CPU-resident 4-bit layers (`packs_int4`), plus the globals on their tier (the gpu when
    decode's last layer computes there), plus the two one-layer buffers a plain disk-tier cache moves through
    on the CPU (engine/memory/disk_kv.py): 2 * KV / L * cache_disk. With `charged_scratch` (a binding memory limit,
    `HardwareSpec.memory_limit_binds`) the disk tier's memory-mapped scratch, whose page cache the limit charges,
    counts on the CPU as well: + A * act_disk, and + KV * cache_disk for a 4-bit cache (a plain one bypasses the
    page cache)."""
    W = stored_layer_bytes(model, work.dtype_bytes, policy)
    kv = kv_block_bytes(model, work, rows, policy.compress_cache)
    act = act_block_bytes(model, work, rows)
    out = {}
    for tier in TIERS:
        out[tier] = (Affine.frac(f"weight_{tier}", model.num_layers * W) + Affine.frac(f"cache_{tier}", kv)
                     + Affine.frac(f"act_{tier}", act))
    where = globals_tier(policy, model.num_layers)
    out[where] = out[where] + global_bytes(model, work.dtype_bytes, policy)
    if packs_int4(policy):  # counted as if the kernel won at some row count (the engine measures whether it does)
        out["cpu"] = out["cpu"] + Affine.frac("weight_cpu", model.num_layers * int4_kernel_layout_bytes(model))
    if not policy.compress_cache:
        out["cpu"] = out["cpu"] + Affine.frac("cache_disk", 2 * kv / model.num_layers)
    if charged_scratch:
        mapped_cache = kv if policy.compress_cache else 0.0
        out["cpu"] = out["cpu"] + Affine.frac("cache_disk", mapped_cache) + Affine.frac("act_disk", act)
    return out


def peak_bytes(model: ModelSpec, work: Workload, policy: Policy, rows: int, phase: str,
               charged_scratch: bool = False) -> dict[str, Affine]:
    """Peak per tier in `phase`: home_bytes + working_bytes (without the disk staging step)."""
    home, scratch = home_bytes(model, work, policy, rows, charged_scratch), working_bytes(model, work, policy, phase)
    return {tier: home[tier] + scratch[tier] for tier in TIERS}
