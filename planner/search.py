"""The policy search, as in FlexGen section 4.3: an outer enumeration of the discrete choices and, for each, the
inner placement program (`planner.program`, a small MILP re-solved with new parameters).

The outer loop enumerates gbs (powers of two, and the prompt count), num_gb (1..16, blocks no larger than the
workload), 4-bit weights and cache (only when the caller allows lossy compression or pins it), CPU attention,
and FlexInfer's compute choice for each phase (CPU-only, GPU with offloading, or a split at a quarter, half or
three quarters of the layers, or where the layers that fit the GPU sit on it; only CPU-only without a GPU). Any `Policy` field can be pinned by the caller;
the search fills in the rest. Every feasible candidate is then priced exactly (`planner.predict`) and ranked by
predicted job time. With a GPU the choices are many (up to 36 device pairs x CPU attention x compression x block
shapes), so a first stage ranks the modes at two reference block shapes and the second enumerates every block
shape for the best TOP_MODES of them."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

import numpy as np

from engine.compression import bf16
from engine.errors import InvalidParamsError
from engine.kernels import compiled
from engine.memory.footprint import global_bytes, layer_bytes
from engine.policy import FRACTION_NAMES, Pins, Policy
from engine.quantized.config import INT4_METHODS
from engine.spec import ModelSpec
from planner.cost_model import Block, memory_room
from planner.errors import PlanInfeasible
from planner.hardware import HardwareSpec
from planner.memory_model import layers_on
from planner.predict import Prediction, block_rows, capacities, memory_need, predict, shortfalls
from planner.program import PlacementProgram, memory_solution
from planner.workload import KINDS, TIERS, Workload

log = logging.getLogger(__name__)
POLICY_FIELDS = tuple(f.name for f in fields(Policy) if f.init)
NUM_GB_CHOICES = (1, 2, 4, 8, 16)
MAX_GBS = 512
SPLIT_POINTS = (0.25, 0.5, 0.75)
SPLIT_FIT_SHARE = 0.8  # of the GPU capacity, for the weights of a split's GPU layers (the rest: cache, scratch)
TOP_ALTERNATIVES = 5
FULL_ENUMERATION = 200  # above this many (shape, mode) pairs, rank the modes first
TOP_MODES = 4
LOSSY_FORMATS = ("int4", "int8")  # the compressed formats the search weighs where compression is allowed and none is pinned


@dataclass(frozen=True)
class Plan:
    """The chosen policy, its prediction, the best alternatives (other discrete choices), what bound it."""

    prediction: Prediction
    alternatives: tuple[Prediction, ...]
    memory_use: dict  # (phase, tier) -> share of capacity at the solution
    capacity: dict  # tier -> bytes it may hold
    pins: Mapping  # Policy fields the caller fixed
    solves: int  # candidates placed (by the placement program, or directly when all fits in memory)
    seconds: float  # wall time of the search

    @property
    def policy(self) -> Policy:
        return self.prediction.policy


def block_shapes(work: Workload, pins: Mapping) -> list[tuple[int, int]]:
    """(gbs, num_gb) pairs whose block is no larger than the workload (and always at least one)."""
    n = work.num_prompts
    gbs_set = sorted({g for g in (2 ** k for k in range(10)) if g <= min(n, MAX_GBS)} | {min(n, MAX_GBS)})
    gbs_set = [pins["gbs"]] if "gbs" in pins else gbs_set
    nums = [pins["num_gb"]] if "num_gb" in pins else NUM_GB_CHOICES
    shapes = [(g, k) for g in gbs_set for k in nums if g * k <= max(n, g) and (k == 1 or g * k <= n)]
    return shapes or [(gbs_set[0], nums[0])]


def device_choices(model: ModelSpec, hw: HardwareSpec, pins: Mapping, phase: str,
                   fit_layers: int | None = None) -> list[tuple[str, int]]:
    """FlexInfer's per-phase choices as (device, split layer): CPU-only, GPU with offloading, and splits at a
    quarter, half and three quarters of the layers and, given `fit_layers` (how many layers' weights fit the
    GPU), at the split that puts exactly those layers on the GPU."""
    if f"{phase}_device" in pins:
        device = pins[f"{phase}_device"]
        if device != "split":
            return [(device, 0)]
        if f"{phase}_split_layer" in pins:
            return [("split", pins[f"{phase}_split_layer"])]
    elif not hw.has_gpu:
        return [("cpu", 0)]
    L = model.num_layers
    points = {round(L * q) for q in SPLIT_POINTS} | ({L - fit_layers} if fit_layers is not None else set())
    splits = sorted({min(L - 1, max(1, k)) for k in points}) if L > 1 else []
    options = [("split", k) for k in splits]
    if f"{phase}_device" not in pins:
        options = [("cpu", 0), ("gpu", 0), *options]
    return options


def modes(model: ModelSpec, hw: HardwareSpec, pins: Mapping, allow_compression: bool,
          gpu_capacity: float = 0.0, dtype_bytes: int = 2) -> list[dict]:
    """Every choice besides the block shape: compression, CPU attention, each phase's compute device (a split
    where the layers that fit SPLIT_FIT_SHARE of the GPU capacity beside the embeddings and head sit on the GPU
    is among them)."""
    lossy = (False, True) if allow_compression else (False,)
    cc = [pins["compress_cache"]] if "compress_cache" in pins else lossy
    attn = [pins["cpu_attention"]] if "cpu_attention" in pins else ((True, False) if hw.has_gpu else (True,))
    out, room = [], max(0.0, gpu_capacity * SPLIT_FIT_SHARE - global_bytes(model, dtype_bytes))  # a split's
    for w, fmt in weight_forms(model, pins, allow_compression, dtype_bytes):
        # the last layer computes on the GPU, so the embeddings and head live there (globals_tier)
        fit = int(room // layer_bytes(model, dtype_bytes, w, fmt)) if hw.has_gpu else None
        pre, dec = (device_choices(model, hw, pins, phase, fit) for phase in ("prefill", "decode"))
        out += _modes_for(w, cc, attn, pre, dec, fmt, pins.get("share_prefix", Policy.share_prefix))
    return out


def weight_forms(model: ModelSpec, pins: Mapping, allow_compression: bool, dtype_bytes: int) -> list[tuple]:
    """The (compress_weight, weight_format) choices: as pinned; else uncompressed, the pinned lossy format where
    compression is allowed or, with no format pinned, both int4 and int8 (the cost model prices each format's
    kernel from the profile, so the search takes whichever is faster where both fit), and bfloat16 at rest
    wherever it loses nothing: a checkpoint stored in bfloat16 computing in float32 (engine/compression/bf16.py),
    on the avx2 machine class in place of the uncompressed form (`bf16.kept_unasked`, a fixed rule).
    A GPTQ or AWQ checkpoint keeps its own 4-bit form (engine/quantized/repack.py): widening it would hold the
    whole model dense for no gain in accuracy."""
    fmt = pins.get("weight_format", Policy.weight_format)
    if "compress_weight" in pins:
        return [(pins["compress_weight"], fmt)]
    quantization = model.quantization.method if model.quantization is not None else None
    if quantization in INT4_METHODS and "weight_format" not in pins:
        return [(True, "int4")]
    lossy = [fmt] if "weight_format" in pins else list(LOSSY_FORMATS)
    compressed = [(True, f) for f in lossy] if allow_compression else []
    if "weight_format" in pins or not bf16.lossless(model, dtype_bytes):
        return [(False, fmt), *compressed]
    if bf16.kept_unasked(model, dtype_bytes):  # this machine class's float32 form of a bf16 checkpoint
        return [(True, "bf16"), *compressed]
    return [(False, fmt), *compressed, (True, "bf16")]


def _modes_for(w, cc, attn, pre, dec, weight_format: str, share_prefix: bool) -> list[dict]:
    return [dict(compress_weight=w, weight_format=weight_format, compress_cache=c, cpu_attention=a, prefill_device=p[0],
                 prefill_split_layer=p[1], decode_device=d[0], decode_split_layer=d[1], share_prefix=share_prefix)
            for c, a, p, d in itertools.product(cc, attn, pre, dec)]


def reference_shapes(shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Two block shapes to rank modes by in the first stage: the largest GPU batch, and the middle one."""
    by_rows = sorted(shapes, key=lambda s: (s[0] * s[1], s[0]))
    return sorted({by_rows[-1], by_rows[len(by_rows) // 2]})


def split_gpu_layers(policy: Policy, num_layers: int) -> int | None:
    """For a policy with a static split (decode's when it has one, else prefill's): the layers computing on the
    GPU, whose weights FlexInfer keeps resident there. None without a split."""
    for phase in ("decode", "prefill"):
        if getattr(policy, f"{phase}_device") == "split":
            return layers_on(policy, phase, num_layers)["gpu"]
    return None


def count_bounds(model: ModelSpec, hw: HardwareSpec, pins: Mapping, gbs: int,
                 template: Policy | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on the placement counts: a pinned fraction fixes its count (rounded as the engine rounds);
    without a GPU nothing goes there. A split (FlexInfer) fixes the gpu weight layers to its GPU layers, unless
    weight_gpu is pinned: the engine places those layers' weights on the GPU and the rest in CPU memory."""
    lo, hi = np.zeros(9), np.array([model.num_layers] * 3 + [gbs] * 6, dtype=float)
    resident = split_gpu_layers(template, model.num_layers) if template is not None else None
    if resident is not None and hw.has_gpu and "weight_gpu" not in pins:
        lo[0] = hi[0] = resident
    for k, kind in enumerate(KINDS):
        units = model.num_layers if kind == "weight" else gbs
        acc = 0.0
        for i, tier in enumerate(("gpu", "cpu")):
            name = f"{kind}_{tier}"
            start = round(acc * units)
            acc += pins.get(name, 0.0)
            if name in pins:
                lo[3 * k + i] = hi[3 * k + i] = round(min(acc, 1.0) * units) - start
        if f"{kind}_gpu" in pins and f"{kind}_cpu" in pins:
            lo[3 * k + 2] = hi[3 * k + 2] = units - lo[3 * k] - lo[3 * k + 1]
        if not hw.has_gpu:
            hi[3 * k] = 0
    return lo, hi


def read_hypotheses(blk: Block, lo: np.ndarray, hi: np.ndarray) -> list[tuple[bool, np.ndarray, np.ndarray]]:
    """The engine reads disk-tier weights through the page cache up to half the planning process's room and
    with O_DIRECT above (`engine.memory.disk_read.reads_direct`), at different rates: a step in the disk layer count.
    Each side of the step is its own program, (direct_reads, lo, hi) with the count bounded to that side."""
    buffered = int(memory_room(blk.hw) // 2 // blk.stored_layer_bytes)  # most disk layers read buffered
    if hi[2] <= buffered:
        return [(False, lo, hi)]
    out = []
    if lo[2] <= buffered:
        capped = hi.copy()
        capped[2] = buffered
        out.append((False, lo, capped))
    raised = lo.copy()
    raised[2] = max(lo[2], buffered + 1)
    return [*out, (True, raised, hi)]


class _Solver:
    """Solves and prices candidates, keeping the feasible ones."""

    def __init__(self, model, hw, work, pins, capacity):
        self.model, self.hw, self.work, self.pins, self.capacity = model, hw, work, pins, capacity
        self._program, self.solves, self.ranked, self.seen = None, 0, {}, {}

    def run(self, template: Policy) -> float:
        """Predicted job time of the template's best placement (inf when none fits)."""
        resident = split_gpu_layers(template, self.model.num_layers)
        if resident is not None and self.hw.has_gpu and "weight_gpu" not in self.pins:
            L = self.model.num_layers  # the split's GPU layers resident (count_bounds fixes them): no staging
            template = replace(template, weight_gpu=resident / L, weight_cpu=1 - resident / L)
        key = template.to_json()
        if key in self.seen:
            return self.seen[key]
        blk = Block(self.model, self.hw, self.work, template, block_rows(template, self.work))
        best = None
        for direct, lo, hi in read_hypotheses(blk, *count_bounds(self.model, self.hw, self.pins, template.gbs,
                                                                  template)):
            side = replace(blk, direct_reads=direct)
            solution = memory_solution(side, lo, hi, self.capacity) or self.program.solve(side, lo, hi, self.capacity)
            self.solves += 1
            pred = solution and self._priced(solution.policy(template, self.model.num_layers))
            if pred is not None and not shortfalls(pred.peak_bytes, self.capacity):
                if best is None or pred.total_s < best[0].total_s:
                    best = (pred, solution)
        if best is None:
            self.seen[key] = float("inf")
            return self.seen[key]
        self.ranked[key] = (best[0].total_s, self.solves, *best)
        self.seen[key] = best[0].total_s
        return best[0].total_s


    @property
    def program(self) -> PlacementProgram:
        """The placement program, built when a candidate first needs it (`memory_solution` did not place it)."""
        if self._program is None:
            self._program = PlacementProgram()
        return self._program

    def _priced(self, policy: Policy) -> Prediction:
        return with_refill_choice(self.model, self.hw, self.work, policy, self.pins)


def with_refill_choice(model: ModelSpec, hw: HardwareSpec, work: Workload, policy: Policy,
                       pins: Mapping) -> Prediction:
    """The prediction of `policy` with refill on or off, whichever is faster (or as pinned): refill changes the
    time a job takes (rows that finish early free their slots), not the memory it needs. A job asks again when
    it has measured how many tokens its rows really generate (`Workload.expected_gen_len`)."""
    choices = (pins["refill"],) if "refill" in pins else (False, True)
    preds = [predict(model, hw, work, replace(policy, refill=r)) for r in choices]
    return min(preds, key=lambda p: p.total_s)


def search(model: ModelSpec, hw: HardwareSpec, work: Workload, pins: Mapping | None = None,
           budgets: dict | None = None, allow_compression: bool = False) -> Plan:
    """The fastest feasible policy for `work` on `hw`, honouring `pins`; PlanInfeasible when none fits.

    When the choices are many (a GPU: up to 36 device pairs x CPU attention x compression), a first stage ranks every
    mode at two reference block shapes and the second enumerates every block shape for the best TOP_MODES."""
    compiled.ops()  # the memory model asks which kernels run: a first run builds them here, timed as the build's own
    started, pins = time.perf_counter(), Pins(pins or {})
    if not hw.has_gpu and any(pins.get(f"{k}_gpu", 0) > 0 for k in KINDS):
        raise InvalidParamsError(f"{hw.name} has no GPU, but a gpu fraction is pinned above 0; pin it to 0")
    solver = _Solver(model, hw, work, pins, capacities(hw, budgets))
    shapes = block_shapes(work, pins)
    choices = modes(model, hw, pins, allow_compression, solver.capacity["gpu"], work.dtype_bytes)
    if len(shapes) * len(choices) > FULL_ENUMERATION:
        score = [min(solver.run(Policy(gbs=g, num_gb=k, **m)) for g, k in reference_shapes(shapes))
                 for m in choices]
        choices = [choices[i] for i in np.argsort(score, kind="stable")[:TOP_MODES]]
    for (gbs, num_gb), mode in itertools.product(shapes, choices):
        solver.run(Policy(gbs=gbs, num_gb=num_gb, **mode))
    if not solver.ranked:
        raise leanest_shortfall(model, hw, work, pins, solver.capacity, allow_compression)
    ranked = sorted(solver.ranked.values(), key=lambda r: (r[0], r[1]))
    seconds = time.perf_counter() - started
    log.info("searched %d discrete choices (%d feasible) in %.2f s", solver.solves, len(ranked), seconds)
    alternatives = tuple(distinct([r[2] for r in ranked])[1: 1 + TOP_ALTERNATIVES])
    return Plan(ranked[0][2], alternatives, ranked[0][3].memory_use, solver.capacity, pins, solver.solves, seconds)


def distinct(predictions: list[Prediction]) -> list[Prediction]:
    """Drop predictions that repeat an earlier one's time and policy up to CPU attention (which changes nothing
    when no cache part is away from its compute device)."""
    out, seen = [], set()
    for p in predictions:
        key = (f"{p.total_s:.9g}", p.policy.to_json().replace('"cpu_attention": false', '"cpu_attention": true'))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def leanest_shortfall(model, hw, work, pins, capacity, allow_compression) -> PlanInfeasible:
    """The tier short in the leanest candidate (one row per block, the rest of the memory wherever it is
    largest), and by how much."""
    lean = {"gbs": 1, "num_gb": 1, **({"compress_weight": True, "compress_cache": True} if allow_compression
                                      else {}), **pins}
    template = Policy(**{k: v for k, v in lean.items() if k not in FRACTION_NAMES and k in POLICY_FIELDS})
    best = None
    for spread in _spreads(pins, hw):
        policy = Policy(**{**template.to_dict(), **spread})
        need = memory_need(model, hw, work, policy, block_rows(policy, work))
        worst = max(shortfalls(need, capacity), key=lambda s: s[2] - s[3], default=None)
        if worst is not None and (best is None or worst[2] - worst[3] < best[2] - best[3]):
            best = worst
    phase, tier, need_b, have_b = best or ("prefill", "cpu", 0.0, 0.0)
    return PlanInfeasible(tier, need_b, have_b, f"at {phase}")


def _spreads(pins: Mapping, hw: HardwareSpec):
    """Placements that put each kind wholly on one tier (pins kept)."""
    tiers = TIERS if hw.has_gpu else ("cpu", "disk")
    for choice in itertools.product(tiers, repeat=len(KINDS)):
        spread = {}
        for kind, tier in zip(KINDS, choice):
            spread[f"{kind}_gpu"] = pins.get(f"{kind}_gpu", 1.0 if tier == "gpu" else 0.0)
            spread[f"{kind}_cpu"] = pins.get(f"{kind}_cpu", 1.0 if tier == "cpu" else 0.0)
        try:
            Policy(**spread)
        except InvalidParamsError:
            continue
        yield spread
