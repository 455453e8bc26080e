"""Peak memory per tier, as the engine allocates it (FlexGen's home + working memory, Appendix A.3).

Home memory is what the engine reserves on a tier and checks against its budget: the layers placed there, the
embeddings and head (on the tier of the device they compute on: `engine.memory.weight_store.globals_tier`), the
KV cache of a whole block (preallocated for all T slots, so prefill and decode hold the same), the activations of
a block, a shared prefix's K/V, and the disk layers staged on the CPU when any layer lives on disk. Each is a
per-unit figure of engine/memory/footprint.py, the one the engine checks its budgets with
(`engine.loop.schedule.BlockExecutor.block_bytes`), multiplied here by the placement fractions. Working memory
is what the engine does not account: the intermediates of one layer on one GPU batch, the dense buffers of
compressed weights, and the weights staged on the GPU. Every term is in bytes."""

from __future__ import annotations

from engine.kernels import int4_tiles
from engine.memory.footprint import (
    act_row_bytes,
    dense_buffer_bytes,
    disk_kv_buffer_bytes,
    disk_staged_bytes,
    global_bytes,
    int4_kernel_layout_bytes,
    keeps_tiles,
    kv_row_bytes,
    prefix_bytes,
    prefix_tier,
    staged_bytes,
    stored_layer_bytes,
    streamed_dense_bytes,
)
from engine.memory.weight_store import globals_tier, weight_placement
from engine.policy import Policy
from engine.spec import ModelSpec
from planner.workload import TIERS, Affine, Workload


def own_kv_bytes(model: ModelSpec, work: Workload, rows: int, compressed: bool) -> float:
    """The rows' own KV cache of a block: rows * kv_row_bytes(T), T = max prompt + gen (all slots preallocated)."""
    return rows * kv_row_bytes(model, work.total_len, work.dtype_bytes, compressed)


def kv_block_bytes(model: ModelSpec, work: Workload, rows: int, compressed: bool) -> float:
    """The KV cache of a block: own_kv_bytes plus the shared prefix's one uncompressed row (prefix_bytes)."""
    return own_kv_bytes(model, work, rows, compressed) + prefix_bytes(model, work.shared_len, work.dtype_bytes)


def act_block_bytes(model: ModelSpec, work: Workload, rows: int) -> float:
    """The activations of a block: rows * act_row_bytes(S_max), in float32 whatever the compute dtype."""
    return rows * act_row_bytes(model, work.max_prompt_len)


def disk_staging_bytes(model: ModelSpec, work: Workload, policy: Policy) -> float:
    """The layers read from disk held on the CPU (the one computing, the one prefetched): disk_staged_bytes(W),
    and the dense buffers they are dequantized into where resident layers need none (`streamed_dense_bytes`). Counted
    when any layer lives on disk."""
    W = stored_layer_bytes(model, work.dtype_bytes, policy)
    return (disk_staged_bytes(model, work.dtype_bytes, policy, W)
            + streamed_dense_bytes(model, work.dtype_bytes, policy))


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
    """Unaccounted scratch per compute device used in `phase`: intermediate_bytes, plus the dense layer buffers
    (`dense_buffer_bytes`) with compressed weights unless resident layers compute in their kernel's tiles
    (`keeps_tiles`: then only layers read from disk need them, counted with the disk staging), plus the stored
    layers staged on the GPU when it computes layers whose weights live elsewhere (`streams_to_gpu`)."""
    tokens = work.max_prompt_len if phase == "prefill" else 1
    out = dict.fromkeys(TIERS, 0.0)
    for device, count in layers_on(policy, phase, model.num_layers).items():
        if count == 0:
            continue
        out[device] += intermediate_bytes(model, policy.gbs, tokens, work.dtype_bytes)
        if policy.compress_weight and not keeps_tiles(policy):
            out[device] += dense_buffer_bytes(model, work.dtype_bytes, policy)
        if device == "gpu" and streams_to_gpu(policy, model.num_layers):
            out[device] += staged_bytes(stored_layer_bytes(model, work.dtype_bytes, policy))
    return out


