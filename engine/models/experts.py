"""A mixture of experts in place of a layer's MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss): a router scores every
expert for each token, the token's top k run, and their outputs are summed weighted by the router.

Tokens are grouped by expert: each expert that any token of the call chose runs once, as one GEMM (through the
backend's Linear: dense, int8, 4-bit or gpt-oss's MXFP4 weights alike) over the rows of the tokens that chose it, and
its weighted output is added into theirs; no loop runs over tokens. Where every chosen expert's weights are in a form
the project's kernels take whole (4-bit tiles, MXFP4 kept packed), all of them run in one kernel call. Experts are taken in ascending order, so each token's sum is
formed in the order the checkpoints' own code forms it (exact in float32)."""

from __future__ import annotations

import torch

from engine.checkpoint import LayerWeights
from engine.kernels import int4_experts, mxfp4_experts
from engine.spec import ModelSpec


def route(logits: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [N, E] -> (weights [N, k] float32, chosen experts [N, k]): the top k of a softmax over every
    expert (renormalized to sum to 1 where `norm_topk_prob`), or a softmax over the top k logits."""
    k = spec.experts_per_token
    if spec.router == "topk":
        top, chosen = torch.topk(logits.float(), k, dim=-1)
        return torch.softmax(top, dim=-1), chosen
    weights, chosen = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    if spec.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, chosen


def mixture(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, expert, experts=None) -> torch.Tensor:
    """sum over each token's chosen experts e of weight * expert(e, rows): x [N, H], weights / chosen [N, k],
    `expert(e, rows [n, H]) -> [n, H]` -> [N, H] in x's dtype. `experts(ids, counts, rows)`, where given, computes
    every chosen expert over its rows at once ([R, H] grouped by expert, or None where it cannot): the same values.

    The (token, choice) slots are grouped by expert with one sort, and the rows gathered once: each expert's rows
    are one slice, ordered by rank, then token, as the reference's mask orders them. Each weighted output lands
    in its slot, and each token's sum is formed over its experts in ascending order, as the reference's
    index_add over the experts forms it (exact in float32)."""
    N, k = chosen.shape
    slots = chosen.t().reshape(-1)  # slot r * N + t: token t's rank-r choice
    order = torch.argsort(slots, stable=True)
    ids, counts = (t.tolist() for t in torch.unique_consecutive(slots[order], return_counts=True))
    rows = x[order % N]
    done = experts(ids, counts, rows) if experts is not None else None
    if done is None:
        done, start = torch.empty_like(rows), 0
        for e, n in zip(ids, counts):
            done[start : start + n] = expert(e, rows[start : start + n])
            start += n
    by_slot = torch.empty_like(rows)
    by_slot[order] = (done * weights.t().reshape(-1)[order, None]).to(x.dtype)  # float32 products, rounded once
    by_slot = by_slot.view(k, N, -1)
    ascending, tokens, out = chosen.argsort(dim=1), torch.arange(N), torch.zeros_like(x)
    for j in range(k):
        out += by_slot[ascending[:, j], tokens]
    return out


def moe_block(model, lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
    """The mixture of a layer for rows x [*, H] (compute dtype) -> [*, H]: routed experts, plus the shared expert
    gated by a sigmoid where the model has one."""
    spec, linear, p = model.spec, model.kernels.linear, model.spec.moe_prefix
    flat = x.reshape(-1, x.shape[-1])
    router = p + spec.router_name
    weights, chosen = route(linear(flat, lw[router + ".weight"], lw.get(router + ".bias")), spec)
    if read_ahead := getattr(lw, "read_ahead", None):  # experts read from disk once routed (memory/expert_reads.py)
        read_ahead(torch.unique(chosen).tolist())

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        up, down = f"{p}experts.{e}.gate_up_proj", f"{p}experts.{e}.{spec.expert_down}"
        gated = model._gate(linear(rows, lw[up + ".weight"], lw.get(up + ".bias")))
        return linear(gated, lw[down + ".weight"], lw.get(down + ".bias"))

    def experts(ids: list[int], counts: list[int], rows: torch.Tensor) -> torch.Tensor | None:
        if read_ahead:
            return None  # experts read as routed compute as they arrive
        up, down = [f"{p}experts.{e}.gate_up_proj" for e in ids], [f"{p}experts.{e}.{spec.expert_down}" for e in ids]
        gate_up, down_w = [lw[n + ".weight"] for n in up], [lw[n + ".weight"] for n in down]
        if spec.gate_limit is not None:  # gpt-oss: MXFP4 experts kept packed
            return mxfp4_experts.run(rows, counts, gate_up, [lw.get(n + ".bias") for n in up], down_w,
                                     [lw.get(n + ".bias") for n in down], spec.gate_limit, spec.gate_alpha)
        if spec.expert_bias or spec.activation != "silu":
            return None  # biases and other gates: one at a time
        return int4_experts.run(rows, counts, gate_up, down_w)

    out = mixture(flat, weights, chosen, expert, experts)
    if spec.shared_expert_ffn_size:
        shared = linear(model._gate(linear(flat, lw[p + "shared_expert.gate_up_proj.weight"])),
                        lw[p + "shared_expert.down_proj.weight"])
        out = out + torch.sigmoid(linear(flat, lw[p + "shared_expert_gate.weight"])) * shared
    return out.view(x.shape)
