"""`flexbatch bench workloads`: its CTranslate2 baseline runs the real tool on a converted checkpoint, and its
table carries the CPU flags and a line per engine and format."""

import json

import pytest

from jobs.bench import models as bm
from jobs.bench import workloads as wl


def test_ctranslate2_baseline_generates_exactly_g_tokens_from_a_converted_checkpoint(tmp_path):
    pytest.importorskip("ctranslate2")
    model_dir = bm.build_checkpoint("tiny", tmp_path)
    run = wl.ct2_runner(model_dir, bm.prompt_ids(3, 8, bm.PRESETS["tiny"].vocab_size), "int8")
    assert run(5) == 15
    cfg = json.loads((tmp_path / "tiny-ct2-int8" / "config.json").read_text())
    assert cfg["bos_token"] == cfg["eos_token"] == bm.UNK  # the checkpoint has none; the converter needs them


def test_table_has_the_cpu_flags_and_every_line():
    report = {"machine": {"cpu_flags": "avx2 avx512_vnni"}, "config": {"dtype": "float32"}, "gemm_peak_gflops": 90.0,
              "workloads": [{"workload": "W3", "rows": 128, "prompt_tokens": 64, "generated": 16, "lines": [
                  {"line": "flexbatch float32 int8", "tokens_per_s": 120.0, "vs_ct2_int8": 1.2, "gemm_fraction": 0.5,
                   "added_rss_bytes": 64 << 20},
                  {"line": "ctranslate2 int8", "tokens_per_s": 100.0, "vs_ct2_int8": 1.0, "gemm_fraction": 0.4,
                   "added_rss_bytes": 32 << 20}]}]}
    table = wl.table_text(report)
    assert table.splitlines()[0] == "CPU flags: avx2 avx512_vnni"
    assert "| W3 128x64 gen 16 | flexbatch float32 int8 | 120.0 | 1.20x | 0.50 | 64 MiB |" in table
