import dataclasses
import json
import logging
import math
import re

import pytest
import torch

from planner import profiler
from planner.errors import HardwareSpecError
from planner.hardware import PROCESS_FIELDS, DeviceSpec, HardwareSpec, load_hardware, save_hardware
from planner.plausibility import implausible
from tests.planner.specs import cpu_machine, flat_cpu


def test_matmul_rate_is_interpolated_in_log_rows_and_clamped():
    d = DeviceSpec(1e9, (1, 100), (1.0, 101.0), 1e9, 1e9, 1e9, 1e9)
    assert d.matmul_flop_per_s(10) == pytest.approx(51e9)  # log10(10) is half of log10(100)
    assert d.matmul_flop_per_s(0.5) == 1e9 and d.matmul_flop_per_s(1000) == 101e9
    assert d.matmul_flop_per_s(math.sqrt(10)) == pytest.approx(26e9)


def test_json_round_trip(tmp_path):
    spec = cpu_machine()
    path = save_hardware(spec, tmp_path / "hw.json")
    assert load_hardware(path) == spec
    assert json.loads(path.read_text())["gpu"] is None


@pytest.mark.parametrize("change, message", [
    (dict(h2d_bytes_per_s=1e9), "no gpu"),
    (dict(disk_read_bytes_per_s=0), "positive"),
    (dict(cpu_background_overlap=1.5), r"\[-3, 1\]"),
])
def test_bad_specs_are_refused(change, message):
    fields = dict(name="x", cpu=flat_cpu(), disk_read_bytes_per_s=1e8, disk_write_bytes_per_s=1e8, disk_bytes=1e9,
                  page_cache_bytes_per_s=1e9)
    with pytest.raises(HardwareSpecError, match=message):
        HardwareSpec(**{**fields, **change})


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(HardwareSpecError, match="does not exist"):
        load_hardware(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**cpu_machine().to_dict(), "gpu_tflops": 3}))
    with pytest.raises(HardwareSpecError, match="unknown hardware fields"):
        load_hardware(bad)
    rows = cpu_machine().to_dict()
    rows["cpu"]["matmul_rows"] = [4, 2]
    rows["cpu"]["matmul_gflop_per_s"] = [1, 2]
    bad.write_text(json.dumps(rows))
    with pytest.raises(HardwareSpecError, match="increasing"):
        load_hardware(bad)


def test_matmul_rate_by_rows_and_width():
    d = DeviceSpec(1e9, (1, 100), ((1.0, 11.0), (101.0, 201.0)), 1e9, 1e9, 1e9, 1e9, matmul_widths=(10, 1000))
    assert d.matmul_flop_per_s(1, 10) == 1e9 and d.matmul_flop_per_s(100, 1000) == 201e9
    assert d.matmul_flop_per_s(10, 100) == pytest.approx(((1 + 11) / 2 + (101 + 201) / 2) / 2 * 1e9)
    assert d.matmul_flop_per_s(10, 5) == pytest.approx(6e9)  # below the smallest width: held
    with pytest.raises(HardwareSpecError, match="for each width"):
        DeviceSpec(1e9, (1, 100), ((1.0, 11.0),), 1e9, 1e9, 1e9, 1e9, matmul_widths=(10, 1000))


def test_profiles_are_cached_per_machine_key(tmp_path, monkeypatch):
    from planner import profiler

    calls = []
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: calls.append(1) or _keyed(cpu_machine()))
    first = profiler.load_or_profile(tmp_path / "hardware.json")
    assert profiler.load_or_profile(tmp_path / "hardware.json") == first and len(calls) == 1
    monkeypatch.setattr(profiler, "machine_key", lambda: "another setup")
    profiler.load_or_profile(tmp_path / "hardware.json")
    assert len(calls) == 2  # measured again for the other key, and both are kept
    assert len(list(tmp_path.glob("hardware-*.json"))) == 2
    assert not (tmp_path / "hardware.json").exists()  # left to `flexbatch profile`: other versions read it


