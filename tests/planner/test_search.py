"""The search: known optima, pins, feasibility without solving, infeasibility, monotonicity."""

from dataclasses import replace

import pytest

from engine.errors import InvalidParamsError
from engine.policy import Policy
from planner.cost_model import Block, channel_rates, disk_reads_direct
from planner.errors import PlanInfeasible
from planner.predict import capacities, memory_need, shortfalls
from planner.search import search
from planner.workload import Workload
from tests.planner.specs import LLAMA_300M, llama, server_cpu

WORK = Workload(prompt_len=128, gen_len=32, num_prompts=64)
GIB = 2**30


def test_everything_fits_on_the_cpu_so_everything_goes_there():
    plan = search(LLAMA_300M, server_cpu(), WORK)
    pol = plan.policy
    assert (pol.weight_cpu, pol.cache_cpu, pol.act_cpu) == (1.0, 1.0, 1.0)
    assert (pol.prefill_device, pol.decode_device) == ("cpu", "cpu")
    assert not pol.compress_weight and not pol.compress_cache  # lossless unless allowed
    assert plan.prediction.block_rows == 64  # the largest block amortizes each layer's weights best


def test_placement_is_in_whole_layers_and_rows():
    plan = search(LLAMA_300M, server_cpu(), WORK, budgets={"cpu": 0.6 * GIB})
    pol = plan.policy
    assert pol.weight_disk > 0  # 0.6 GiB cannot hold the weights, the block's cache and the staging
    assert (pol.weight_cpu * 20) == pytest.approx(round(pol.weight_cpu * 20))
    assert (pol.cache_cpu * pol.gbs) == pytest.approx(round(pol.cache_cpu * pol.gbs))
    need = memory_need(LLAMA_300M, server_cpu(), WORK, pol, plan.prediction.block_rows)
    assert not shortfalls(need, capacities(server_cpu(), {"cpu": 0.6 * GIB}))
    assert max(plan.memory_use.values()) > 0.9  # the CPU tier binds


def test_pins_are_kept_and_the_rest_is_filled_in():
    pins = {"gbs": 8, "num_gb": 2, "compress_weight": True, "weight_gpu": 0.0, "weight_cpu": 0.5}
    plan = search(LLAMA_300M, server_cpu(), WORK, pins=pins)
    pol = plan.policy
    assert (pol.gbs, pol.num_gb, pol.compress_weight, pol.weight_cpu, pol.weight_disk) == (8, 2, True, 0.5, 0.5)
    assert plan.pins == pins


def test_bad_pins_are_refused():
    with pytest.raises(InvalidParamsError, match="cannot pin"):
        search(LLAMA_300M, server_cpu(), WORK, pins={"batch": 3})
    with pytest.raises(InvalidParamsError, match="no GPU"):
        search(LLAMA_300M, server_cpu(), WORK, pins={"weight_gpu": 0.5})


def test_hand_built_policies_feasible_or_not_without_solving():
    hw, cap = server_cpu(), capacities(server_cpu(), {"cpu": 1 * GIB})
    fits = Policy(gbs=8, num_gb=1)
    assert not shortfalls(memory_need(LLAMA_300M, hw, WORK, fits, 8), cap)
    too_big = Policy(gbs=64, num_gb=1)  # 64 rows x 160 slots of KV: 0.8 GiB on top of 0.5 GiB of weights
    short = shortfalls(memory_need(LLAMA_300M, hw, WORK, too_big, 64), cap)
    assert {(phase, tier) for phase, tier, _, _ in short} == {("prefill", "cpu"), ("decode", "cpu")}
    offloaded = Policy(gbs=64, num_gb=1, weight_cpu=0.0, cache_cpu=0.5)
    assert not shortfalls(memory_need(LLAMA_300M, hw, WORK, offloaded, 64), cap)


def test_infeasible_names_the_short_tier_and_by_how_much():
    with pytest.raises(PlanInfeasible) as e:
        search(LLAMA_300M, server_cpu(), WORK, budgets={"cpu": 0.05 * GIB})
    assert e.value.tier == "cpu"
    assert e.value.have_bytes == 0.05 * GIB
    assert 0 < e.value.short_bytes == e.value.need_bytes - e.value.have_bytes
    assert "cpu tier is short by" in str(e.value)


