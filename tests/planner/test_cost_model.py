"""Cost and memory terms against figures worked by hand for SMALL (hidden 64, FFN 128, 4 heads, 2 KV heads of
16, 2 layers, vocab 100, tied) on a CPU with a flat 100 GFLOP/s GEMM rate."""

from dataclasses import replace

import pytest

from engine.errors import InvalidParamsError
from engine.memory import footprint as fp
from engine.policy import Policy
from planner import cost_model as cm
from planner import memory_model as mm
from planner.hardware import HardwareSpec
from planner.predict import memory_need, predict
from planner.workload import Workload, placement_vector
from tests.planner.specs import LLAMA_300M, SMALL, cpu_machine, flat_cpu

WORK = Workload(prompt_len=8, gen_len=4, num_prompts=4)  # bf16
POLICY = Policy(gbs=2, num_gb=2)  # everything on the CPU, one block of 4 rows in 2 GPU batches


def block(policy=POLICY, hw=None):
    return cm.Block(SMALL, hw or cpu_machine(), WORK, policy, rows=4)


def test_layer_and_cache_bytes():
    assert SMALL.params_per_layer == 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64 == 36992
    assert fp.linear_params(SMALL) == 36864
    assert fp.layer_bytes(SMALL, 2, compressed=False) == 73984
    # 4-bit, groups of 64 along `in`: 36 bytes (32 of codes, 4 of min and scale) per group per output row
    assert fp.layer_bytes(SMALL, 2, compressed=True) == (64 + 32 + 32 + 64 + 128 + 128 + 64 * 2) * 36 + 128 * 2
    assert fp.kv_slot_bytes(SMALL, 2, compressed=False) == 2 * 2 * 16 * 2 == 128
    assert fp.kv_slot_bytes(SMALL, 2, compressed=True) == 2 * 2 * 36  # one (padded) group per 16-wide head
    assert fp.global_bytes(SMALL, 2) == (100 * 64 + 64) * 2


def test_compute_terms():
    blk = block()
    assert cm.gemm_s(blk, "prefill", "cpu") == pytest.approx(2 * (2 * 16 * 36864 / 1e11))
    assert cm.gemm_s(blk, "decode", "cpu") == pytest.approx(2 * (2 * 2 * 36864 / 1e11))
    assert cm.prefill_attention_s(blk, "cpu") == pytest.approx(2 * (4 * 2 * 4 * 16 * 8 * 8 / 1e11))
    assert cm.decode_kv_bytes(blk) == 4 * (8 + 4 / 2) * 128  # rows * (s + n/2) * slot
    assert cm.decode_attention_s(blk, "cpu").at(cm.Affine().coef + [0, 1, 0, 0, 1, 0, 0, 1, 0]) == \
        pytest.approx(5120 / 1e9)
    assert cm.elementwise_s(blk, "prefill", "cpu") == pytest.approx(4 * 8 * (16 * 64 + 4 * 128) * 2 / 1e10)
    all_cpu = [0, 1, 0, 0, 1, 0, 0, 1, 0]
    assert cm.layer_calls_s(blk, "cpu").at(all_cpu) == pytest.approx(2e-4)
    assert cm.head_s(blk) == pytest.approx(2 * (2 * 100 * 64 * 2 / 1e11 + 2e-4))


def test_a_float32_cache_is_read_at_the_float32_attention_rate_where_the_profile_has_one():
    """The CPU's bf16 decode attention converts to float32 and runs ~3x fewer bytes/s than a float32 cache:
    a float32 workload's decode attention is priced at attention_f32_bytes_per_s (the bf16 rate where a spec
    has none); a bf16 or 4-bit cache keeps its own rate."""
    from planner.hardware import HardwareSpecError

    all_cpu = cm.Affine().coef + [0, 1, 0, 0, 1, 0, 0, 1, 0]
    f32 = replace(WORK, dtype="float32")
    plain = cm.decode_attention_s(cm.Block(SMALL, cpu_machine(), f32, POLICY, rows=4), "cpu").at(all_cpu)
    assert plain == pytest.approx(2 * 5120 / 1e9)  # twice the bytes at the bf16 rate (1 GB/s)
    hw = cpu_machine()
    hw = replace(hw, cpu=replace(hw.cpu, attention_f32_bytes_per_s=4e9))
    assert cm.decode_attention_s(cm.Block(SMALL, hw, f32, POLICY, rows=4), "cpu").at(all_cpu) == \
        pytest.approx(2 * 5120 / 4e9)
    assert cm.decode_attention_s(block(hw=hw), "cpu").at(all_cpu) == pytest.approx(5120 / 1e9)  # bf16: its own
    assert hw.cpu.attention_bytes_per_s(True, 4) == hw.cpu.attention_4bit_bytes_per_s
    with pytest.raises(HardwareSpecError, match="attention_f32_bytes_per_s"):
        replace(hw.cpu, attention_f32_bytes_per_s=-1.0)