def test_a_changed_kernel_build_measures_the_machine_again(tmp_path, monkeypatch):
    """The profile holds the own kernels' rates: after their sources change (a new build key) the cached profile
    is not used; with the kernels off the key says so."""
    from engine.kernels import compiled
    from planner import profiler

    calls = []
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: calls.append(1) or _keyed(cpu_machine()))
    monkeypatch.setattr(compiled, "ops", lambda: object())
    monkeypatch.setattr(compiled, "build_key", lambda: "build-a")
    assert "kernels build-a" in profiler.machine_key()
    profiler.load_or_profile(tmp_path / "hardware.json")
    profiler.load_or_profile(tmp_path / "hardware.json")
    assert len(calls) == 1
    monkeypatch.setattr(compiled, "build_key", lambda: "build-b")
    profiler.load_or_profile(tmp_path / "hardware.json")
    assert len(calls) == 2
    monkeypatch.setattr(compiled, "ops", lambda: None)
    assert "no kernels" in profiler.machine_key() and "build-" not in profiler.machine_key()


def test_the_more_recently_measured_of_two_matching_profiles_is_used(tmp_path, monkeypatch):
    """`flexbatch profile` writes hardware.json; a per-key copy measured earlier (on a busy machine, say) must not
    shadow it, nor an older hardware.json a newer per-key copy."""
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: pytest.fail("a cached profile matches"))
    base = _keyed(cpu_machine())
    older, newer = (dataclasses.replace(base, name=name, sources={**base.sources, "measured_at": at})
                    for name, at in (("older", "2026-11-30T23:55:01Z"), ("newer", "2026-12-01T06:31:30Z")))
    path = tmp_path / "hardware.json"
    keyed = profiler.keyed_copy(path, profiler.machine_key())
    for in_path, in_keyed in ((newer, older), (older, newer)):
        save_hardware(in_path, path)
        save_hardware(in_keyed, keyed)
        assert profiler.load_or_profile(path).name == "newer"


def test_a_plausible_profile_measured_on_a_busier_machine_is_used_with_one_note(tmp_path, monkeypatch, caplog):
    """Measuring the profile again takes minutes inside the user's run (a 9 s job once took 73 s): a plausible one
    measured at a higher load is used as it is, and `flexbatch profile` is named as the way to measure it again."""
    busy = dataclasses.replace(_keyed(cpu_machine()), name="busy")
    busy.sources.update(load_average=9.0, cpus=2, measured_at="2026-12-01T01:11:07Z")
    save_hardware(busy, tmp_path / "hardware.json")
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: pytest.fail("a plausible profile is cached"))
    monkeypatch.setattr(profiler, "_noted", set())
    monkeypatch.setattr(profiler.os, "getloadavg", lambda: (1.5, 1.5, 1.5))  # quiet now
    with caplog.at_level(logging.INFO, logger="planner.profiler"):
        assert profiler.load_or_profile(tmp_path / "hardware.json").name == "busy"
        assert profiler.load_or_profile(tmp_path / "hardware.json").name == "busy"
    notes = [r.getMessage() for r in caplog.records if "busier than now" in r.getMessage()]
    assert len(notes) == 1 and "load average of 9.0" in notes[0] and "`flexbatch profile`" in notes[0]


STALLED = ((0.01, 4.0, 0.02, 1.5), (0.3, 0.01, 2.0, 3.9))  # GFLOP/s of 2 threads while another process held a core
HEALTHY = ((15.0, 140.0, 290.0, 300.0), (20.0, 170.0, 350.0, 380.0))


def _measured(curves=HEALTHY, **cpu):
    """A profile with a GEMM table of `curves` at 1 / 16 / 256 / 1024 rows for widths 512 and 2048."""
    spec = cpu_machine()
    return dataclasses.replace(spec, cpu=dataclasses.replace(
        spec.cpu, matmul_rows=(1, 16, 256, 1024), matmul_widths=(512, 2048), matmul_gflop_per_s=curves, **cpu))


