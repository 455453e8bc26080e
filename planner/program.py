"""The inner program of the search: for one discrete choice (block shape, compression, CPU attention, compute
device of each phase), place weights, KV cache and activations over gpu/cpu/disk to minimize the block's time.

Placement is in whole units, as the engine places it: layers per tier for the weights and rows per tier of each
GPU batch for the cache and activations. These counts are integer variables, so the program is a small MILP
(HiGHS); the plan needs no rounding afterwards. The problem is built once with `cp.Parameter`s and re-solved for
every discrete choice:

    minimize    sum_g  w_g * t_g + tie . y              (w_g: layers of group g x its steps; tie: 1e-9 s)
    subject to  t_g >= a_gk . y + b_gk                 (the prefetch and main chains of group g)
                M_pt . y + m_pt + s_pt * z <= 1         (peak of tier t in phase p, scaled by its capacity)
                y_disk_layers <= L * z                  (z = 1 when some layer lives on disk: 2 staged layers)
                sum of each kind's counts = L, gbs, gbs;   lo <= y <= hi (pins, no GPU)

Groups g are (prefill, cpu), (prefill, gpu), (decode, cpu), (decode, gpu).

Without a GPU, placing everything in CPU memory is optimal whenever it fits and the bounds allow it: disk counts
only add time (a disk part is read through the CPU) and the tie prefers memory. `memory_solution` prices that
placement directly, so a plan that needs no disk neither imports cvxpy nor solves (most of a small job's planning
time); `tests/planner/test_search.py` checks it against the program."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.policy import Policy
from planner.cost_model import layer_time_terms, phase_groups
from planner.errors import SolverError
from planner.memory_model import disk_staging_bytes, peak_bytes
from planner.predict import PHASES
from planner.workload import PLACEMENT, TIERS

if TYPE_CHECKING:
    from planner.cost_model import Block

GROUPS = tuple((phase, device) for phase in PHASES for device in ("cpu", "gpu"))
CHAINS = 3  # prefetch, main, store (cost_model.layer_chains)
NV = len(PLACEMENT)
MS_PER_S = 1e3  # the time rows are in milliseconds, to keep the coefficients near 1
DISK_TIE_MS = 1e-6  # breaks ties toward memory: a fully disk-placed kind costs this much more (no real time)


@functools.cache
def _quiet_highs() -> None:
    """HiGHS prints a banner on stdout when a process makes its first solver; stdout is the CLI's, so make that
    first one here with stdout pointed at /dev/null."""
    import highspy

    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


@dataclass(frozen=True)
class Solution:
    counts: tuple[int, ...]  # weight layers, cache rows, act rows per tier (PLACEMENT order)
    objective_s: float
    memory_use: dict  # (phase, tier) -> share of capacity used

    def policy(self, template: Policy, num_layers: int) -> Policy:
        """The template with the solved fractions (counts / L or / gbs)."""
        c = self.counts
        return Policy(**{**template.to_dict(), "weight_gpu": c[0] / num_layers, "weight_cpu": c[1] / num_layers,
                         "cache_gpu": c[3] / template.gbs, "cache_cpu": c[4] / template.gbs,
                         "act_gpu": c[6] / template.gbs, "act_cpu": c[7] / template.gbs})


class PlacementProgram:
    """The MILP, built once; `solve(block, bounds, capacity)` sets its parameters and re-solves."""

    def __init__(self):
        import cvxpy as cp  # imported only when a plan needs the program (~1 s)

        _quiet_highs()
        rows = len(GROUPS) * CHAINS
        self.y = cp.Variable(NV, integer=True)
        self.z = cp.Variable(boolean=True)
        self.t = cp.Variable(len(GROUPS))
        self.a, self.b = cp.Parameter((rows, NV)), cp.Parameter(rows)
        self.w = cp.Parameter(len(GROUPS), nonneg=True)
        mem_rows = len(PHASES) * len(TIERS)
        self.m, self.m0 = cp.Parameter((mem_rows, NV)), cp.Parameter(mem_rows)
        self.stage = cp.Parameter(mem_rows, nonneg=True)
        self.lo, self.hi = cp.Parameter(NV), cp.Parameter(NV)
        self.totals = cp.Parameter(3, nonneg=True)
        self.tie = cp.Parameter(NV, nonneg=True)
        select = np.repeat(np.eye(len(GROUPS)), CHAINS, axis=0)  # chain row -> its group
        y = self.y
        constraints = [select @ self.t >= self.a @ y + self.b, self.m @ y + self.m0 + self.stage * self.z <= 1,
                       y >= self.lo, y <= self.hi, y[2] <= self.totals[0] * self.z, self.t >= 0]
        constraints += [cp.sum(y[3 * k: 3 * k + 3]) == self.totals[k] for k in range(3)]
        self.problem = cp.Problem(cp.Minimize(self.w @ self.t + self.tie @ y), constraints)

    def solve(self, blk: Block, lo: np.ndarray, hi: np.ndarray, capacity: dict) -> Solution | None:
        """Best counts for `blk`'s discrete choice, or None when no placement fits."""
        import cvxpy as cp

        L, gbs = blk.model.num_layers, blk.policy.gbs
        per_count = _per_count(blk)
        self.a.value, self.b.value, self.w.value = time_rows(blk, per_count)
        self.m.value, self.m0.value, self.stage.value, scale = memory_rows(blk, per_count, capacity)
        self.lo.value, self.hi.value = lo, hi
        self.totals.value = np.array([L, gbs, gbs], dtype=float)
        self.tie.value = np.array([0, 0, 1, 0, 0, 1, 0, 0, 1]) * per_count * DISK_TIE_MS
        try:
            self.problem.solve(solver=cp.HIGHS, verbose=False)
        except cp.error.SolverError as e:
            raise SolverError(f"HiGHS failed on the placement program: {e}") from e
        if self.problem.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            return None
        if self.problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            raise SolverError(f"the placement program ended with status {self.problem.status}")
        counts = tuple(int(round(v)) for v in self.y.value)
        staging = counts[2] > 0  # z is free when no layer is on disk; the engine stages only for disk layers
        used = self.m.value @ np.array(counts) + self.m0.value + self.stage.value * staging
        return Solution(counts, float(self.w.value @ self.t.value) / MS_PER_S, _use(used, scale))


