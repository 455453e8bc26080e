"""The figures `flexbatch bench gpu` reports: per batch size, the best measured policy and the planner's choice
against the FlexGen-like offloading baseline (latency change, FlexInfer's headline), and the planner's choice
against the best other policy; their means over the batch sizes; and the text table."""

from __future__ import annotations

import statistics

from engine.memory.tiers import human
from jobs.bench.gpu_policies import BASELINE
from jobs.bench.table import Column, format_table, num, pct

PLANNER_TARGET = 0.10  # the planner's choice within +10 % of the best other measured policy
FLEXINFER_CHANGE = -0.75  # FlexInfer's average latency change vs FlexGen-like offloading


def headline(rows: list[dict], work) -> dict:
    """At one batch size: the best measured policy's and the planner's latency change against the baseline
    (seconds / baseline seconds - 1; -0.75 is FlexInfer's average), the planner's against the best other policy,
    and the fixed policies that run exactly as the planner's choice does."""
    from engine.policy import Policy
    from jobs.bench.planner import runs_alike

    ok = [r for r in rows if not r.get("error") and "seconds" in r]
    base = next((r for r in ok if r["kind"] == BASELINE), None)
    plan = next((r for r in ok if r["kind"] == "planner"), None)
    others = [r for r in ok if r["kind"] != "planner"]

    def vs_base(r):
        return r["seconds"] / base["seconds"] - 1 if base else None

    h = {"best": None, "best_s": None, "best_vs_offload": None, "planner_s": None, "planner_vs_offload": None,
         "best_other": None, "planner_vs_best": None, "planner_same_as": []}
    if ok:
        best = min(ok, key=lambda r: r["seconds"])
        h.update(best=best["name"], best_s=best["seconds"], best_vs_offload=vs_base(best))
    if plan:
        h.update(planner_s=plan["seconds"], planner_vs_offload=vs_base(plan))
        if others:
            top = min(others, key=lambda r: r["seconds"])
            h.update(best_other=top["name"], planner_vs_best=plan["seconds"] / top["seconds"] - 1)
        mine = Policy.from_dict(plan["policy"])
        h["planner_same_as"] = [r["name"] for r in others if runs_alike(Policy.from_dict(r["policy"]), mine, work)]
    return h


def summary(batches: list[dict]) -> dict:
    def mean(key):
        values = [b["headline"][key] for b in batches if b["headline"][key] is not None]
        return statistics.mean(values) if values else None

    gaps = [b["headline"]["planner_vs_best"] for b in batches if b["headline"]["planner_vs_best"] is not None]
    return {"mean_best_vs_offload": mean("best_vs_offload"), "mean_planner_vs_offload": mean("planner_vs_offload"),
            "flexinfer_vs_offload": FLEXINFER_CHANGE, "worst_planner_vs_best": max(gaps) if gaps else None,
            "planner_within_target": sum(g <= PLANNER_TARGET for g in gaps), "planner_compared": len(gaps),
            "target_planner_vs_best": PLANNER_TARGET}


def batch_lines(b: dict) -> list[tuple | str]:
    """One batch size's rows of the table (a policy's cells, or an error), then its verdict lines."""
    base = next((r for r in b["rows"] if r["kind"] == BASELINE and "seconds" in r), None)
    out = []
    for r in b["rows"]:
        name = r["name"] + (" (baseline)" if r["kind"] == BASELINE else "")
        if "seconds" not in r:
            out.append((b["batch"], name, f"error: {r.get('error') or 'not run'}"))
            continue
        vs = pct(r["seconds"] / base["seconds"] - 1) if base and r is not base else "-"
        out.append((b["batch"], name, f"{r['seconds']:.3f}", f"{r['tokens_per_s']:.1f}", f"{r['prefill_s']:.3f}",
                    f"{r['decode_s']:.3f}", num(r.get("predicted_s")), vs))
    h = b["headline"]
    plan = next((r for r in b["rows"] if r["kind"] == "planner" and r.get("description")), None)
    if plan:
        same = f", runs as {h['planner_same_as'][0]}" if h["planner_same_as"] else ""
        out.append(f"       planner chose {plan['description']}{same}")
    out.append(f"       best {h['best']}: {pct(h['best_vs_offload'])} vs offload; planner {pct(h['planner_vs_offload'])}"
               f" vs offload, {pct(h['planner_vs_best'])} vs best other ({h['best_other']}; target "
               f"<= +{100 * PLANNER_TARGET:.0f}%)")
    return out


COLUMNS = (Column("batch", 5), Column("policy (prefill/decode)", 28, "<", gap=2), Column("latency s", 9),
           Column("tokens/s", 9), Column("prefill s", 9), Column("decode s", 9), Column("pred s", 8),
           Column("vs base", 8))


def table_text(report: dict) -> str:
    c, m, s = report["config"], report["model"], report["summary"] or {}
    setup = (f"bench gpu: {m['dir']} ({m['model_type']}, {m['layers']} layers, {human(m['weight_bytes'])} in "
             f"{c['dtype']}) on {report['machine']['gpu']}; GPU budget {human(report['gpu_budget_bytes'])} "
             f"({report['gpu_budget_bytes'] / m['weight_bytes']:.2f}x the weights; the baseline keeps "
             f"{report['baseline_gpu_layers']} of {m['layers']} layers there); prompt {c['prompt_len']}, "
             f"gen {c['gen_len']}, {c['dtype']}, median of {c['repeats']}; planner's view: {report['hardware']}")
    verdict = (f"headline: latency vs FlexGen-like offloading, mean over {len(report['batches'])} batch sizes: best "
               f"per-phase choice {pct(s.get('mean_best_vs_offload'))}, planner "
               f"{pct(s.get('mean_planner_vs_offload'))} (FlexInfer: {pct(FLEXINFER_CHANGE)}); planner vs best other "
               f"policy: worst {pct(s.get('worst_planner_vs_best'))}, {s.get('planner_within_target', 0)}/"
               f"{s.get('planner_compared', 0)} batch sizes within +{100 * PLANNER_TARGET:.0f}%")
    rows = [line for b in report["batches"] for line in batch_lines(b)]
    return format_table(COLUMNS, rows, above=[setup], below=[verdict])