@pytest.mark.parametrize("spec, why", [
    (_measured(STALLED), "cpu.matmul_gflop_per_s peaks at 4 GFLOP/s, below the 10"),
    (_measured(((15.0, 140.0, 2.0, 300.0), HEALTHY[1])),
     "cpu.matmul_gflop_per_s at width 512 falls from 140 GFLOP/s to 2 at 256 rows"),
    (_measured(kernel_gflop_per_s={"int4": ((40.0, 90.0, 90.0, 0.5), (40.0, 90.0, 90.0, 90.0))}),
     "cpu.kernel_gflop_per_s[int4] at width 512 falls from 90 GFLOP/s to 0.5 at 1024 rows"),
    (_measured(matmul_hot_gflop_per_s=(HEALTHY[0], (20.0, math.nan, 350.0, 380.0))),
     "cpu.matmul_hot_gflop_per_s at width 2048 = (20.0, nan, 350.0, 380.0) holds a rate that is not a positive"),
    (_measured(attention_prefill_lens=(32, 128, 512), attention_prefill_gflop_per_s=(30.0, 50.0, 1.0)),
     "cpu.attention_prefill_gflop_per_s falls from 50 GFLOP/s to 1 at 512-token prompts"),
])
def test_implausible_rate_tables_are_named(spec, why):
    assert why in implausible(spec)


def test_plausible_rate_tables_pass():
    from tests.planner.specs import server_cpu

    assert implausible(_measured()) is None
    assert implausible(server_cpu()) is None and implausible(cpu_machine()) is None
    levelled = ((15.0, 140.0, 300.0, 290.0), HEALTHY[1])  # a little slower at 1024 rows than at 256: noise
    assert implausible(_measured(levelled)) is None


def test_an_implausible_profile_is_measured_once_more_then_kept_with_a_warning(monkeypatch, caplog):
    calls = []

    def measuring(profiles):
        monkeypatch.setattr(profiler, "measure_this_machine",
                            lambda *args, **kw: calls.append(kw) or next(profiles))

    measuring(iter([_measured(STALLED), _measured()]))
    assert profiler.profile_this_machine() == _measured()
    assert calls == [{}, {"refresh_kernels": True}]  # the second time the kernels' figures are measured too
    calls.clear()
    measuring(iter([_measured(STALLED), _measured(STALLED)]))
    with caplog.at_level(logging.WARNING, logger="planner.profiler"):
        kept = profiler.profile_this_machine()
    assert len(calls) == 2 and kept.cpu == _measured(STALLED).cpu
    assert "cpu.matmul_gflop_per_s peaks at 4 GFLOP/s" in kept.sources["implausible"]
    assert re.search(r"implausible \(cpu.matmul_gflop_per_s peaks at 4 GFLOP/s.*kept as measured.*"
                     r"`flexbatch profile` when the machine is quieter.*OMP_NUM_THREADS=1", caplog.text)


def test_a_profile_that_cannot_settle_stops_after_a_bounded_time(monkeypatch, tmp_path):
    """A first measurement that took more than half the bound is not measured again: the whole profile ends within
    SETTLE_S, and later runs use what it kept instead of profiling again."""
    clock = [0.0]
    calls = []

    def measure(*args, **kw):
        clock[0] += 400.0  # as long as the AVX2 EPYC's profile took with the kernels off
        calls.append(1)
        return _keyed(_measured(STALLED))

    monkeypatch.setattr(profiler.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(profiler, "measure_this_machine", measure)
    first = profiler.load_or_profile(tmp_path / "hardware.json")
    assert calls == [1] and clock[0] <= profiler.SETTLE_S and "implausible" in first.sources
    assert profiler.load_or_profile(tmp_path / "hardware.json") == first and calls == [1]  # kept, not measured


def test_an_implausible_cached_profile_is_measured_again(tmp_path, monkeypatch):
    stalled = dataclasses.replace(_keyed(_measured(STALLED)), name="stalled")
    stalled.sources.update(load_average=1.0, cpus=2, measured_at="2026-12-01T01:11:07Z")  # not even busy
    save_hardware(stalled, tmp_path / "hardware.json")
    calls = []
    fresh = dataclasses.replace(_measured(), name="fresh", sources={**stalled.sources, "measured_at": "2026-12-02"})
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: calls.append(1) or fresh)
    assert profiler.load_or_profile(tmp_path / "hardware.json").name == "fresh"
    assert profiler.load_or_profile(tmp_path / "hardware.json").name == "fresh" and len(calls) == 1  # kept


