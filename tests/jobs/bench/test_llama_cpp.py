"""The llama.cpp lines of `flexbatch bench workloads --llama-cpp DIR`: the command built for each workload (a batch
over 256 sequences split), its result table read back (a last line lost at exit run again), the one-line error
where the build is missing, the ratio to flexbatch's line of the same weight width; the real line runs on the tiny
preset where .llama-cpp exists (scripts/setup_llama_cpp.sh; CI does not build it)."""

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from jobs.bench import llama_cpp as lc
from jobs.bench import models as bm
from jobs.bench import whole_process as wp
from jobs.bench import workloads as wl

BUILD = Path(__file__).resolve().parents[3] / ".llama-cpp"

# llama-batched-bench's stdout for `-npp 128 -ntg 31 -npl 256,256` (its Markdown table; the log lines go to stderr)
SAMPLE = """
llama_batched_bench: n_kv_max = 40960, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0, \
is_tg_separate = 0, n_gpu_layers = -1, n_threads = 2, n_threads_batch = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |     31 |  256 |  40704 |   41.250 |   794.33 |   15.500 |   512.00 |   56.750 |   717.27 |
|   128 |     31 |  256 |  40704 |   40.750 |   804.12 |   16.500 |   480.97 |   57.250 |   711.00 |

"""
DROPPED = SAMPLE[:SAMPLE.rindex("|   128")]  # the logger's thread lost the last line at exit


def tools(root: Path) -> lc.LlamaCpp:
    return lc.LlamaCpp(root)


def test_batches_over_256_sequences_are_split_as_evenly_as_possible():
    assert lc.sequence_chunks(96) == [96] and lc.sequence_chunks(256) == [256]
    assert lc.sequence_chunks(512) == [256, 256] and lc.sequence_chunks(257) == [129, 128]
    assert lc.sequence_chunks(600) == [200, 200, 200]


@pytest.mark.parametrize("workload", sorted(wl.WORKLOADS))
def test_the_command_runs_separate_prompts_through_a_prefill_and_g_minus_1_decode_steps(workload, tmp_path):
    rows, P, G = wl.WORKLOADS[workload]
    argv = lc.bench_command(tools(tmp_path), tmp_path / "Q4_0.gguf", rows, P, G, 2)

    def arg(flag):
        return argv[argv.index(flag) + 1]

    assert argv[0] == str(tmp_path / "build" / "bin" / "llama-batched-bench") and arg("-m") == str(tmp_path / "Q4_0.gguf")
    chunks = [int(n) for n in arg("-npl").split(",")]
    assert sum(chunks) == rows and max(chunks) <= lc.MAX_SEQUENCES and "-pps" not in argv  # separate prompts
    assert chunks == ([256, 256] if rows == 512 else [rows])
    assert arg("-npp") == str(P) and arg("-ntg") == str(G - 1)  # the prefill gives each row its first token
    assert int(arg("-c")) == max(chunks) * (P + G - 1)  # every sequence of a chunk fits: its rows are not skipped
    assert "-no-kvu" in argv and arg("-fa") == "auto" and arg("-t") == arg("-tb") == "2"
    assert (arg("-b"), arg("-ub"), arg("-lm")) == ("2048", "512", "mmap")
    assert lc.bench_command(tools(tmp_path), tmp_path / "Q4_0.gguf", rows, P, G, 2, "none")[-2:] == ["-lm", "none"]
    assert lc.bench_command(tools(tmp_path), tmp_path / "Q4_0.gguf", rows, P, G, 2, "mmap-no-repack")[-3:] == [
        "-lm", "mmap", "--no-repack"]