def test_prefill_decode_and_block_time():
    p = predict(SMALL, cpu_machine(), WORK, POLICY)
    prefill_layer = 2 * 2 * 16 * 36864 / 1e11 + 2 * 4 * 2 * 4 * 16 * 64 / 1e11 + 4 * 8 * 1536 * 2 / 1e10 + 2e-4
    head = 2 * (2 * 100 * 64 * 2 / 1e11 + 2e-4)
    assert p.prefill_s == pytest.approx(2 * prefill_layer + head)
    decode_layer = 2 * 2 * 2 * 36864 / 1e11 + 5120 / 1e9 + 4 * 1536 * 2 / 1e10 + 2e-4
    assert p.decode_token_s == pytest.approx(2 * decode_layer + head)
    assert p.block_s == pytest.approx(p.prefill_s + 3 * p.decode_token_s)  # T = T_pre + (n - 1) T_gen
    assert p.total_s == pytest.approx(p.block_s) and p.num_blocks == 1
    assert p.tokens_per_s == pytest.approx(4 * 4 / p.total_s)


def test_plain_disk_weights_are_faulted_in_by_the_main_thread():
    on_disk = Policy(gbs=2, num_gb=2, weight_cpu=0.0)
    base = predict(SMALL, cpu_machine(), WORK, POLICY)
    p = predict(SMALL, cpu_machine(), WORK, on_disk)  # warm: the page cache holds the layer files
    assert p.decode.prefetch_s["cpu"] == 0  # safetensors maps the file; nothing is read ahead
    assert p.decode.main_s["cpu"] == pytest.approx(base.decode.main_s["cpu"] + 73984 / 1e9)
    assert p.total_s == pytest.approx(base.total_s + 2 * 4 * 73984 / 1e9)  # layers x steps


def test_4bit_disk_weights_hide_behind_compute_unless_the_cores_are_shared():
    w4 = fp.layer_bytes(SMALL, 2, compressed=True)
    dequant = 36992 * 2 / 1e9
    base = predict(SMALL, cpu_machine(overlap=1.0), WORK, Policy(gbs=2, num_gb=2, compress_weight=True))
    hidden = predict(SMALL, cpu_machine(overlap=1.0), WORK, Policy(gbs=2, num_gb=2, compress_weight=True,
                                                                   weight_cpu=0.0))
    assert hidden.decode.prefetch_s["cpu"] == pytest.approx(w4 / 1e9 + dequant)
    assert hidden.total_s == pytest.approx(base.total_s)
    shared = predict(SMALL, cpu_machine(overlap=-1.0), WORK, Policy(gbs=2, num_gb=2, compress_weight=True,
                                                                    weight_cpu=0.0))
    assert shared.decode.main_s["cpu"] == pytest.approx(base.decode.main_s["cpu"] + 2 * (w4 / 1e9 + dequant))


def test_disk_weights_larger_than_half_the_room_are_read_direct_by_the_prefetch_thread_at_the_disk_rate():
    on_disk = Policy(gbs=2, num_gb=2, weight_cpu=0.0)  # 2 layers of 73984 bytes on disk
    base = predict(SMALL, cpu_machine(), WORK, POLICY)
    for room in (100_000, 2 * 2 * 73984 - 2):  # the machine's memory, or the planning process's room
        tight = replace(cpu_machine(), memory_room_bytes=room) if room > 100_000 else cpu_machine(memory_bytes=room)
        assert cm.disk_reads_direct(block(on_disk, tight)) and not cm.disk_is_warm(block(on_disk, tight))
        cold = predict(SMALL, tight, WORK, on_disk)
        assert cold.decode.prefetch_s["cpu"] == pytest.approx(73984 / 1e8)  # read whole, O_DIRECT, ahead
        assert cold.decode.main_s["cpu"] == pytest.approx(base.decode.main_s["cpu"])
    roomy = replace(cpu_machine(), memory_room_bytes=2 * 2 * 73984)  # exactly half: read through the page cache
    assert not cm.disk_reads_direct(block(on_disk, roomy)) and cm.disk_is_warm(block(on_disk, roomy))
    assert predict(SMALL, roomy, WORK, on_disk).decode.main_s["cpu"] == \
        pytest.approx(base.decode.main_s["cpu"] + 73984 / 1e9)
    assert not cm.disk_reads_direct(block(POLICY, cpu_machine(memory_bytes=10)))  # nothing on disk


