"""Price one `Policy`: prefill time, decode time per token, block and job time, throughput, and the peak memory
of each tier at prefill and at decode, with placement rounded exactly as the engine rounds it (whole layers per
tier, whole rows per tier in each GPU batch)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from engine.memory.placement import row_segments
from engine.memory.weight_store import weight_placement
from engine.policy import Policy
from engine.spec import ModelSpec
from planner.cost_model import (
    CHANNELS,
    Block,
    channel_rates,
    head_s,
    kv_moves,
    layer_chains,
    phase_groups,
    priced,
)
from planner.hardware import HardwareSpec
from planner.memory_model import disk_staging_bytes, peak_bytes
from planner.workload import PLACEMENT, TIERS, Workload

PHASES = ("prefill", "decode")
MEMORY_FRACTION = 0.8  # FlexGen's slack on a device's capacity when no budget is given


def realized_policy(policy: Policy, num_layers: int) -> Policy:
    """The policy with the fractions the engine realizes: layer counts / L and rows per GPU batch / gbs."""
    w = weight_placement(policy, num_layers)
    kw = {f"weight_{t}": w.count(t) / num_layers for t in ("gpu", "cpu")}
    for kind in ("cache", "act"):
        segs = dict(row_segments(policy.gbs, {t: getattr(policy, f"{kind}_{t}") for t in TIERS}))
        for t in ("gpu", "cpu"):
            kw[f"{kind}_{t}"] = (segs[t].stop - segs[t].start) / policy.gbs if t in segs else 0.0
    return replace(policy, **kw)


def group_placement(policy: Policy, num_layers: int, phase: str, device: str) -> np.ndarray:
    """Placement vector seen by the layers computing on `device` in `phase`: their own weight tiers (the
    engine's `weight_placement` gives a split's GPU layers the gpu tier first), the shared cache and acts."""
    tiers = weight_placement(policy, num_layers)
    layers = [j for j in range(num_layers) if policy.layer_on_gpu(phase, j) == (device == "gpu")]
    x = np.array([getattr(policy, name) for name in PLACEMENT], dtype=float)
    for i, t in enumerate(TIERS):
        x[i] = sum(tiers[j] == t for j in layers) / max(1, len(layers))
    return x


@dataclass(frozen=True)
class PhaseCost:
    """One step of one phase for a block: per compute device, layers, seconds per layer (the max of the prefetch,
    main and store chains) and FlexGen's five channels (seconds, the chains summed); step_s includes head_s."""

    layers: dict
    layer_s: dict
    prefetch_s: dict
    main_s: dict
    channels_s: dict  # compute at the device's run scale, bytes at their profiled rates
    step_s: float
    store_s: dict = field(default_factory=dict)
    head_s: float = 0.0  # the embeddings and head (cost_model.head_s), at the step's scale
    run_scale: dict = field(default_factory=dict)  # per compute device, the scale its compute is priced at

    @property
    def bound_s(self) -> float:
        """The step's roofline: its busiest channel (disk reads, transfers, or compute with the head), each summed over
        the layers as if every channel overlapped every other perfectly: bytes over the profiled rates, FLOPs over
        the profiled kernel rates (at the scale the step is priced at), with no waits between them."""
        totals = {c: sum(self.layers[d] * self.channels_s[d][c] for d in self.layers) for c in CHANNELS}
        totals["compute"] += self.head_s
        return max(totals.values())


@dataclass(frozen=True)
class Prediction:
    """What `policy` costs on `workload`: each phase's step, a block, the whole job, and the memory it peaks at."""

    policy: Policy
    workload: Workload
    block_rows: int  # rows in one block: min(gbs * num_gb, num_prompts)
    num_blocks: int
    prefill: PhaseCost
    decode: PhaseCost
    block_s: float  # seconds of one block: its prefill, then gen_len - 1 decode steps
    total_s: float  # seconds of the whole job: every block, or the refilled slots and their drain
    tokens_per_s: float  # expected generated tokens per second of total_s
    peak_bytes: dict  # peak bytes per phase and tier (memory_need)
    kv_handoff_s: float  # prefill's seconds storing the new KV cache away from its compute device (FlexInfer)
    bound_s: float = 0.0  # the whole job at its steps' rooflines (PhaseCost.bound_s): beaten only where the profile's
    # rates are below what the machine reaches

    @property
    def prefill_s(self) -> float:
        """Time to first token of a block."""
        return self.prefill.step_s

    @property
    def decode_token_s(self) -> float:
        return self.decode.step_s


