"""FlexGen's per-layer cost model, with FlexInfer's per-phase compute choice, for the engine's block schedule.

For one layer and one step of a block (num_gb GPU batches of gbs rows), each transfer is priced on the channel
it uses (h2d, d2h, disk read, disk write) and compute on its device. As in FlexGen, the layer's time is the max
over what overlaps. In this engine two things overlap: the prefetch thread, which brings the next layer's weights
(disk read, then the link, then dequantization), and the main thread, which computes and moves the KV cache and
activations itself; on a CUDA GPU, prefill's K/V stores to CPU memory go on a side stream (the store chain). So

    T_layer = max(prefetch_s, main_s, store_s),  T_block = L * T_pre + (n - 1) * L * T_gen + n * head_s

with each phase's layers split between the CPU and the GPU by its compute choice (FlexInfer: CPU-only, GPU with
offloading, or a static split). Two facts of this engine shape the chains: a disk layer is memory-mapped, so plain
weights computed on the CPU are read by the main thread's GEMMs; and the prefetch thread's CPU work competes with
CPU compute for the cores (`cpu_background_overlap`, measured). Every term is linear in the placement fractions
(`Affine`), so the search prices a `Policy` and builds its program from the same functions; the one exception,
the fixed cost of a cache split over tiers, is a step that only the exact prediction counts. Units: bytes,
seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kernels.gemm_choice import EVERY, max_rows
from engine.kernels.rates import MIN_PACK_PARAMS, ROWS
from engine.memory.disk_read import reads_direct
from engine.memory.expert_reads import streams_experts
from engine.memory.footprint import (
    active_linear_params,
    kv_slot_bytes,
    linear_params,
    linear_shapes,
    routed_layer_bytes,
    stored_layer_bytes,
)
from engine.memory.weight_store import globals_tier, head_in_int8
from engine.policy import Policy
from engine.spec import ModelSpec
from planner.hardware import HardwareSpec
from planner.memory_model import layers_on
from planner.workload import TIERS, Affine, Workload

CHANNELS = ("h2d", "d2h", "disk_read", "disk_write", "compute")
ELEMENTWISE_PASSES_H = 16  # norms, rotary, residuals: about 16 passes over H per token (read + write)
ELEMENTWISE_PASSES_F = 4  # activation and gating over the FFN width


@dataclass(frozen=True)
class Block:
    """One block priced under one policy: `rows` prompts in GPU batches of at most gbs rows."""

    model: ModelSpec
    hw: HardwareSpec
    work: Workload
    policy: Policy
    rows: int
    direct_reads: bool | None = None  # how disk-tier weights are read; None: as the policy's own disk tier decides
    batches: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        gbs = self.policy.gbs
        object.__setattr__(self, "batches", tuple(min(gbs, self.rows - i) for i in range(0, self.rows, gbs)))

    @property
    def elem(self) -> int:
        return self.work.dtype_bytes

    @property
    def stored_layer_bytes(self) -> float:
        return stored_layer_bytes(self.model, self.elem, self.policy)


def tokens(work: Workload, phase: str) -> int:
    """Tokens per row that a step pushes through a layer: s in prefill, 1 in decode."""
    return work.prompt_len if phase == "prefill" else 1


def decode_kv_len(work: Workload, refill: bool = False) -> float:
    """Average cached slots a decode step attends over (FlexGen's linearization, s + n / 2, for the steps a block
    runs): without refill a block's rows share their start, and it runs block_gen_len steps: s + n_block / 2. With
    refill the rows share one cache cursor (engine/loop/refill.py) and attention walks every slot from the oldest live
    row's first: the cursor stays the longest prompt past it (rows enter longest first, each ending at the cursor)
    and a row lives up to gen_len steps: max_prompt_len + gen_len / 2."""
    if refill:
        return work.max_prompt_len + work.gen_len / 2
    return work.prompt_len + work.block_gen_len / 2


def memory_room(hw: HardwareSpec) -> float:
    """The memory the planning process may still take (the machine's, for a spec of another machine)."""
    return hw.memory_room_bytes if hw.memory_room_bytes is not None else hw.cpu.memory_bytes


def disk_reads_direct(blk: Block) -> bool:
    """Whether the engine reads the disk-tier weights with O_DIRECT (`engine.memory.disk_read.reads_direct`: more than
    half the room), as the block assumes or as its policy's weight_disk * L * W decides."""
    if blk.direct_reads is not None:
        return blk.direct_reads
    disk = blk.policy.weight_disk * blk.model.num_layers * blk.stored_layer_bytes
    return disk > 0 and reads_direct(disk, memory_room(blk.hw))


def disk_is_warm(blk: Block) -> bool:
    """Disk-tier files are read at the page-cache rate unless the weights are read with O_DIRECT: buffered
    weights fit half the room, so the page cache keeps them after the first pass; the disk tier's scratch (KV
    cache, activations) is counted in memory under a binding memory limit (memory_model), and is mapped pages
    the kernel writes back and keeps as it can otherwise."""
    return not disk_reads_direct(blk)


def channel_rates(blk: Block) -> dict[str, float]:
    """Bytes/s of each transfer channel; a missing link (no GPU) is never used, since its fractions are 0."""
    hw, warm = blk.hw, disk_is_warm(blk)
    return {"h2d": hw.h2d_bytes_per_s or float("inf"), "d2h": hw.d2h_bytes_per_s or float("inf"),
            "disk_read": hw.page_cache_bytes_per_s if warm else hw.disk_read_bytes_per_s,
            "disk_write": hw.page_cache_bytes_per_s if warm else hw.disk_write_bytes_per_s}


def route(src: str, dst: str) -> tuple[str, ...]:
    """Channels a move from tier/device `src` to `dst` crosses: disk is reached through the CPU."""
    hops = {("cpu", "gpu"): ("h2d",), ("gpu", "cpu"): ("d2h",), ("disk", "cpu"): ("disk_read",),
            ("disk", "gpu"): ("disk_read", "h2d"), ("cpu", "disk"): ("disk_write",),
            ("gpu", "disk"): ("d2h", "disk_write")}
    return () if src == dst else hops[(src, dst)]


def priced(moves: list[tuple[Affine, str, str]], rates: dict[str, float]) -> dict[str, Affine]:
    """Seconds per channel of a list of (bytes, src, dst) moves: bytes / rate on each channel crossed."""
    out = {c: Affine() for c in CHANNELS}
    for nbytes, src, dst in moves:
        for channel in route(src, dst):
            out[channel] = out[channel] + nbytes / rates[channel]
    return out


def weight_moves(blk: Block, phase: str, device: str) -> list[tuple[Affine, str, str]]:
    """The layer's weights brought to its compute device, once per step for the whole block:
    W * weight_<tier> bytes from each tier; from disk, a mixture whose experts stream reads only those the step's
    tokens choose (`routed_layer_bytes`)."""
    W = blk.stored_layer_bytes
    routed = routed_layer_bytes(blk.model, blk.elem, blk.policy, blk.rows * tokens(blk.work, phase))
    return [(Affine.frac(f"weight_{tier}", routed if tier == "disk" else W), tier, device) for tier in TIERS]


def new_kv_bytes(blk: Block, phase: str) -> float:
    """K and V a step writes per layer: rows * tokens * kv_slot_bytes."""
    return blk.rows * tokens(blk.work, phase) * kv_slot_bytes(blk.model, blk.elem, blk.policy.compress_cache)


def decode_kv_bytes(blk: Block) -> float:
    """R: the cache a decode step reads per layer: rows * decode_kv_len * kv_slot_bytes."""
    return blk.rows * decode_kv_len(blk.work, blk.policy.refill) * kv_slot_bytes(blk.model, blk.elem, blk.policy.compress_cache)


def attention_io_bytes(blk: Block) -> float:
    """What crosses for delegated decode attention, per layer: q out and the output back,
    rows * 2 * NH * D * dtype_bytes (the new K/V are counted with the cache stores)."""
    return blk.rows * 2 * blk.model.num_heads * blk.model.head_dim * blk.elem


def kv_disk_scale(blk: Block, channel: str) -> float:
    """A plain KV cache on the disk tier is read and written with direct I/O (engine/memory/disk_kv.py), at the disk's
    cold rate whatever the page cache does for the weights, so its bytes on the shared disk channel count
    rate(channel) / cold rate times (1 when the channel is cold). A 4-bit cache there is mapped: 1."""
    if blk.policy.compress_cache:
        return 1.0
    cold = blk.hw.disk_read_bytes_per_s if channel == "disk_read" else blk.hw.disk_write_bytes_per_s
    return channel_rates(blk)[channel] / cold


def kv_moves(blk: Block, phase: str, device: str) -> list[tuple[Affine, str, str]]:
    """Cache traffic of a layer on the main thread: this step's K/V stored to each tier; in decode, either the
    cache fetched to the compute device, or (cpu_attention) only q and the output crossing to where each part
    of the cache lives, plus disk parts read into the CPU. FlexInfer's KV hand-off, when prefill computes away
    from the cache's tier, is the prefill store."""
    scale = {t: kv_disk_scale(blk, "disk_write") if t == "disk" else 1.0 for t in TIERS}
    moves = [(Affine.frac(f"cache_{tier}", new_kv_bytes(blk, phase) * scale[tier]), device, tier) for tier in TIERS]
    if phase == "prefill":
        return moves
    R, read_scale = decode_kv_bytes(blk), kv_disk_scale(blk, "disk_read")
    if not blk.policy.cpu_attention:
        return moves + [(Affine.frac(f"cache_{tier}", R * (read_scale if tier == "disk" else 1.0)), tier, device)
                        for tier in TIERS]
    half_io = attention_io_bytes(blk) / 2
    moves.append((Affine.frac("cache_disk", R * read_scale), "disk", "cpu"))
    for tier in TIERS:
        home = "cpu" if tier == "disk" else tier
        share = Affine.frac(f"cache_{tier}", half_io)
        moves += [(share, device, home), (share, home, device)]  # q out, the output back
    return moves


def act_moves(blk: Block, phase: str, device: str) -> list[tuple[Affine, str, str]]:
    """Activations loaded from their tiers and stored back, per layer: A = rows * tokens * H * dtype_bytes
    each way, times act_<tier>. None with one GPU batch per block: the engine hands its hidden states straight
    to the next layer (they cross only where the compute device changes, not priced)."""
    if len(blk.batches) == 1:
        return []
    A = blk.rows * tokens(blk.work, phase) * blk.model.hidden_size * blk.elem
    loads = [(Affine.frac(f"act_{tier}", A), tier, device) for tier in TIERS]
    return loads + [(Affine.frac(f"act_{tier}", A), device, tier) for tier in TIERS]


def weights_stay_cached(blk: Block, device: str) -> bool:
    """All layers' dense weights fit the device's last-level cache, so GEMMs never stream them from memory."""
    return blk.model.num_layers * blk.model.params_per_layer * blk.elem <= blk.hw.device(device).cache_bytes


def gemm_s(blk: Block, phase: str, device: str) -> float:
    """Linear layers: sum over GPU batches of 2 * b * t * P_lin / rate (P_lin: the parameters a token computes
    with, a mixture's chosen experts only), the rate being the compressed kernel's
    at b * t rows where it computes the batch (`kernel_batches`), else matmul_rate(b * t rows, width H), at the
    cache-hot rate when the weights stay cached."""
    spec, t, p_lin = blk.hw.device(device), tokens(blk.work, phase), active_linear_params(blk.model)
    width, hot = blk.model.hidden_size, weights_stay_cached(blk, device)
    kernel = kernel_batches(blk, phase, device)
    return sum(2 * b * t * p_lin / (spec.kernel_flop_per_s(blk.policy.weight_format, b * t, width) if k else
                                    spec.matmul_flop_per_s(b * t, width, hot, blk.work.dtype))
               for b, k in zip(blk.batches, kernel))


def reordered_share(model: ModelSpec) -> float:
    """The share of a layer's Linear parameters in weights large enough for the engine to consider reordering
    them for oneDNN (engine/kernels/rates.py: packs_dense), with q, k, v and (Llama) gate, up fused as the engine
    computes them."""
    shapes = linear_shapes(model)
    fused = [(sum(o for o, _ in shapes[:3]), shapes[0][1]), shapes[3]]
    fused += [(2 * shapes[4][0], shapes[4][1]), shapes[6]] if len(shapes) == 7 else shapes[4:]
    return sum(o * i for o, i in fused if o * i >= MIN_PACK_PARAMS) / linear_params(model)


def reorder_s(blk: Block, phase: str, device: str) -> Affine:
    """The GEMM seconds saved where dense weights kept in CPU memory are reordered for oneDNN (negative), as the
    engine does for the layers of a run that computes on the CPU only, uncompressed: per GPU batch, the plain
    GEMM's seconds times (1 - 1 / gain at its rows), over the share of parameters reordered and the fraction
    of layers kept in CPU memory. The engine reorders by a rule (engine/kernels/gemm_choice.py: every weight large
    enough, where the CPU reorders the dtype); the profile's measured gains at the model's width price it (a gain
    below 1 costs). Zero without the profile's gains for the workload's dtype."""
    p, spec = blk.policy, blk.hw.device(device)
    if device != "cpu" or p.compress_weight or p.prefill_device != "cpu" or p.decode_device != "cpu":
        return Affine()
    width, dtype = blk.model.hidden_size, blk.work.dtype
    if spec.reorder_gain(dtype, ROWS[0], width) is None:  # measured only where the CPU reorders the dtype
        return Affine()
    t, p_lin, hot = tokens(blk.work, phase), active_linear_params(blk.model), weights_stay_cached(blk, device)
    saved = sum(2 * b * t * p_lin / spec.matmul_flop_per_s(b * t, width, hot, dtype)
                * (1 - 1 / spec.reorder_gain(dtype, b * t, width)) for b in blk.batches)
    return Affine.frac("weight_cpu", -saved * reordered_share(blk.model))


def kernel_batches(blk: Block, phase: str, device: str) -> list[bool]:
    """Per GPU batch: whether compressed weights are computed on by their kernel, as the engine chooses (on the
    CPU, up to the row limit of engine/kernels/gemm_choice.py's rule for this machine class, format and dtype;
    int4 only for layers kept in CPU memory, which are packed for it at load). All False without compressed
    weights or without the kernel's rates in the profile (nothing to price it with)."""
    spec, p, t = blk.hw.device(device), blk.policy, tokens(blk.work, phase)
    resident = p.weight_format == "int8" or p.weight_cpu == 1.0  # int4 is packed for its kernel once, at load
    if not p.compress_weight or device != "cpu" or not resident or p.weight_format not in spec.kernel_gflop_per_s:
        return [False] * len(blk.batches)
    h = blk.model.hidden_size
    limit = max_rows(p.weight_format, h, h, blk.work.dtype)
    return [b * t <= limit or limit >= EVERY for b in blk.batches]


def prefill_attention_s(blk: Block, device: str) -> float:
    """Prefill attention over the new keys (masked, so all s^2 pairs) and the shared prefix's p keys: sum over
    batches of 4 * b * NH * D * s * (s + p) / prefill_attention_rate(s)."""
    spec, s, m = blk.hw.device(device), blk.work.prompt_len, blk.model
    rate = spec.prefill_attention_flop_per_s(s, m.head_dim)
    return sum(4 * b * m.num_heads * m.head_dim * s * (s + blk.work.shared_len) / rate for b in blk.batches)


def decode_attention_s(blk: Block, device: str) -> Affine:
    """Decode attention, memory-bound: R * share / attention_rate of the device that runs it (the rate of the
    cache's kind: 4-bit, or plain in the workload's dtype). With cpu_attention each part runs where it lives (disk
    parts on the CPU), else all on the compute device."""
    R, kind = decode_kv_bytes(blk), (blk.policy.compress_cache, blk.elem)
    if not blk.policy.cpu_attention:
        return Affine(const=R / blk.hw.device(device).attention_bytes_per_s(*kind))
    cpu_rate = blk.hw.cpu.attention_bytes_per_s(*kind)
    out = Affine.of(("cache_cpu", "cache_disk"), R / cpu_rate)
    if blk.hw.gpu is not None:
        out = out + Affine.frac("cache_gpu", R / blk.hw.gpu.attention_bytes_per_s(*kind))
    return out


def elementwise_s(blk: Block, phase: str, device: str) -> float:
    """Norms, rotary, residuals and the MLP activation: rows * t * (16 H + 4 F) * dtype_bytes /
    elementwise_bytes_per_s (the profiler times the engine's own ops and states the rate in this unit)."""
    m = blk.model
    per_token = ELEMENTWISE_PASSES_H * m.hidden_size + ELEMENTWISE_PASSES_F * m.ffn_size
    return blk.rows * tokens(blk.work, phase) * per_token * blk.elem / blk.hw.device(device).elementwise_bytes_per_s


def spans_tiers(policy, kind: str) -> bool:
    return sum(getattr(policy, f"{kind}_{t}") > 0 for t in TIERS) > 1


def layer_calls_s(blk: Block, device: str) -> Affine:
    """Fixed costs of the layer calls: GPU batches * (layer_call_s, + cache_codec_call_s with a 4-bit cache,
    + split_call_s when the cache or the activations span tiers), + disk_layer_call_s * weight_disk per step
    (opening a disk layer). The split term is a step in the fractions: the exact prediction counts it, the
    search's linear program does not."""
    spec, p = blk.hw.device(device), blk.policy
    per_call = spec.layer_call_s + (spec.cache_codec_call_s if p.compress_cache else 0.0)
    per_call += spec.split_call_s if spans_tiers(p, "cache") or spans_tiers(p, "act") else 0.0
    return Affine.frac("weight_disk", spec.disk_layer_call_s) + len(blk.batches) * per_call


def layer_dequant_s(blk: Block, device: str) -> float:
    """One layer's compressed weights decompressed on the compute device:
    params_per_layer * dtype_bytes / dequant_bytes_per_s + dequant_call_s (0 without compression). bfloat16
    weights at rest are widened by a copy, an elementwise op: the same bytes at elementwise_bytes_per_s."""
    if not blk.policy.compress_weight:
        return 0.0
    spec = blk.hw.device(device)
    if blk.policy.weight_format == "bf16":
        return blk.model.params_per_layer * blk.elem / spec.elementwise_bytes_per_s
    return blk.model.params_per_layer * blk.elem / spec.dequant_bytes_per_s + spec.dequant_call_s


def dequant_s(blk: Block, phase: str, device: str) -> float:
    """Dequantization per layer per step: once, unless the compressed kernel computes every GPU batch."""
    return 0.0 if all(kernel_batches(blk, phase, device)) else layer_dequant_s(blk, device)


def compute_s(blk: Block, phase: str, device: str) -> Affine:
    """Compute on the main thread: GEMMs (less what reordered weights save) + attention + elementwise + layer
    calls."""
    fixed = gemm_s(blk, phase, device) + elementwise_s(blk, phase, device)
    if phase == "prefill":
        return reorder_s(blk, phase, device) + layer_calls_s(blk, device) + fixed + prefill_attention_s(blk, device)
    return reorder_s(blk, phase, device) + decode_attention_s(blk, device) + layer_calls_s(blk, device) + fixed


def background_cpu_s(blk: Block, phase: str, device: str) -> Affine:
    """The prefetch thread's CPU work that does not hide behind CPU compute on the CPU (4-bit weights, or disk
    layers it reads): (1 - overlap) * (page faults W * weight_disk / page_cache_bytes_per_s, none when read with
    O_DIRECT, + dequantization); more than the work itself where the threads oversubscribe the cores
    (overlap < 0). Zero otherwise."""
    if device != "cpu" or lazy_disk_weights(blk, device):
        return Affine()
    copy = Affine() if disk_reads_direct(blk) else Affine.frac("weight_disk", blk.stored_layer_bytes
                                                                / blk.hw.page_cache_bytes_per_s)
    return (copy + dequant_s(blk, phase, "cpu")) * (1.0 - blk.hw.cpu_background_overlap)


def lazy_disk_weights(blk: Block, device: str) -> bool:
    """Disk layers read through the page cache are memory-mapped: their pages are read when first touched. For
    plain weights computed on the CPU that is the main thread's GEMM; otherwise the prefetch thread touches them
    (moving or dequantizing). Layers read with O_DIRECT, and mixture layers read by expert, are read by the
    reader threads."""
    return (device == "cpu" and not blk.policy.compress_weight and not disk_reads_direct(blk)
            and not streams_experts(blk.model, blk.policy))


def layer_chains(blk: Block, phase: str, device: str) -> dict[str, dict[str, Affine]]:
    """Per layer per step, seconds by channel of the three chains that overlap: the prefetch chain (weights),
    the main chain (compute, activations, the cache) and the store chain: a prefill computed on the GPU stores
    its new K/V to CPU memory on a side stream while the GPU computes on (nothing otherwise)."""
    rates, weights = channel_rates(blk), weight_moves(blk, phase, device)
    lazy = [m for m in weights if m[1] == "disk"] if lazy_disk_weights(blk, device) else []
    prefetch = priced([m for m in weights if not any(m is x for x in lazy)], rates)
    prefetch["compute"] = Affine(const=dequant_s(blk, phase, device))
    kv = kv_moves(blk, phase, device)
    side = [m for m in kv if m[2] == "cpu"] if phase == "prefill" and device == "gpu" else []
    main = priced(lazy + [m for m in kv if not any(m is x for x in side)] + act_moves(blk, phase, device), rates)
    main["compute"] = compute_s(blk, phase, device) + background_cpu_s(blk, phase, device)
    return {"prefetch": prefetch, "main": main, "store": priced(side, rates)}


def layer_time_terms(blk: Block, phase: str, device: str) -> list[Affine]:
    """The terms whose max is a layer's time: the prefetch chain and the main chain (each a sum)."""
    return [sum(chain.values(), Affine()) for chain in layer_chains(blk, phase, device).values()]


def head_s(blk: Block, positions: int = 1) -> float:
    """Per step, on the device the embeddings and head live on (`globals_tier`): embedding, LM head at `positions`
    positions per row (the last one; a scoring prefill's every scored one, Workload.scored_len), per GPU batch of b
    rows: 2 * V * H * r / matmul_rate(r) at r = b * positions rows (the int8 kernel's rate for an int8 head), plus,
    from a GPU, the float32 logits r * V * 4 bytes over d2h; and the CPU's step_call_s (masks, token choice: on the
    host)."""
    m, where = blk.model, globals_tier(blk.policy, blk.model.num_layers)
    spec, flops_per_row = blk.hw.device(where), 2 * m.vocab_size * m.hidden_size
    logits = 4 * m.vocab_size / channel_rates(blk)["d2h"] if where == "gpu" else 0.0
    int8 = head_in_int8(blk.policy, where)  # at the int8 kernel's rate where measured

    def rate(b: int) -> float:
        return ((int8 and spec.kernel_flop_per_s("int8", b, m.hidden_size))
                or spec.matmul_flop_per_s(b, m.hidden_size, dtype=blk.work.dtype))
    return sum(b * positions * (flops_per_row / rate(b * positions) + logits) + blk.hw.cpu.step_call_s
               for b in blk.batches)


def phase_groups(blk: Block, phase: str) -> dict[str, int]:
    """Layers per compute device in `phase` (FlexInfer's choice), leaving out devices with none."""
    return {d: n for d, n in layers_on(blk.policy, phase, blk.model.num_layers).items() if n}