def test_a_binding_memory_limit_counts_the_disk_tiers_mapped_scratch_in_cpu_memory():
    """Activations and a 4-bit cache on the disk tier are mapped files whose page cache a binding limit charges; a
    plain cache there bypasses it (direct I/O) and holds two one-layer buffers in memory instead."""
    free, limited = cpu_machine(), replace(cpu_machine(), memory_room_bytes=5e8, memory_limit_binds=True)
    act = mm.act_block_bytes(SMALL, WORK, 4)
    for compress in (False, True):
        spilled = Policy(gbs=2, num_gb=2, cache_cpu=0.5, act_cpu=0.5, compress_cache=compress)
        in_memory = Policy(gbs=2, num_gb=2, compress_cache=compress)
        kv = mm.kv_block_bytes(SMALL, WORK, 4, compress)
        base, counted = memory_need(SMALL, free, WORK, spilled, 4), memory_need(SMALL, limited, WORK, spilled, 4)
        whole = memory_need(SMALL, free, WORK, in_memory, 4)
        buffers = 0.0 if compress else 0.5 * kv / SMALL.num_layers  # the disk rows' K and V of one layer
        for phase in ("prefill", "decode"):
            assert base[phase]["cpu"] == pytest.approx(whole[phase]["cpu"] - 0.5 * kv - 0.5 * act + buffers)
            assert counted[phase]["cpu"] == pytest.approx(base[phase]["cpu"] + 0.5 * act + (0.5 * kv if compress
                                                                                            else 0.0))
            assert counted[phase]["disk"] == pytest.approx(base[phase]["disk"])  # the files are on disk too
        assert cm.disk_is_warm(block(spilled, limited))


def test_a_plain_disk_cache_is_priced_at_the_cold_disk_rate_even_when_the_weights_are_warm():
    spilled = Policy(gbs=2, num_gb=2, cache_cpu=0.5)
    blk = block(spilled)
    assert cm.disk_is_warm(blk)  # nothing read with O_DIRECT: the shared disk channel is at the page-cache rate
    assert cm.kv_disk_scale(blk, "disk_read") == pytest.approx(1e9 / 1e8)
    assert cm.kv_disk_scale(block(Policy(gbs=2, num_gb=2, cache_cpu=0.5, compress_cache=True)), "disk_read") == 1.0
    R = cm.decode_kv_bytes(blk)
    assert predict(SMALL, cpu_machine(), WORK, spilled).decode.main_s["cpu"] >= 0.5 * R / 1e8


def test_compression_moves_fewer_bytes_and_adds_dequantization():
    p = predict(SMALL, cpu_machine(), WORK, Policy(gbs=2, num_gb=2, compress_weight=True))
    base = predict(SMALL, cpu_machine(), WORK, POLICY)
    assert p.prefill.prefetch_s["cpu"] == pytest.approx(36992 * 2 / 1e9)  # dequant of one layer per step
    assert p.peak_bytes["prefill"]["cpu"] < base.peak_bytes["prefill"]["cpu"] + 2 * 36992 * 2


def _with_kernel(fmt: str, gflops: float) -> HardwareSpec:
    hw = cpu_machine()
    return replace(hw, cpu=replace(hw.cpu, kernel_gflop_per_s={fmt: (gflops,)}))


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_faster_compressed_kernel_is_priced_at_its_rate_without_dequantization(fmt):
    policy = Policy(gbs=2, num_gb=2, compress_weight=True, weight_format=fmt)
    fast = predict(SMALL, _with_kernel(fmt, 400.0), WORK, policy)
    assert cm.kernel_batches(block(policy, _with_kernel(fmt, 400.0)), "decode", "cpu") == [True, True]
    assert fast.decode.prefetch_s["cpu"] == 0.0  # nothing dequantized
    kernel_layer = 2 * 2 * 2 * 36864 / 4e11 + 5120 / 1e9 + 4 * 1536 * 2 / 1e10 + 2e-4
    head_rate = 4e11 if fmt == "int8" else 1e11  # an int8 head computes with the int8 kernel (head_in_int8)
    assert fast.decode_token_s == pytest.approx(2 * kernel_layer + 2 * (2 * 100 * 64 * 2 / head_rate + 2e-4))