def phase_cost(blk: Block, phase: str) -> PhaseCost:
    """One step of `phase` for the block. The CPU's compute is priced at the profile's `cpu_run_scale` (what a
    whole block on the CPU took over the sum of its profiled parts, planner/calibrate.py); bytes moved (disk reads
    and writes, transfers) at their profiled rates alone: the calibration block reads and moves nothing."""
    L = blk.model.num_layers
    scale = {"cpu": blk.hw.cpu_run_scale, "gpu": 1.0}
    layers, layer_s, pre_s, main_s, store_s, chans = {}, {}, {}, {}, {}, {}
    for device, count in phase_groups(blk, phase).items():
        x = group_placement(blk.policy, L, phase, device)
        chains = layer_chains(blk, phase, device)

        def seconds(chain: dict, c: str, x=x, compute_scale=scale[device]) -> float:
            return chain[c].at(x) * (compute_scale if c == "compute" else 1.0)

        pre, main, store = (sum(seconds(chains[k], c) for c in chains[k]) for k in ("prefetch", "main", "store"))
        layers[device], pre_s[device], main_s[device], store_s[device] = count, pre, main, store
        layer_s[device] = max(pre, main, store)
        chans[device] = {c: sum(seconds(chain, c) for chain in chains.values()) for c in CHANNELS}
    head_scale = scale["cpu"] if blk.hw.gpu is None else 1.0
    positions = max(1, blk.work.scored_len) if phase == "prefill" else 1
    head = head_s(blk, positions) * head_scale
    step = sum(layers[d] * layer_s[d] for d in layers) + head
    return PhaseCost(layers, layer_s, pre_s, main_s, chans, step, store_s, head, {d: scale[d] for d in layers})


def block_steps(blk: Block) -> tuple[PhaseCost, PhaseCost, PhaseCost, int]:
    """A block's prefill step, its full decode step, the decode step of the rows still live on average
    (`live_block`), and n: a block is the prefill step, then n - 1 live decode steps; n is gen_len, or without
    refill Workload.block_gen_len (rows grouped by their own max_new_tokens)."""
    pre, dec = phase_cost(blk, "prefill"), phase_cost(blk, "decode")
    live = blk if blk.policy.refill else live_block(blk)
    n = blk.work.gen_len if blk.policy.refill else blk.work.block_gen_len
    return pre, dec, dec if live is blk else phase_cost(live, "decode"), n


def block_seconds(blk: Block) -> tuple[float, PhaseCost, PhaseCost]:
    """T_block = prefill step + (n - 1) decode steps (`block_steps`), and the prefill and full decode steps."""
    pre, dec, live, n = block_steps(blk)
    return pre.step_s + (n - 1) * live.step_s, pre, dec


def block_bound_s(blk: Block) -> float:
    """The block at its steps' rooflines (PhaseCost.bound_s)."""
    pre, _, live, n = block_steps(blk)
    return pre.bound_s + (n - 1) * live.bound_s


def live_block(blk: Block) -> Block:
    """`blk` as its decode steps see it on average without refill: a row generates E of the block's n tokens
    (E = Workload.expected_gen_len, n = block_gen_len), and finished rows leave their GPU batch
    (engine/loop/schedule.py), so each batch computes about gbs * E / n rows while the block runs."""
    share = blk.work.expected_gen_len / blk.work.block_gen_len
    gbs = max(1, round(blk.policy.gbs * share))
    if gbs >= blk.policy.gbs:
        return blk
    return Block(blk.model, blk.hw, blk.work, replace(blk.policy, gbs=gbs), gbs * len(blk.batches), blk.direct_reads)