@pytest.mark.parametrize("budgets_gib", [(0.4, 0.6, 1.0, 2.0, 8.0)])
def test_more_memory_is_never_slower(budgets_gib):
    times = [search(LLAMA_300M, server_cpu(), WORK, budgets={"cpu": b * GIB}).prediction.total_s
             for b in budgets_gib]
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(times, times[1:])), times


def test_a_bigger_model_is_never_faster():
    sizes = [llama(hidden=512, ffn=1408, layers=8, heads=8, kv_heads=8, vocab=32000),
             llama(hidden=512, ffn=1408, layers=16, heads=8, kv_heads=8, vocab=32000), LLAMA_300M]
    for budget in (None, {"cpu": 0.5 * GIB}):
        times = [search(m, server_cpu(), WORK, budgets=budget).prediction.total_s for m in sizes]
        assert times == sorted(times), times


def test_compression_is_chosen_only_when_allowed_and_worth_it():
    tight = {"cpu": 0.45 * GIB}
    lossless = search(LLAMA_300M, server_cpu(), WORK, budgets=tight)
    lossy = search(LLAMA_300M, server_cpu(), WORK, budgets=tight, allow_compression=True)
    assert not lossless.policy.compress_weight and not lossless.policy.compress_cache
    assert lossy.prediction.total_s <= lossless.prediction.total_s


def test_explanation_names_the_binding_tier_and_the_alternatives():
    from planner.explain import explain_text

    plan = search(LLAMA_300M, server_cpu(), WORK, budgets={"cpu": 0.6 * GIB})
    text = explain_text(plan, LLAMA_300M, server_cpu())
    assert "cpu memory at prefill" in text
    assert text.count("prefill=cpu decode=cpu") >= 3  # the chosen policy and its alternatives


def test_a_pinned_split_gets_its_layer_from_the_search():
    from planner.hardware import load_hardware
    from tests.planner.test_flexinfer import SPR_H100

    plan = search(LLAMA_300M, load_hardware(SPR_H100), WORK, pins={"decode_device": "split"})
    assert plan.policy.decode_device == "split" and 1 <= plan.policy.decode_split_layer < 20


def test_refill_is_chosen_when_rows_finish_early_and_not_otherwise():
    from planner.predict import predict

    model, hw, shape = LLAMA_300M, server_cpu(), {"gbs": 64, "num_gb": 1}
    early = Workload(64, 256, 512, expected_gen_len=40.0)
    full = Workload(64, 256, 512)
    assert search(model, hw, early, pins=shape).policy.refill
    assert not search(model, hw, full, pins=shape).policy.refill
    plan = search(model, hw, early, pins=shape)
    blocks = predict(model, hw, early, replace(plan.policy, refill=False))
    assert plan.prediction.total_s < 0.95 * blocks.total_s  # fewer steps than blocks whose finished rows leave
    assert not search(model, hw, early, pins={"refill": False, **shape}).policy.refill


def test_without_refill_a_block_is_priced_at_the_rows_still_live():
    """Finished rows leave their GPU batch: without refill the decode steps of a block whose rows generate 64 of
    256 tokens on average are priced at a quarter of its rows (gbs 16 -> 4), so the block costs less than a
    block whose rows all run to the end, and the same when they do."""
    from planner.cost_model import Block
    from planner.predict import block_seconds, live_block, phase_cost

    model, hw, policy = LLAMA_300M, server_cpu(), Policy(gbs=16, num_gb=2)
    early, full = Workload(64, 256, 512, expected_gen_len=64.0), Workload(64, 256, 512)
    blk = Block(model, hw, early, policy, 32)
    live = live_block(blk)
    assert (live.policy.gbs, live.rows, live.batches) == (4, 8, (4, 4))
    seconds, pre, _ = block_seconds(blk)
    assert seconds == pytest.approx(pre.step_s + 255 * phase_cost(live, "decode").step_s)
    assert seconds < block_seconds(Block(model, hw, full, policy, 32))[0]
    assert live_block(Block(model, hw, full, policy, 32)).policy.gbs == 16
    assert live_block(Block(model, hw, early, replace(policy, refill=True), 32)).policy.gbs == 4  # block_seconds skips it
    grouped = Workload(64, 256, 512, expected_gen_len=64.0, block_gen_len=128.0)  # max_new_tokens vary per row
    blk = Block(model, hw, grouped, policy, 32)
    assert live_block(blk).policy.gbs == 8  # 64 of 128 tokens: half the rows live
    assert block_seconds(blk)[0] == pytest.approx(pre.step_s + 127 * phase_cost(live_block(blk), "decode").step_s)
    with pytest.raises(InvalidParamsError, match="block_gen_len=32"):
        Workload(64, 256, 512, expected_gen_len=64.0, block_gen_len=32)