def test_the_result_table_is_read_row_by_row_and_a_lost_last_line_is_missing():
    rows = lc.parse_results(SAMPLE)
    assert [(r["pp"], r["tg"], r["pl"], r["n_kv"]) for r in rows] == [(128, 31, 256, 40704)] * 2
    assert rows[1]["t_pp"] == 40.75 and rows[1]["t_tg"] == 16.5 and rows[0]["s_tg"] == 512.0
    assert lc.missing_rows(rows, 512, 128, 32) == []
    assert lc.missing_rows(lc.parse_results(DROPPED), 512, 128, 32) == [256]
    cut = SAMPLE[:SAMPLE.rindex("|   57.250")]  # a line cut short is no row
    assert len(lc.parse_results(cut)) == 1
    assert lc.missing_rows(rows, 512, 128, 16) == [256, 256]  # rows of another run count for nothing


def test_tokens_per_s_count_g_tokens_per_row_over_prefill_and_decode_seconds_retrying_a_lost_line(tmp_path,
                                                                                                   monkeypatch):
    outputs = [DROPPED, SAMPLE]
    calls = []

    def fake_run_process(argv, threads, workdir, env=None):
        calls.append(argv)
        return {"seconds": 70.0, "cpu_seconds": 139.0, "peak_rss_bytes": 900 << 20, "stdout": outputs.pop(0)}

    monkeypatch.setattr(wp, "run_process", fake_run_process)
    line = lc.LlamaCppLine(tools(tmp_path), tmp_path / "bf16.gguf", 128, 512, 2)
    res = line.run(32)
    assert len(calls) == 2 and res["attempts"] == 2 and calls[0] == calls[1]
    assert res["tokens"] == 512 * 32 and res["seconds"] == pytest.approx(41.25 + 15.5 + 40.75 + 16.5)
    assert res["tokens_per_s"] == pytest.approx(512 * 32 / 114.0)
    assert res["phase_seconds"] == {"prefill": 82.0, "decode": 32.0}
    assert line.added_rss_bytes == 900 << 20 and res["tokens_per_cpu_s"] is None  # its CPU-s include the load

    outputs[:] = [DROPPED] * lc.ATTEMPTS
    with pytest.raises(click.ClickException, match=r"no result line for B=\[256\] in 3 runs"):
        line.run(32)


def test_a_crash_on_an_amx_cpu_names_the_build_without_llama_cpps_amx_kernels(tmp_path, monkeypatch):
    def crashing(argv, threads, workdir, env=None):
        raise click.ClickException("`llama-batched-bench ...` exited -11: ")

    monkeypatch.setattr(wp, "run_process", crashing)
    monkeypatch.setattr(lc, "cpu_info", lambda field: "avx512f amx_tile amx_int8")
    line = lc.LlamaCppLine(tools(tmp_path), tmp_path / "Q4_0.gguf", 64, 4, 2)
    with pytest.raises(click.ClickException, match="setup_llama_cpp.sh --no-amx DIR"):
        line.run(8)
    monkeypatch.setattr(lc, "cpu_info", lambda field: "avx2 avx512f")
    with pytest.raises(click.ClickException, match="exited -11: $"):
        line.run(8)