def memory_need(model: ModelSpec, hw: HardwareSpec, work: Workload, policy: Policy, rows: int) -> dict:
    """Peak bytes per phase per tier for a block of `rows` rows (the realized placement)."""
    x = np.array([getattr(policy, n) for n in PLACEMENT], dtype=float)
    staged = disk_staging_bytes(model, work, policy) if policy.weight_disk > 0 else 0.0
    out = {}
    for phase in PHASES:
        peak = {t: a.at(x) for t, a in peak_bytes(model, work, policy, rows, phase, hw.memory_limit_binds,
                                                  placed=True).items()}
        peak["cpu"] += staged
        out[phase] = peak
    return out


def capacities(hw: HardwareSpec, budgets: dict | None = None) -> dict[str, float]:
    """Bytes each tier may hold: the budget when given, else MEMORY_FRACTION of the device (0 without a GPU)."""
    budgets = budgets or {}
    gpu = hw.gpu.memory_bytes * MEMORY_FRACTION if hw.gpu is not None else 0.0
    default = {"gpu": gpu, "cpu": hw.cpu.memory_bytes * MEMORY_FRACTION, "disk": hw.disk_bytes * MEMORY_FRACTION}
    out = {t: float(budgets[t]) if budgets.get(t) is not None else default[t] for t in TIERS}
    if hw.gpu is None:
        out["gpu"] = 0.0
    return out


def shortfalls(need: dict, capacity: dict) -> list[tuple[str, str, float, float]]:
    """(phase, tier, need, have) for every tier whose peak exceeds its capacity."""
    return [(phase, tier, need[phase][tier], capacity[tier]) for phase in PHASES for tier in TIERS
            if need[phase][tier] > capacity[tier] * (1 + 1e-9) + 1e-6]


def block_rows(policy: Policy, work: Workload) -> int:
    return min(policy.block_size, work.num_prompts)


def predict(model: ModelSpec, hw: HardwareSpec, work: Workload, policy: Policy) -> Prediction:
    """Price `policy` (its fractions rounded as the engine rounds them) for the whole job; tokens/s counts the
    tokens rows are expected to generate (`Workload.expected_gen_len`)."""
    policy = realized_policy(policy, model.num_layers)
    rows = block_rows(policy, work)
    blk = Block(model, hw, work, policy, rows)
    block_s, pre, dec = block_seconds(blk)
    full, rest = divmod(work.num_prompts, rows)
    if policy.refill:
        total = refill_seconds(work, rows, pre.step_s, dec.step_s)
        bound = refill_seconds(work, rows, pre.bound_s, dec.bound_s)
    else:
        last = Block(model, hw, work, policy, rest)
        total = full * block_s + (block_seconds(last)[0] if rest else 0.0)
        bound = full * block_bound_s(blk) + (block_bound_s(last) if rest else 0.0)
    handoff = kv_handoff_s(blk, pre.layers)
    return Prediction(policy, work, rows, full + (1 if rest else 0), pre, dec, block_s, total,
                      work.num_prompts * work.expected_gen_len / total, memory_need(model, hw, work, policy, rows),
                      handoff, bound)


def refill_seconds(work: Workload, rows: int, prefill_s: float, decode_step_s: float) -> float:
    """With refill, every slot stays busy until the rows run out: each row's prefill (priced as its share of a
    block's), n * E / rows decode steps for the n * E expected tokens, and a drain at the end while the last rows
    finish (gen_len - E steps: the longest-lived rows outlast the average)."""
    n, E = work.num_prompts, work.expected_gen_len
    return n / rows * prefill_s + (n * E / rows + work.gen_len - E) * decode_step_s


def kv_handoff_s(blk: Block, layers: dict) -> float:
    """FlexInfer's KV move: seconds of transfer prefill spends storing the new cache to tiers away from its
    compute device, summed over layers (reported on its own; from a GPU to CPU memory it overlaps compute)."""
    rates = channel_rates(blk)
    out = 0.0
    for device, count in layers.items():
        x = group_placement(blk.policy, blk.model.num_layers, "prefill", device)
        chans = priced(kv_moves(blk, "prefill", device), rates)
        out += count * sum(a.at(x) for a in chans.values())
    return out
