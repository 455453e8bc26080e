"""Explain a plan: the chosen policy and its predicted times, the best alternatives, what binds it, where each
tensor lives and each phase's timeline, as text for the terminal and as a PNG (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from engine.memory.footprint import global_bytes, stored_layer_bytes
from engine.memory.tiers import human
from engine.memory.weight_store import globals_tier
from engine.spec import ModelSpec
from planner.cost_model import CHANNELS
from planner.hardware import HardwareSpec
from planner.memory_model import act_block_bytes, kv_block_bytes
from planner.predict import PHASES, PhaseCost, Prediction
from planner.search import Plan
from planner.workload import KINDS, TIERS

BAR = 24
BINDING_SHARE = 0.98  # a memory row this full is reported as binding


def describe(p: Prediction) -> str:
    """One line: block shape, compute devices, placement and compression."""
    pol = p.policy

    def dev(phase):
        d = getattr(pol, f"{phase}_device")
        return f"split@{getattr(pol, f'{phase}_split_layer')}" if d == "split" else d

    where = " ".join(f"{k[0]}:" + "/".join(f"{round(100 * getattr(pol, f'{k}_{t}'))}" for t in TIERS) for k in KINDS)
    lossy = "+".join(n for n, on in (("w4", pol.compress_weight), ("kv4", pol.compress_cache)) if on) or "bf16"
    attn = " cpu-attn" if pol.cpu_attention and pol.uses_gpu() else ""
    return f"{pol.gbs}x{pol.num_gb} prefill={dev('prefill')} decode={dev('decode')} {where} {lossy}{attn}"


def policy_lines(p: Prediction) -> list[str]:
    pol, w = p.policy, p.workload
    return [f"policy: gbs {pol.gbs} x num_gb {pol.num_gb} (blocks of {p.block_rows} rows, {p.num_blocks} blocks)",
            f"  compute: prefill on {pol.prefill_device}, decode on {pol.decode_device}"
            + (f" (split layers {pol.prefill_split_layer}/{pol.decode_split_layer})" if "split" in
               (pol.prefill_device, pol.decode_device) else "") + f"; cpu attention {'on' if pol.cpu_attention else 'off'}",
            f"  compression: weights {'4-bit' if pol.compress_weight else 'off'}, "
            f"KV cache {'4-bit' if pol.compress_cache else 'off'}",
            f"  FlexGen --percent: {' '.join(str(round(100 * getattr(pol, f'{k}_{t}'))) for k in KINDS for t in ('gpu', 'cpu'))}",
            f"predicted for {w.num_prompts} prompts x ({w.prompt_len} in, {w.gen_len} out): prefill "
            f"{p.prefill_s:.3g} s/block, decode {p.decode_token_s:.3g} s/token/block, block {p.block_s:.3g} s, "
            f"total {p.total_s:.3g} s, {p.tokens_per_s:.4g} tokens/s"
            + (f" (KV hand-off {p.kv_handoff_s:.3g} s of prefill)" if p.kv_handoff_s > 0 else "")]


def alternatives_lines(plan: Plan) -> list[str]:
    best = plan.prediction.total_s
    out = ["top alternatives (other discrete choices, each with its best placement):",
           f"  {'#':>2} {'total s':>9} {'tok/s':>9} {'vs best':>8}  policy"]
    for i, p in enumerate((plan.prediction, *plan.alternatives)):
        out.append(f"  {i:>2} {p.total_s:>9.3g} {p.tokens_per_s:>9.4g} {100 * (p.total_s / best - 1):>+7.1f}%  "
                   f"{describe(p)}")
    return out


def bottleneck(cost: PhaseCost) -> str:
    """The slower chain of each device group and its largest channel."""
    parts = []
    for device, n in cost.layers.items():
        chains = {"prefetch (weights)": cost.prefetch_s[device], "main (compute + cache)": cost.main_s[device],
                  "store (prefill K/V to CPU memory)": cost.store_s.get(device, 0.0)}
        chain = max(chains, key=chains.get)
        top = max(CHANNELS, key=lambda c: cost.channels_s[device][c])
        parts.append(f"{n} layers on {device}: {chain} bound, largest channel {top}")
    return "; ".join(parts)


def binding_lines(plan: Plan) -> list[str]:
    out = ["binding constraints:"]
    for (phase, tier), share in sorted(plan.memory_use.items()):
        if share >= BINDING_SHARE:
            out.append(f"  {tier} memory at {phase}: {100 * share:.1f}% of {human(plan.capacity[tier])}")
    if plan.pins:
        out.append(f"  pinned by the caller: {', '.join(f'{k}={v}' for k, v in sorted(plan.pins.items()))}")
    if len(out) == 1:
        out.append("  none: no memory tier is full; the block shape and devices are the fastest choice")
    for phase in PHASES:
        out.append(f"  {phase}: {bottleneck(getattr(plan.prediction, phase))}")
    return out


def tensor_bytes(model: ModelSpec, p: Prediction) -> dict[str, float]:
    w, pol = p.workload, p.policy
    return {"weight": model.num_layers * stored_layer_bytes(model, w.dtype_bytes, pol),
            "cache": kv_block_bytes(model, w, p.block_rows, pol.compress_cache),
            "act": act_block_bytes(model, w, p.block_rows)}


def placement_picture(model: ModelSpec, p: Prediction) -> list[str]:
    sizes = tensor_bytes(model, p)
    out = ["where tensors live (# = share on the tier):", f"  {'':<25}" + "".join(f"{t:<{BAR + 2}}" for t in TIERS)]
    for kind in KINDS:
        cells = []
        for tier in TIERS:
            share = getattr(p.policy, f"{kind}_{tier}")
            cells.append(("#" * round(share * BAR)).ljust(BAR, ".") + "  ")
        label = {"weight": "weights", "cache": "KV cache", "act": "activations"}[kind]
        out.append(f"  {label:<12}{human(sizes[kind]):>11}  " + "".join(cells))
    where = globals_tier(p.policy, model.num_layers)  # placed like a layer, wholly on one tier
    cells = "".join(("#" if tier == where else ".") * BAR + "  " for tier in TIERS)
    out.append(f"  {'embed+head':<12}{human(global_bytes(model, p.workload.dtype_bytes, p.policy)):>11}  " + cells)
    return out


def timeline_lines(p: Prediction) -> list[str]:
    """Per phase and device: each channel's seconds per layer as a bar (the layer takes the slower chain)."""
    top = max((v for ph in PHASES for d in getattr(p, ph).channels_s.values() for v in d.values()), default=0)
    out = ["per-layer timeline (seconds per layer per step, channels overlap across the two chains):"]
    for phase in PHASES:
        cost = getattr(p, phase)
        for device, n in cost.layers.items():
            out.append(f"  {phase} on {device} ({n} layers, {cost.layer_s[device]:.3g} s/layer, "
                       f"step {cost.step_s:.3g} s):")
            for c in CHANNELS:
                v = cost.channels_s[device][c]
                bar = "=" * (round(BAR * v / top) if top else 0)
                out.append(f"    {c:<10} {bar:<{BAR}} {v:.3g}")
    return out