def test_the_kernel_is_priced_where_the_engines_rule_takes_it_however_slow(monkeypatch):
    """The engine's kernel choice is a rule of the machine class, format, dtype and rows, never a timing
    (engine/kernels/gemm_choice.py): the planner prices the path the rule takes, a slow kernel at its slow rate;
    past the rule's row limit, and for int4 layers not kept in memory, dequantization and the GEMM."""
    policy = Policy(gbs=2, num_gb=2, compress_weight=True)
    slow, without = predict(SMALL, _with_kernel("int4", 1.0), WORK, policy), predict(SMALL, cpu_machine(), WORK, policy)
    assert all(cm.kernel_batches(block(policy, _with_kernel("int4", 1.0)), "decode", "cpu"))
    assert slow.total_s > 2 * without.total_s
    staged = Policy(gbs=2, num_gb=2, compress_weight=True, weight_cpu=0.5)  # int4 packs only resident layers
    assert not any(cm.kernel_batches(block(staged, _with_kernel("int4", 400.0)), "decode", "cpu"))
    monkeypatch.setattr(cm, "max_rows", lambda *a: 1)  # a decode call of a GPU batch has 2 rows
    assert not any(cm.kernel_batches(block(policy, _with_kernel("int4", 400.0)), "decode", "cpu"))


def test_peak_memory_by_hand():
    need = memory_need(SMALL, cpu_machine(), WORK, POLICY, rows=4)
    home = 2 * 73984 + (100 * 64 + 64) * 2 + 4 * 12 * 2 * 128 + 4 * 8 * 64 * 4  # float32 activations
    per_token = 2 * 64 + 2 * 32 + 2 * 64 + 3 * 128  # q, k, v, attention out and MLP scratch
    assert need["prefill"]["cpu"] == home + 2 * 8 * per_token * 2 + 2 * 4 * 8 * 8 * 4
    assert need["decode"]["cpu"] == home + 2 * 1 * per_token * 2
    assert need["prefill"]["gpu"] == 0 and need["prefill"]["disk"] == 0
    on_disk = memory_need(SMALL, cpu_machine(), WORK, Policy(gbs=2, num_gb=2, weight_cpu=0.0), rows=4)
    assert on_disk["decode"]["disk"] == 2 * 73984
    assert on_disk["decode"]["cpu"] == need["decode"]["cpu"] - 2 * 73984 + 2 * 73984  # two staged layers


def gpu_machine() -> HardwareSpec:
    """The hand CPU plus a GPU 10x faster at everything, PCIe at 1 GB/s each way."""
    gpu = flat_cpu(memory_bytes=1e9, gflops=1000.0, layer_call_s=1e-5, step_call_s=1e-5)
    base = cpu_machine()
    return HardwareSpec("hand gpu", base.cpu, gpu=gpu, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9,
                        disk_read_bytes_per_s=1e8, disk_write_bytes_per_s=5e7, disk_bytes=1e12,
                        page_cache_bytes_per_s=1e9)


def test_gpu_prefill_stores_its_kv_on_a_side_stream():
    """Prefill on the GPU into a CPU cache: the K/V stores form their own chain (a side stream), so the layer
    takes the max of it and the main chain, not their sum; decode has no store chain."""
    policy = Policy(gbs=2, num_gb=2, prefill_device="gpu", weight_gpu=1.0, weight_cpu=0.0, act_gpu=1.0, act_cpu=0.0)
    p = predict(SMALL, gpu_machine(), WORK, policy)
    store = 4 * 8 * 128 / 1e9  # rows * prompt * kv_slot_bytes over d2h
    assert p.prefill.store_s["gpu"] == pytest.approx(store)
    assert p.prefill.layer_s["gpu"] == pytest.approx(max(p.prefill.main_s["gpu"], p.prefill.prefetch_s["gpu"], store))
    assert p.prefill.channels_s["gpu"]["d2h"] == pytest.approx(store)
    assert p.decode.store_s["cpu"] == 0


def test_a_split_with_its_gpu_layers_resident_stages_nothing_on_the_gpu():
    resident = Policy(gbs=2, num_gb=2, weight_gpu=0.5, weight_cpu=0.5, prefill_device="split", prefill_split_layer=1,
                      decode_device="split", decode_split_layer=1)
    streamed = Policy(gbs=2, num_gb=2, weight_gpu=0.0, weight_cpu=1.0, prefill_device="split", prefill_split_layer=1,
                      decode_device="split", decode_split_layer=1)
    assert not mm.streams_to_gpu(resident, 2) and mm.streams_to_gpu(streamed, 2)
    for phase in ("prefill", "decode"):
        gap = mm.working_bytes(SMALL, WORK, streamed, phase)["gpu"] - mm.working_bytes(SMALL, WORK, resident, phase)["gpu"]
        assert gap == 2 * fp.layer_bytes(SMALL, 2, compressed=False)