def test_a_cached_profile_of_another_version_is_passed_over(tmp_path, monkeypatch):
    spec = _keyed(cpu_machine())
    stored = {**spec.to_dict(), "field_of_another_version": 1}
    stored.pop("memory_room_bytes"), stored.pop("memory_limit_binds")
    (tmp_path / "hardware.json").write_text(json.dumps(stored))
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: spec)
    assert profiler.load_or_profile(tmp_path / "hardware.json") == spec


def _keyed(spec):
    from dataclasses import replace

    from planner import profiler

    return replace(spec, sources={"machine": profiler.machine_key()})


def test_cache_hot_rates_apply_when_the_weights_stay_cached():
    from engine.policy import Policy
    from planner import cost_model as cm
    from planner.workload import Workload
    from tests.planner.specs import SMALL

    d = DeviceSpec(1e9, (1,), (10.0,), 1e9, 1e9, 1e9, 1e9, matmul_hot_gflop_per_s=(40.0,), cache_bytes=1e6)
    assert d.matmul_flop_per_s(8) == 10e9 and d.matmul_flop_per_s(8, hot=True) == 40e9
    hw = HardwareSpec("x", d, disk_read_bytes_per_s=1e8, disk_write_bytes_per_s=1e8, disk_bytes=1e9,
                      page_cache_bytes_per_s=1e9)
    blk = cm.Block(SMALL, hw, Workload(8, 4, 4), Policy(gbs=2, num_gb=2), rows=4)
    assert cm.weights_stay_cached(blk, "cpu")  # 2 layers x 74 KB < 1 MB
    assert cm.gemm_s(blk, "decode", "cpu") == pytest.approx(2 * 2 * 2 * 36864 / 40e9)


def test_float32_work_is_priced_at_the_float32_gemm_rates_where_they_were_measured():
    from engine.policy import Policy
    from planner import cost_model as cm
    from planner.workload import Workload
    from tests.planner.specs import SMALL

    d = DeviceSpec(1e9, (1,), (40.0,), 1e9, 1e9, 1e9, 1e9, matmul_hot_gflop_per_s=(80.0,), cache_bytes=1e6,
                   matmul_f32_gflop_per_s=(10.0,))
    assert d.matmul_flop_per_s(8, dtype="bfloat16") == 40e9 and d.matmul_flop_per_s(8, hot=True) == 80e9
    assert d.matmul_flop_per_s(8, dtype="float32") == d.matmul_flop_per_s(8, hot=True, dtype="float32") == 10e9
    plain = dataclasses.replace(d, matmul_f32_gflop_per_s=())
    assert plain.matmul_flop_per_s(8, dtype="float32") == 40e9  # not measured: the main table
    hw = HardwareSpec("x", d, disk_read_bytes_per_s=1e8, disk_write_bytes_per_s=1e8, disk_bytes=1e9,
                      page_cache_bytes_per_s=1e9)
    blocks = {dt: cm.Block(SMALL, hw, Workload(8, 4, 4, dtype=dt), Policy(gbs=2, num_gb=2), rows=4)
              for dt in ("bfloat16", "float32")}
    gemm = {dt: cm.gemm_s(blk, "decode", "cpu") for dt, blk in blocks.items()}
    assert gemm["float32"] == pytest.approx(2 * 2 * 2 * 36864 / 10e9)
    assert gemm["bfloat16"] == pytest.approx(2 * 2 * 2 * 36864 / 80e9)  # its weights stay cached: the hot rate
    with pytest.raises(HardwareSpecError, match="matmul_f32_gflop_per_s"):
        DeviceSpec(1e9, (1, 4), (40.0, 50.0), 1e9, 1e9, 1e9, 1e9, matmul_f32_gflop_per_s=(10.0,))


def test_the_profiled_disk_rate_is_the_engines_own_cold_read(tmp_path, monkeypatch):
    """The disk rate the planner prices for a disk tier read with O_DIRECT is measured with the engine's reader."""
    from planner import profiler

    reads = []

    class Counting(profiler.DirectReader):
        def read(self, path):
            reads.append(path.stat().st_size)
            return super().read(path)

    monkeypatch.setattr(profiler, "DISK_PROBE_BYTES", 8 << 20)
    monkeypatch.setattr(profiler, "DirectReader", Counting)
    rates = profiler.disk_rates(tmp_path)
    assert reads and reads[0] > 8 << 20  # the whole probe layer file, header included
    assert all(0 < v < float("inf") for v in rates.values())
    assert not list(tmp_path.glob("flexbatch-*"))  # the probes are removed


