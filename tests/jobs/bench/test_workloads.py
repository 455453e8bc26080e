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
              "workloads": [{"workload": "W3", "rows": 128, "prompt_tokens": 64, "generated": 16,
                             "decode_gemm_gflops": 61.5, "lines": [
                  {"line": "flexbatch float32 int8", "tokens_per_s": 120.0, "vs_ct2_int8": 1.2, "gemm_fraction": 0.5,
                   "tokens_per_cpu_s": 115.5,
                   "prefill_fraction": 0.8, "decode_fraction": 0.65, "added_rss_bytes": 64 << 20},
                  {"line": "ctranslate2 int8", "tokens_per_s": 100.0, "vs_ct2_int8": 1.0, "gemm_fraction": 0.4,
                   "added_rss_bytes": 32 << 20}]}]}
    table = wl.table_text(report)
    assert table.splitlines()[0] == "CPU flags: avx2 avx512_vnni"
    assert "| W3 128x64 gen 16 | flexbatch float32 int8 | 120.0 | 115.5 | 1.20x | 0.50 | 0.80 | 0.65 | 64 MiB | - |" in table
    assert "| W3 128x64 gen 16 | ctranslate2 int8 | 100.0 | - | 1.00x | 0.40 | - | - | 32 MiB | - |" in table
    assert "W3 128 rows 61.5 GFLOP/s" in table


def test_phase_fractions_divide_each_phase_by_its_own_gemm_rate(tmp_path):
    from engine.spec import load_model_spec

    spec = load_model_spec(bm.build_checkpoint("tiny", tmp_path))
    prompts = bm.prompt_ids(4, 8, spec.vocab_size)
    prefill = bm.model_flops(spec, 8, 1, 4)["total"]
    decode = bm.model_flops(spec, 8, 5, 4)["total"] - prefill
    runs = [{"phase_seconds": {"prefill": prefill / 2e9, "decode": decode / 3e9}},  # 2 and 3 GFLOP/s
            {"phase_seconds": {"prefill": prefill / 4e9, "decode": decode / 1e9}},
            {"phase_seconds": {"prefill": prefill / 6e9, "decode": decode / 2e9}}]
    got = wl.phase_fractions(spec, prompts, 5, runs, peak=8.0, decode_rate=4.0)
    assert got["prefill_fraction"] == pytest.approx(4 / 8) and got["decode_fraction"] == pytest.approx(2 / 4)
    assert wl.phase_fractions(spec, prompts, 5, [{"phase_seconds": None}], 8.0, 4.0) == {}  # CTranslate2's lines


def test_a_line_runs_in_a_process_of_its_own_and_a_failing_line_names_itself(tmp_path):
    import os

    from jobs.bench.line_process import LineProcess

    model_dir = bm.build_checkpoint("tiny", tmp_path)
    prompts = bm.prompt_ids(3, 8, bm.PRESETS["tiny"].vocab_size)
    line = LineProcess("tiny int8", wl.engine_line, model_dir, prompts, "float32", "int8", threads=1)
    try:
        assert line.proc.pid != os.getpid() and line.added_rss_bytes > 0
        ran = line.run(4)
        assert ran["tokens"] == 12 and ran["seconds"] > 0
        assert set(ran["phase_seconds"]) >= {"prefill", "decode"}
    finally:
        line.close()
    assert not line.proc.is_alive()
    with pytest.raises(RuntimeError, match=r"line 'broken' failed in its process:(.|\n)*no-such-dir"):
        LineProcess("broken", wl.engine_line, tmp_path / "no-such-dir", prompts, "float32", None, threads=1)


def test_backend_aten_adds_an_uncompressed_line_without_reordered_weights(tmp_path):
    cfg = wl.WorkloadConfig(dtype="bfloat16", ctranslate2=False, backends=("native", "aten"))
    specs = wl.line_specs(cfg, tmp_path, [[1, 2]])
    assert list(specs) == ["flexbatch bfloat16", "flexbatch bfloat16 int4", "flexbatch bfloat16 int8",
                           "flexbatch bfloat16 aten"]
    assert specs["flexbatch bfloat16 aten"][1:] == (tmp_path, [[1, 2]], "bfloat16", None, "aten")


def test_a_float32_run_adds_a_line_with_bfloat16_weights_at_rest(tmp_path):
    cfg = wl.WorkloadConfig(dtype="float32", ctranslate2=False)
    specs = wl.line_specs(cfg, tmp_path, [[1, 2]])
    assert list(specs) == ["flexbatch float32", "flexbatch float32 int4", "flexbatch float32 int8",
                           "flexbatch float32 bf16"]
    assert specs["flexbatch float32 bf16"][1:] == (tmp_path, [[1, 2]], "float32", "bf16")


def test_ctranslate2_dense_line_falls_back_to_float32_where_bfloat16_is_refused(monkeypatch):
    ctranslate2 = pytest.importorskip("ctranslate2")
    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", lambda device: {"int8", "float32"})
    assert wl.ct2_dense_type("bfloat16") == "float32"
    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", lambda device: {"int8", "float32", "bfloat16"})
    assert wl.ct2_dense_type("bfloat16") == "bfloat16" and wl.ct2_dense_type("float32") == "float32"


def test_the_qwen3_and_gemma3_presets_build_their_family_configs_with_the_released_layer_shapes():
    """Config objects only (no checkpoint written): each family preset names its config class, carries the family's
    own fields, and reads back as that family in the engine's spec."""
    from engine.spec import spec_from_config

    qwen = bm.PRESETS["qwen3-100m"].hf_config()
    assert type(qwen).__name__ == "Qwen3Config" and qwen.model_type == "qwen3"
    assert (qwen.hidden_size, qwen.num_attention_heads, qwen.num_key_value_heads, qwen.head_dim) == (1024, 16, 8, 128)
    assert qwen.tie_word_embeddings and qwen.rope_parameters["rope_theta"] == 1e6 and qwen.eos_token_id is None
    spec = spec_from_config(qwen.to_dict())
    assert spec.qk_norm == "head" and spec.head_dim * spec.num_heads == 2048 and spec.sliding_window is None

    gemma = bm.PRESETS["gemma3-100m"].hf_config()
    assert type(gemma).__name__ == "Gemma3TextConfig" and gemma.model_type == "gemma3_text"
    assert (gemma.num_attention_heads, gemma.num_key_value_heads, gemma.head_dim) == (4, 1, 256)
    assert (gemma.sliding_window, gemma.query_pre_attn_scalar, gemma.hidden_activation) == (512, 256,
                                                                                            "gelu_pytorch_tanh")
    assert gemma.layer_types == ["sliding_attention"] * 5 + ["full_attention"] and gemma.tie_word_embeddings
    spec = spec_from_config(gemma.to_dict())
    assert spec.sliding_layers == (True,) * 5 + (False,) and spec.attn_scale == 256 ** -0.5


def test_a_preset_records_its_family_fields_and_the_presets_without_them_keep_their_record():
    """complete.json decides whether a cached checkpoint is rebuilt: the Llama and OPT presets record what they did
    before presets had family fields; a family preset's record survives the JSON round trip."""
    assert bm.PRESETS["100m"].record() == {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                                           "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
                                           "max_position_embeddings": 2048, "tie_word_embeddings": True,
                                           "family": "llama"}
    gemma = bm.PRESETS["gemma3-100m"].record()
    assert json.loads(json.dumps(gemma)) == gemma and gemma["config_fields"]["sliding_window"] == 512
    with pytest.raises(ValueError, match="family 'mistral'"):
        bm.Preset(64, 128, 2, 4, 4, 100, family="mistral")