def test_expected_gen_len_is_checked():
    from engine.errors import InvalidParamsError
    from planner.workload import Workload

    assert Workload(8, 16, 4).expected_gen_len == 16.0
    with pytest.raises(InvalidParamsError, match="expected_gen_len=20"):
        Workload(8, 16, 4, expected_gen_len=20)



def _with_reorder_gain(gain: float, memory_bytes=1e10) -> HardwareSpec:
    hw = cpu_machine(memory_bytes)
    return replace(hw, cpu=replace(hw.cpu, dense_reorder_gain={"bfloat16": (gain,)}))


def test_reordered_dense_weights_save_gemm_time_in_cpu_memory_only():
    """A 2x reordered GEMM halves the GEMM seconds of the weights it reorders: every weight of LLAMA_300M is large
    enough (>= 1M params), so all of them, on the layers kept in CPU memory."""
    work, policy = Workload(prompt_len=64, gen_len=8, num_prompts=8), Policy(gbs=8, num_gb=1)
    blk = cm.Block(LLAMA_300M, _with_reorder_gain(2.0), work, policy, rows=8)
    assert cm.reordered_share(LLAMA_300M) == 1.0
    for phase in ("prefill", "decode"):
        saved = cm.reorder_s(blk, phase, "cpu").at(placement_vector(policy))
        assert saved == pytest.approx(-cm.gemm_s(blk, phase, "cpu") / 2)
    half = Policy(gbs=8, num_gb=1, weight_cpu=0.5)  # disk layers are read, not reordered
    saved = cm.reorder_s(replace(blk, policy=half), "decode", "cpu").at(placement_vector(half))
    assert saved == pytest.approx(-cm.gemm_s(blk, "decode", "cpu") / 4)
    fast = predict(LLAMA_300M, _with_reorder_gain(2.0), work, policy)
    assert fast.total_s < predict(LLAMA_300M, cpu_machine(1e10), work, policy).total_s


def test_a_small_reordering_gain_is_priced_as_measured():
    """The engine reorders every large enough weight by rule (engine/kernels/gemm_choice.py), whatever the gain:
    a 1.05x gain saves 1 - 1/1.05 of the GEMM seconds."""
    work, policy = Workload(prompt_len=64, gen_len=8, num_prompts=8), Policy(gbs=8, num_gb=1)
    blk = cm.Block(LLAMA_300M, _with_reorder_gain(1.05), work, policy, rows=8)
    saved = cm.reorder_s(blk, "decode", "cpu").at(placement_vector(policy))
    assert saved == pytest.approx(-cm.gemm_s(blk, "decode", "cpu") * (1 - 1 / 1.05))


@pytest.mark.parametrize("why", ["compressed", "small weights", "other dtype", "not profiled"])
def test_no_saving_where_the_engine_keeps_weights_plain(why):
    work = Workload(prompt_len=64, gen_len=8, num_prompts=8, dtype="float32" if why == "other dtype" else "bfloat16")
    policy = Policy(gbs=8, num_gb=1, compress_weight=why == "compressed", weight_format="int8")
    hw = cpu_machine(1e10) if why == "not profiled" else _with_reorder_gain(2.0)
    blk = cm.Block(SMALL if why == "small weights" else LLAMA_300M, hw, work, policy, rows=8)
    assert cm.reorder_s(blk, "decode", "cpu").at(placement_vector(policy)) == 0.0


def test_a_scoring_prefill_prices_the_head_at_every_scored_position():
    """Workload.scored_len: a scoring job's prefill runs the LM head at that many positions per row, its decode at
    one: at a flat GEMM rate the head's FLOPs count 8 times, and only the prefill step grows, by exactly that."""
    from planner.predict import phase_cost

    plain = block()
    scoring = cm.Block(SMALL, cpu_machine(), replace(WORK, scored_len=8), POLICY, rows=4)
    assert cm.head_s(plain, 8) == pytest.approx(2 * (2 * 8 * 100 * 64 * 2 / 1e11 + 2e-4))
    grown = phase_cost(scoring, "prefill").step_s - phase_cost(plain, "prefill").step_s
    assert grown == pytest.approx((cm.head_s(plain, 8) - cm.head_s(plain)) * plain.hw.cpu_run_scale) and grown > 0
    assert phase_cost(scoring, "decode").step_s == pytest.approx(phase_cost(plain, "decode").step_s)
    with pytest.raises(InvalidParamsError, match="scored_len=-1"):
        replace(WORK, scored_len=-1)