def test_the_planning_process_room_is_not_saved_with_a_profile(tmp_path):
    from dataclasses import replace

    hw = replace(cpu_machine(), memory_room_bytes=5e8, memory_limit_binds=True)
    saved = json.loads(save_hardware(hw, tmp_path / "hw.json").read_text())
    assert "memory_room_bytes" not in saved and "memory_limit_binds" not in saved
    back = load_hardware(tmp_path / "hw.json")
    assert back.memory_room_bytes is None and not back.memory_limit_binds
    with pytest.raises(HardwareSpecError, match="memory_room_bytes=-1"):
        replace(cpu_machine(), memory_room_bytes=-1)


def test_kernel_rates_round_trip_and_interpolate_like_the_gemm_table(tmp_path):
    hw = cpu_machine()
    cpu = DeviceSpec(**{**hw.cpu.__dict__, "matmul_rows": (1, 16), "matmul_widths": (64, 128),
                        "matmul_gflop_per_s": ((1, 2), (3, 4)), "kernel_gflop_per_s": {"int4": ((5, 6), (7, 8))}})
    hw = dataclasses.replace(hw, cpu=cpu)
    back = load_hardware(save_hardware(hw, tmp_path / "hw.json"))
    assert back == hw and back.cpu.kernel_flop_per_s("int8", 4) is None
    assert back.cpu.kernel_flop_per_s("int4", 16, 128) == 8e9 and back.cpu.kernel_flop_per_s("int4", 1, 64) == 5e9
    with pytest.raises(HardwareSpecError, match="kernel_gflop_per_s"):
        DeviceSpec(**{**cpu.__dict__, "kernel_gflop_per_s": {"int3": ((5, 6), (7, 8))}})


def test_the_profile_prices_kernels_from_the_crossover_entries(monkeypatch):
    seen = []

    def entry(fmt, n, k, dtype, every_row_count=False, refresh=False):
        seen.append((fmt, n, k, every_row_count))
        return {"max_rows": 4, "timings": [{"rows": r, "fast_s": 1e-3 * r, "dense_s": 2e-3} for r in profiler.MATMUL_ROWS]}

    monkeypatch.setattr(profiler, "shape_timings", entry)
    tables = profiler.kernel_tables(torch.bfloat16)
    assert set(tables) == {"int4", "int8"} and all(s[3] and s[1] == 3 * s[2] for s in seen)
    w = profiler.MATMUL_WIDTHS[0]
    assert tables["int8"][0][0] == pytest.approx(2 * 3 * w * w / 1e-3 / 1e9)


def test_reorder_gains_round_trip_and_come_from_the_onednn_entries(tmp_path, monkeypatch):
    hw = cpu_machine()
    hw = dataclasses.replace(hw, cpu=dataclasses.replace(hw.cpu, dense_reorder_gain={"float32": (1.5,)}))
    back = load_hardware(save_hardware(hw, tmp_path / "hw.json"))
    assert back == hw and back.cpu.reorder_gain("float32", 64) == 1.5 and back.cpu.reorder_gain("bfloat16", 1) is None
    with pytest.raises(HardwareSpecError, match="dense_reorder_gain"):
        dataclasses.replace(hw.cpu, dense_reorder_gain={"int8": (1.5,)})

    def entry(fmt, n, k, dtype, every_row_count=False, refresh=False):
        assert fmt == "onednn" and n == 3 * k and every_row_count
        if dtype == torch.bfloat16:
            raise RuntimeError("bf16 cannot be reordered here")
        return {"timings": [{"rows": r, "fast_s": 1e-3, "dense_s": 2e-3} for r in profiler.MATMUL_ROWS]}

    monkeypatch.setattr(profiler, "shape_timings", entry)
    assert profiler.reorder_gains(torch.bfloat16) == {}
    gains = profiler.reorder_gains(torch.float32)
    assert list(gains) == ["float32"] and gains["float32"][0] == (2.0,) * len(profiler.MATMUL_ROWS)