def test_a_missing_build_is_a_one_line_error_naming_the_setup_script(tmp_path):
    assert lc.llama_cpp_tools(None) is None
    with pytest.raises(click.UsageError, match=f"{lc.SETUP_SCRIPT} {tmp_path / 'nowhere'}") as err:
        lc.llama_cpp_tools(tmp_path / "nowhere")
    assert "\n" not in err.value.message
    t = tools(tmp_path / "b")
    for path in (t.quantize, t.python, t.convert_script):  # all but the bench binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    with pytest.raises(click.UsageError, match="llama-batched-bench is missing"):
        lc.llama_cpp_tools(tmp_path / "b")
    res = CliRunner().invoke(wl.workloads_command, ["--llama-cpp", str(tmp_path / "nowhere"), "--cache-dir",
                                                    str(tmp_path), "--output", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and "scripts/setup_llama_cpp.sh" in res.output, res.output
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "110m").exists()  # before any line runs
    text = " ".join(CliRunner().invoke(wl.workloads_command, ["--help"]).output.split())
    assert "--llama-cpp DIRECTORY" in text and "scripts/setup_llama_cpp.sh" in text


def test_each_llama_cpp_line_is_compared_with_the_flexbatch_line_of_its_weight_width():
    cfg = wl.WorkloadConfig(dtype="bfloat16")
    res = {name: {"tokens_per_s": tps} for name, tps in [
        ("flexbatch bfloat16", 300.0), ("flexbatch bfloat16 int8", 400.0), ("flexbatch bfloat16 int4", 250.0),
        ("llama.cpp bf16", 200.0), ("llama.cpp Q8_0", 500.0), ("llama.cpp Q4_0", 250.0)]}
    assert wl.same_bits_ratio(cfg, res, "llama.cpp bf16") == 1.5
    assert wl.same_bits_ratio(cfg, res, "llama.cpp Q8_0") == 0.8
    assert wl.same_bits_ratio(cfg, res, "llama.cpp Q4_0") == 1.0
    assert wl.same_bits_ratio(cfg, res, "flexbatch bfloat16") is None
    # a float32 run: llama.cpp's bf16 beside the float32 line whose weights stay bfloat16 (as many bytes)
    f32 = {"flexbatch float32": {"tokens_per_s": 100.0}, "flexbatch float32 bf16": {"tokens_per_s": 240.0},
           "llama.cpp bf16": {"tokens_per_s": 200.0}}
    assert wl.same_bits_ratio(wl.WorkloadConfig(dtype="float32"), f32, "llama.cpp bf16") == 1.2
    report = {"machine": {"cpu_flags": "avx512_bf16"}, "config": {"dtype": "bfloat16"}, "gemm_peak_gflops": 200.0,
              "workloads": [{"workload": "gen", "rows": 32, "prompt_tokens": 64, "generated": 64, "lines": [
                  {"line": "llama.cpp Q4_0", "tokens_per_s": 250.0, "vs_ct2_int8": None, "gemm_fraction": 0.1,
                   "tokens_per_cpu_s": None, "prefill_fraction": 0.3, "decode_fraction": 0.2,
                   "added_rss_bytes": 300 << 20, "same_bits_ratio": 1.0}]}]}
    assert "| gen 32x64 gen 64 | llama.cpp Q4_0 | 250.0 | - | - | 0.10 | 0.30 | 0.20 | 300 MiB | 1.00x |" in (
        wl.table_text(report))


@pytest.mark.skipif(not (BUILD / "build" / "bin" / "llama-batched-bench").is_file(),
                    reason="no .llama-cpp build (scripts/setup_llama_cpp.sh)")
def test_the_real_line_converts_the_tiny_checkpoint_and_times_separate_prompts(tmp_path):
    model_dir = bm.build_checkpoint("tiny", tmp_path)
    t = lc.llama_cpp_tools(BUILD)
    lines = lc.llama_cpp_lines(t, model_dir, 3, 8, 2)
    assert sorted(lines) == ["llama.cpp Q4_0", "llama.cpp Q8_0", "llama.cpp bf16"]
    assert all((tmp_path / "tiny-gguf" / f"{fmt}.gguf").stat().st_size > 0 for fmt in lc.FORMATS)
    res = lines["llama.cpp Q4_0"].run(5)
    assert res["tokens"] == 15 and [(r["pp"], r["tg"], r["pl"]) for r in res["results"]] == [(8, 4, 3)]
    assert res["phase_seconds"]["prefill"] > 0 and res["phase_seconds"]["decode"] > 0
    mtime = (tmp_path / "tiny-gguf" / "bf16.gguf").stat().st_mtime
    lc.gguf_models(t, model_dir)  # cached
    assert (tmp_path / "tiny-gguf" / "bf16.gguf").stat().st_mtime == mtime


def test_ggufs_are_cached_per_type_and_the_bf16_source_kept_only_where_asked_for(tmp_path, monkeypatch):
    """A Q4_0 alone leaves no bf16 GGUF behind (14 GB at 7B); a type asked for later is added to the cache; a
    changed checkpoint rebuilds them all; nothing half-written is ever named as a GGUF."""
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir()
    (model_dir / "complete.json").write_text("v1")
    calls = []

    def fake_convert(tools, model_dir, bf16):
        calls.append("convert")
        bf16.write_text("bf16")

    def fake_run(argv, what):
        src, dst, fmt = argv[1:]
        calls.append(fmt)
        assert dst.suffix == ".partial" and src.name == "bf16.gguf"
        dst.write_text(fmt)
        return ""

    monkeypatch.setattr(lc, "_convert_bf16", fake_convert)
    monkeypatch.setattr(lc, "_run", fake_run)
    out = tmp_path / "ckpt-gguf"
    t = tools(tmp_path / "build")
    assert lc.gguf_models(t, model_dir, ("Q4_0",)) == {"Q4_0": out / "Q4_0.gguf"}
    assert calls == ["convert", "Q4_0"] and sorted(p.name for p in out.iterdir()) == ["Q4_0.gguf", "complete.json"]
    assert lc.gguf_models(t, model_dir, ("Q4_0",)) and calls == ["convert", "Q4_0"]  # cached
    files = lc.gguf_models(t, model_dir, ("bf16", "Q8_0", "Q4_0"))
    assert calls[2:] == ["convert", "Q8_0"] and all(f.read_text() == fmt for fmt, f in files.items())
    (model_dir / "complete.json").write_text("v2")  # the checkpoint was rebuilt
    lc.gguf_models(t, model_dir, ("Q8_0",))
    assert calls[4:] == ["convert", "Q8_0"] and sorted(p.name for p in out.iterdir()) == ["Q8_0.gguf",
                                                                                        "complete.json"]


def test_a_config_without_architectures_is_converted_as_its_model_type(tmp_path, monkeypatch):
    """convert_hf_to_gguf.py picks its converter by `architectures`: a config without it (written without
    save_pretrained) gets the class of its model_type in the folder handed to the converter."""
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama", "vocab_size": 64}')
    (model_dir / "model.safetensors").write_text("")
    seen = {}

    def fake_run(argv, what):
        if what == "training SentencePiece":
            return "64\n"
        folder = Path(argv[2])
        seen["config"] = json.loads((folder / "config.json").read_text())
        seen["files"] = sorted(p.name for p in folder.iterdir())
        Path(argv[argv.index("--outfile") + 1]).write_text("gguf")
        return ""

    monkeypatch.setattr(lc, "_run", fake_run)
    lc._convert_bf16(tools(tmp_path / "build"), model_dir, tmp_path / "bf16.gguf")
    assert seen["config"]["architectures"] == ["LlamaForCausalLM"] and seen["config"]["vocab_size"] == 64
    assert seen["files"] == ["config.json", "model.safetensors"] and (tmp_path / "bf16.gguf").read_text() == "gguf"


def test_a_qwen3_moe_checkpoint_is_converted_with_the_sentencepiece_vocabulary_tried_first(tmp_path, monkeypatch):
    """The converter's Qwen2-MoE class (Qwen3-MoE's) reads only BPE tokenizers it knows by hash: it runs through a
    driver that has it read the SentencePiece model first, as the dense Qwen converter does; other types run the
    converter as it is."""
    calls = []

    def fake_run(argv, what):
        if what == "training SentencePiece":
            return "64\n"
        calls.append([str(a) for a in argv])
        Path(argv[argv.index("--outfile") + 1]).write_text("gguf")
        return ""

    monkeypatch.setattr(lc, "_run", fake_run)
    build = tools(tmp_path / "build")
    for model_type in ("qwen3_moe", "mixtral"):
        model_dir = tmp_path / model_type
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 64}))
        lc._convert_bf16(build, model_dir, tmp_path / f"{model_type}.gguf")
    qwen, mixtral = calls
    assert qwen[1:6] == ["-c", lc.CONVERT_SPM_FIRST, str(build.convert_script), "conversion.qwen", "Qwen2MoeModel"]
    assert Path(qwen[6]).name == "qwen3_moe" and mixtral[1] == str(build.convert_script)