def explain_text(plan: Plan, model: ModelSpec, hw: HardwareSpec) -> str:
    head = [f"plan for {model.model_type} ({model.num_layers} layers, hidden {model.hidden_size}) on {hw.name}; "
            f"{plan.solves} discrete choices placed in {plan.seconds:.2f} s"]
    blocks = [head, policy_lines(plan.prediction), alternatives_lines(plan), binding_lines(plan),
              placement_picture(model, plan.prediction), timeline_lines(plan.prediction)]
    return "\n\n".join("\n".join(b) for b in blocks)


def plot_png(plan: Plan, model: ModelSpec, path: str | Path) -> Path:
    """Two panels: bytes of each tensor kind per tier, and each phase's channel seconds per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, sizes = plan.prediction, tensor_bytes(model, plan.prediction)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    bottom = [0.0] * len(TIERS)
    for kind in KINDS:
        vals = [getattr(p.policy, f"{kind}_{t}") * sizes[kind] / 2**30 for t in TIERS]
        left.bar(TIERS, vals, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals)]
    where = globals_tier(p.policy, model.num_layers)
    glob = global_bytes(model, p.workload.dtype_bytes, p.policy) / 2**30
    left.bar(TIERS, [glob if t == where else 0.0 for t in TIERS], bottom=bottom, label="embed+head")
    left.set_ylabel("GiB")
    left.set_title("where tensors live")
    left.legend()
    labels, rows = [], []
    for phase in PHASES:
        cost = getattr(p, phase)
        for device in cost.layers:
            labels.append(f"{phase}/{device}")
            rows.append([cost.channels_s[device][c] for c in CHANNELS])
    for i, c in enumerate(CHANNELS):
        right.barh([y + i * 0.15 for y in range(len(labels))], [r[i] for r in rows], height=0.15, label=c)
    right.set_yticks([y + 0.3 for y in range(len(labels))], labels)
    right.set_xlabel("seconds per layer per step")
    right.set_title("per-phase timeline (channels)")
    right.legend()
    fig.suptitle(f"{describe(p)}\n{p.tokens_per_s:.4g} tokens/s predicted", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