def test_a_torn_cached_profile_is_passed_over_and_measured_again(tmp_path, monkeypatch):
    spec = _keyed(cpu_machine())
    keyed = profiler.keyed_copy(tmp_path / "hardware.json", profiler.machine_key())
    save_hardware(spec, keyed)
    keyed.write_text(keyed.read_text()[:200])  # cut short, as by a full disk
    calls = []
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: calls.append(1) or spec)
    assert profiler.load_or_profile(tmp_path / "hardware.json") == spec and calls == [1]
    assert load_hardware(keyed) == spec  # written whole again


def test_a_torn_kernel_rates_file_is_measured_again(tmp_path):
    from engine.kernels import rates

    path = tmp_path / "kernel_rates.json"
    path.write_text('{"cpu|torch|v5|int4|float32|64x64": {"max_rows": 16, "timi')  # cut short
    measured = []
    entry = rates.cached("a key", lambda: measured.append(1) or {"max_rows": 4, "timings": []}, path)
    assert measured == [1] and entry["max_rows"] == 4
    assert json.loads(path.read_text())["a key"]["max_rows"] == 4  # the file is whole again
    rates._memo.clear()


WRONG_SHAPES = {"a list": "[]", "null": "null", "text": '"fast"', "a list for the cpu": '{"name": "x", "cpu": []}',
                "string figures": None, "a list for the sources": None}


def _wrong_shape(what: str, spec) -> str:
    stored = json.loads(json.dumps({k: v for k, v in spec.to_dict().items() if k not in PROCESS_FIELDS}))
    if what == "string figures":
        stored["cpu"]["matmul_gflop_per_s"] = ["fast" for _ in stored["cpu"]["matmul_rows"]]
        stored["disk_bytes"] = "1e12"
    elif what == "a list for the sources":
        stored["sources"] = list(stored["sources"].items())
    else:
        return WRONG_SHAPES[what]
    return json.dumps(stored)


@pytest.mark.parametrize("what", list(WRONG_SHAPES))
def test_a_cached_profile_of_the_wrong_shape_is_set_aside_and_measured_again(tmp_path, monkeypatch, caplog, what):
    spec = _keyed(cpu_machine())
    keyed = profiler.keyed_copy(tmp_path / "hardware.json", profiler.machine_key())
    keyed.write_text(_wrong_shape(what, spec))
    wrong = keyed.read_text()
    calls = []
    monkeypatch.setattr(profiler, "profile_this_machine", lambda: calls.append(1) or spec)
    with caplog.at_level(logging.WARNING, logger="engine.kept_files"):
        assert profiler.load_or_profile(tmp_path / "hardware.json") == spec and calls == [1]
    assert load_hardware(keyed) == spec  # measured again and written whole
    aside = keyed.with_name(keyed.name + ".wrong")
    assert aside.read_text() == wrong
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"set aside as {aside.name}" in lines[0] and "profiled again" in lines[0]
    assert profiler.load_or_profile(tmp_path / "hardware.json") == spec and calls == [1]  # later runs use it


@pytest.mark.parametrize("content, why", [
    ("[]", "the kernel rates is a list, expected an object"),
    ('{"k": {"max_rows": 4, "timings": [], "measured_at": "yesterday"}}', 'measured_at is text ("yesterday")'),
    ('{"k": {"max_rows": 4, "timings": [{"rows": 1, "fast_s": "0.1", "dense_s": 0.2}]}}', '["fast_s"] is text'),
    ('{"k": {"max_rows": 4, "timings": "fast"}}', "timings is text"),
])
def test_a_kernel_rates_file_of_the_wrong_shape_is_set_aside_and_measured_again(tmp_path, caplog, content, why):
    from engine.kernels import rates

    path = tmp_path / "kernel_rates.json"
    path.write_text(content)
    measured = []
    with caplog.at_level(logging.WARNING, logger="engine.kept_files"):
        entry = rates.cached("k", lambda: measured.append(1) or {"max_rows": 4, "timings": []}, path)
    rates._memo.clear()
    assert measured == [1] and entry["max_rows"] == 4
    assert json.loads(path.read_text())["k"]["max_rows"] == 4  # written whole again
    assert (tmp_path / "kernel_rates.json.wrong").read_text() == content
    assert [r.getMessage() for r in caplog.records if why in r.getMessage() and "set aside" in r.getMessage()]