def test_refill_is_priced_at_its_shared_cursor_span_and_sorted_blocks_at_their_own():
    """Refill's rows share one cache cursor, so its decode attention walks the longest prompt plus the rows'
    generation (max_prompt_len + gen_len / 2), while a block of rows grouped by max_new_tokens walks its own
    prompts and the tokens it runs for (prompt_len + block_gen_len / 2). So on W4's shape (long prompts of
    varied length, varied max_new_tokens) the sorted blocks are chosen, as measured there (refill 0.78x sorted),
    and refill where rows share one max_new_tokens and half of them stop early (as measured: refill 1.5x)."""
    from engine.memory.footprint import kv_slot_bytes
    from planner.cost_model import decode_kv_bytes
    from planner.search import with_refill_choice

    model, hw, policy = llama(hidden=128, ffn=352, layers=10, heads=4, kv_heads=4, vocab=512, context=1024), \
        server_cpu(), Policy(gbs=32, num_gb=1)
    w4 = Workload(394, 256, 512, max_prompt_len=512, dtype="float32", expected_gen_len=67.4, block_gen_len=160.0)
    slot = kv_slot_bytes(model, 4, False)
    assert decode_kv_bytes(Block(model, hw, w4, replace(policy, refill=True), 32)) == 32 * (512 + 128) * slot
    assert decode_kv_bytes(Block(model, hw, w4, policy, 32)) == 32 * (394 + 80) * slot
    assert not with_refill_choice(model, hw, w4, policy, {}).policy.refill
    one_length = Workload(51, 256, 512, max_prompt_len=64, dtype="float32", expected_gen_len=129.0)
    assert with_refill_choice(model, hw, one_length, policy, {}).policy.refill


@pytest.mark.parametrize("budget_gib", [None, 1.5, 0.6])
def test_an_all_memory_placement_is_the_programs_optimum_and_skips_it(budget_gib, monkeypatch):
    """Without a GPU, the direct all-in-memory placement equals the program's solution for every candidate where
    it applies (same counts, objective and memory use, or the same objective at a tie); a budget too small for it leaves the program to place."""
    from planner import program as program_module
    from planner import search as search_module

    budgets = {"cpu": budget_gib * GIB} if budget_gib else None
    checked, solved, ties = [], [], []
    real = program_module.memory_solution

    def compared(blk, lo, hi, capacity):
        direct = real(blk, lo, hi, capacity)
        if direct is not None:
            exact = program_module.PlacementProgram().solve(blk, lo, hi, capacity)
            assert exact.objective_s == pytest.approx(direct.objective_s, rel=1e-6)
            if exact.counts == direct.counts:
                assert exact.memory_use == pytest.approx(direct.memory_use)
            else:  # a tie: the program may move what costs nothing to move (e.g. activations) off CPU memory
                ties.append(blk.policy)
                assert max(direct.memory_use.values()) <= 1.0
            checked.append(blk.policy)
        else:
            solved.append(blk.policy)
        return direct

    monkeypatch.setattr(search_module, "memory_solution", compared)
    search(LLAMA_300M, server_cpu(), WORK, budgets=budgets, allow_compression=True)
    if budget_gib == 0.6:  # the larger blocks no longer fit in memory: those go to the program
        assert solved and checked
    else:
        assert len(checked) > 10
    assert len(ties) <= len(checked) // 4  # same placement, not just the same time, almost everywhere