def packs_int4(policy: Policy) -> bool:
    """Whether CPU-resident 4-bit layers may be kept in aten's int4 layout beside their codes: they compute on
    the CPU only (engine.kernels.native.pack_resident), which this model counts when no layer computes on the
    GPU, and the project's 4-bit kernel is not built (its tiles replace the codes instead of doubling them)."""
    return (policy.compress_weight and policy.weight_format == "int4" and not int4_tiles.available()
            and policy.prefill_device == "cpu" and policy.decode_device == "cpu")


def home_bytes(model: ModelSpec, work: Workload, policy: Policy, rows: int, charged_scratch: bool = False,
               placed: bool = False) -> dict[str, Affine]:
    """Home memory per tier, linear in the fractions (the disk staging term is separate: it is a step):
    L * W * weight_<tier> + KV * cache_<tier> + A * act_<tier> (KV: the rows' own cache), plus the int4 kernel's
    layout of CPU-resident 4-bit layers (`packs_int4`), plus the globals on their tier (the gpu when decode's
    last layer computes there), plus the two one-layer buffers a plain disk-tier cache moves through on the CPU:
    disk_kv_buffer_bytes * rows * cache_disk. A shared prefix lives whole on `prefix_tier`: with `placed` (the
    fractions are the policy's own, as the engine runs it) it is counted there; for the placement program, whose
    fractions are variables, it is counted on the gpu by cache_gpu and on the cpu by the rest (the same where
    the cache is on one side). With `charged_scratch` (a binding memory limit, `HardwareSpec.memory_limit_binds`)
    the disk tier's memory-mapped scratch, whose page cache the limit charges, counts on the CPU as well:
    + A * act_disk, and + KV * cache_disk for a 4-bit cache (a plain one bypasses the page cache)."""
    W = stored_layer_bytes(model, work.dtype_bytes, policy)
    kv = own_kv_bytes(model, work, rows, policy.compress_cache)
    act = act_block_bytes(model, work, rows)
    out = {}
    for tier in TIERS:
        out[tier] = (Affine.frac(f"weight_{tier}", model.num_layers * W) + Affine.frac(f"cache_{tier}", kv)
                     + Affine.frac(f"act_{tier}", act))
    where = globals_tier(policy, model.num_layers)
    out[where] = out[where] + global_bytes(model, work.dtype_bytes, policy)
    prefix = prefix_bytes(model, work.shared_len, work.dtype_bytes)
    if placed:
        out[prefix_tier(policy)] = out[prefix_tier(policy)] + prefix
    else:
        out["gpu"] = out["gpu"] + Affine.frac("cache_gpu", prefix)
        out["cpu"] = out["cpu"] + Affine.of(("cache_cpu", "cache_disk"), prefix)
    if packs_int4(policy):  # counted as if the kernel won at some row count (the engine measures whether it does)
        out["cpu"] = out["cpu"] + Affine.frac("weight_cpu", model.num_layers * int4_kernel_layout_bytes(model))
    if not policy.compress_cache:
        buffers = rows * disk_kv_buffer_bytes(model, work.total_len, work.dtype_bytes)
        out["cpu"] = out["cpu"] + Affine.frac("cache_disk", buffers)
    if charged_scratch:
        mapped_cache = kv if policy.compress_cache else 0.0
        out["cpu"] = out["cpu"] + Affine.frac("cache_disk", mapped_cache) + Affine.frac("act_disk", act)
    return out


def peak_bytes(model: ModelSpec, work: Workload, policy: Policy, rows: int, phase: str,
               charged_scratch: bool = False, placed: bool = False) -> dict[str, Affine]:
    """Peak per tier in `phase`: home_bytes + working_bytes (without the disk staging step)."""
    home = home_bytes(model, work, policy, rows, charged_scratch, placed)
    scratch = working_bytes(model, work, policy, phase)
    return {tier: home[tier] + scratch[tier] for tier in TIERS}