def memory_solution(blk: Block, lo: np.ndarray, hi: np.ndarray, capacity: dict) -> Solution | None:
    """The program's optimum without solving it, where that is known: on a machine without a GPU (all gpu
    bounds 0), every count in CPU memory when the bounds allow that and it fits; None otherwise."""
    L, gbs = blk.model.num_layers, blk.policy.gbs
    counts = np.array([0, L, 0, 0, gbs, 0, 0, gbs, 0], dtype=float)
    if hi[0] or hi[3] or hi[6] or np.any(counts < lo) or np.any(counts > hi):
        return None
    per_count = _per_count(blk)
    m, m0, _, scale = memory_rows(blk, per_count, capacity)
    used = m @ counts + m0
    if np.any(used > 1):
        return None
    a, b, w = time_rows(blk, per_count)
    t = np.maximum((a @ counts + b).reshape(len(GROUPS), CHAINS).max(axis=1), 0.0)
    return Solution(tuple(int(c) for c in counts), float(w @ t) / MS_PER_S, _use(used, scale))


def _per_count(blk: Block) -> np.ndarray:
    """Fraction per unit of each count: weights in layers, cache and activations in rows of a GPU batch."""
    return np.array([1 / blk.model.num_layers] * 3 + [1 / blk.policy.gbs] * 6)


def _use(used: np.ndarray, scale: list[float]) -> dict:
    return {key: float(u) for key, u, s in zip(_mem_keys(), used, scale) if s}


def time_rows(blk: Block, per_count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, w) in milliseconds: chain row c of group g is a[g*CHAINS+c] . y + b[..]; w weighs group g."""
    a, b = np.zeros((len(GROUPS) * CHAINS, NV)), np.zeros(len(GROUPS) * CHAINS)
    w = np.zeros(len(GROUPS))
    steps = {"prefill": 1, "decode": blk.work.gen_len - 1}
    for g, (phase, device) in enumerate(GROUPS):
        count = phase_groups(blk, phase).get(device, 0)
        if count == 0:
            continue
        w[g] = count * steps[phase]
        for c, term in enumerate(layer_time_terms(blk, phase, device)):
            a[g * CHAINS + c], b[g * CHAINS + c] = term.coef * per_count * MS_PER_S, term.const * MS_PER_S
    return a, b, w


def memory_rows(blk: Block, per_count: np.ndarray, capacity: dict):
    """(m, m0, stage, capacities): memory rows divided by the tier's capacity (a tier with none keeps its row in
    GB, which must be 0)."""
    rows = len(PHASES) * len(TIERS)
    m, m0, stage, scale = np.zeros((rows, NV)), np.zeros(rows), np.zeros(rows), []
    staged = disk_staging_bytes(blk.model, blk.work, blk.policy)
    for r, (phase, tier) in enumerate(_mem_keys()):
        peak = peak_bytes(blk.model, blk.work, blk.policy, blk.rows, phase, blk.hw.memory_limit_binds)[tier]
        cap = capacity[tier]
        k = 1 / cap if cap > 0 else 1e-9
        m[r], m0[r] = peak.coef * per_count * k, peak.const * k + (0 if cap > 0 else 1)
        stage[r] = staged * k if tier == "cpu" else 0.0
        scale.append(cap)
    return m, m0, stage, scale


def _mem_keys() -> list[tuple[str, str]]:
    return [(phase, tier) for phase in PHASES for tier in TIERS]