def test_a_plan_that_fits_in_memory_imports_no_solver():
    import subprocess
    import sys

    code = ("import sys; from planner.search import search; from planner.workload import Workload; "
            "from tests.planner.specs import LLAMA_300M, server_cpu; "
            "search(LLAMA_300M, server_cpu(), Workload(prompt_len=128, gen_len=32, num_prompts=64)); "
            "print('cvxpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_under_a_binding_memory_limit_the_plan_counts_its_disk_scratch_in_cpu_memory():
    """A KV cache on the disk tier is memory-mapped scratch whose page cache a memory cgroup charges: with a
    fast disk the free plan spills the cache there; under a binding limit the same budget must hold it too."""
    fast_disk = replace(server_cpu(), disk_read_bytes_per_s=5e9, disk_write_bytes_per_s=5e9)
    work, budget = Workload(prompt_len=128, gen_len=256, num_prompts=256), {"cpu": 1.0 * GIB}
    free = search(LLAMA_300M, fast_disk, work, budgets=budget)
    assert free.policy.cache_disk > 0  # what was killed at the limit
    limited_hw = replace(fast_disk, memory_room_bytes=1.25 * GIB, memory_limit_binds=True)
    limited = search(LLAMA_300M, limited_hw, work, budgets=budget)
    need = memory_need(LLAMA_300M, limited_hw, work, limited.policy, limited.prediction.block_rows)
    mapped = {phase: need[phase]["cpu"] for phase in need}
    assert max(mapped.values()) <= GIB * (1 + 1e-9)
    unlimited_need = memory_need(LLAMA_300M, fast_disk, work, limited.policy, limited.prediction.block_rows)
    assert all(mapped[p] >= unlimited_need[p]["cpu"] for p in mapped)


def test_the_disk_rate_priced_follows_how_the_engine_will_read_the_disk_tier():
    """Disk-tier weights above half the room are read with O_DIRECT at the disk rate, below it through the page
    cache: the search solves both sides of that step and its prediction agrees with the rule."""
    slow_disk = replace(server_cpu(), disk_read_bytes_per_s=0.2e9, page_cache_bytes_per_s=20e9)
    layer = LLAMA_300M.params_per_layer * 2
    disk_layers = {}
    for room_layers, pins in ((4, {}), (4, {"weight_gpu": 0.0, "weight_cpu": 0.5}), (40, {})):
        hw = replace(slow_disk, memory_room_bytes=room_layers * layer)
        plan = search(LLAMA_300M, hw, WORK, budgets={"cpu": 0.6 * GIB}, pins=pins)
        disk_layers[room_layers, len(pins)] = n = round(plan.policy.weight_disk * LLAMA_300M.num_layers)
        blk = Block(LLAMA_300M, hw, WORK, plan.policy, plan.prediction.block_rows)
        assert disk_reads_direct(blk) == (n > room_layers // 2)
        rate = slow_disk.disk_read_bytes_per_s if disk_reads_direct(blk) else slow_disk.page_cache_bytes_per_s
        assert channel_rates(blk)["disk_read"] == rate
    # a slow direct read is avoided where a buffered disk tier or none fits; pinned to half, it is priced
    assert disk_layers[4, 0] == 0 and disk_layers[4, 2] == 10 and 0 < disk_layers[40, 0] <= 20


def test_the_roofline_is_the_busiest_channel_and_never_above_the_prediction():
    """A step's bound is its busiest channel summed over the layers (the head counted as compute): weights read from
    the disk at every step make a disk-bound step whose bound is the disk channel alone, and weights in memory
    a compute-bound one; the job's bound adds the steps up as its prediction does and is never above it."""
    from planner.cost_model import CHANNELS
    from planner.predict import predict

    model, hw, work = LLAMA_300M, server_cpu(), Workload(64, 16, 4)
    on_disk = predict(model, hw, work, Policy(gbs=1, num_gb=1, weight_gpu=0.0, weight_cpu=0.0))
    in_memory = predict(model, hw, work, Policy(gbs=1, num_gb=1))
    for pred in (on_disk, in_memory):
        for step in (pred.prefill, pred.decode):
            totals = {c: sum(step.layers[d] * step.channels_s[d][c] for d in step.layers) for c in CHANNELS}
            assert step.bound_s == pytest.approx(max(totals["disk_read"], totals["compute"] + step.head_s))
            assert 0 < step.bound_s <= step.step_s
        assert 0 < pred.bound_s <= pred.total_s
        assert pred.bound_s == pytest.approx(pred.num_blocks * (pred.prefill.bound_s + 15 * pred.decode.bound_s))
    dec = on_disk.decode
    assert dec.bound_s == pytest.approx(sum(dec.layers[d] * dec.channels_s[d]["disk_read"] for d in dec.layers))
    assert in_memory.decode.bound_s < dec.bound_s
