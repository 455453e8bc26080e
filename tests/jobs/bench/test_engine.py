import importlib.util
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from engine.engine import Engine
from engine.spec import load_model_spec
from jobs import cli
from jobs.bench import models as bm

LINES = ("flops", "transformers", "accelerate", "compress_speed", "compress_memory", "compress_rss")


def test_bench_engine_reports_every_line(tmp_path, one_thread):
    has_accelerate = importlib.util.find_spec("accelerate") is not None
    out = tmp_path / "engine.json"
    args = ["bench", "engine", "--preset", "tiny", "--repeats", "1", "--gen-len", "4", "--prompt-len", "16",
            "--blocks", "2x1,2x2", "--hf-batches", "1,4", "--offload-blocks", "4x1", "--accelerate-batches", "4",
            "--threads", str(one_thread), "--cache-dir", str(tmp_path / "cache"), "--output", str(out),
            "--skip", "early-stop", "--skip", "heap"]  # W4 and heap have their own tests
    if not has_accelerate:
        args += ["--skip", "accelerate"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads(out.read_text())
    lines = {d["id"]: d for d in report["lines"]}
    assert tuple(lines) == LINES
    for name, d in lines.items():
        if name == "accelerate" and not has_accelerate:
            assert d["ours"] > 0 and d["baseline"] is None
            continue
        assert d["ours"] > 0 and d["baseline"] > 0 and d["ratio"] > 0, d
        assert name in result.output
    assert report["machine"]["torch_threads"] == 1 and report["machine"]["cpu_model"]
    assert "P + G - 1" in report["model"]["flops_formula"]
    assert lines["flops"]["detail"]["gemm"]["decode_rows"] == 2
    assert lines["accelerate"]["detail"]["engine_layer_tiers"] == {"disk": 10}


def test_bench_engine_heap_line_compares_mmapped_with_heap_temporaries(tmp_path):
    # a process of its own: the line leaves glibc's mmap threshold set
    out = tmp_path / "engine.json"
    skip = [a for s in ("throughput", "offload", "compress", "early-stop") for a in ("--skip", s)]
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "bench", "engine", "--preset", "tiny", "--repeats", "1",
                           "--gen-len", "4", "--prompt-len", "16", "--blocks", "2x1", "--threads", "1", *skip,
                           "--cache-dir", str(tmp_path / "cache"), "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = json.loads(out.read_text())["lines"]
    assert line["id"] == "heap" and line["ours"] > 0 and line["baseline"] > 0 and "heap" in done.stdout
    assert set(line["detail"]["runs"]) == {"mmapped", "heap"} and "4 MiB or more mmapped" in line["what"]


def test_prompts_tokenize_to_exactly_their_ids(tmp_path):
    model_dir = bm.build_checkpoint("tiny", tmp_path)
    spec = load_model_spec(model_dir)
    eng = Engine.load(model_dir, dtype="float32")
    for ids in bm.prompt_ids(3, 16, spec.vocab_size):
        assert eng.tokenizer(bm.prompt_text(ids))["input_ids"] == ids
    assert spec.eos_token_ids == () and spec.tie_word_embeddings


def test_model_flops_counts_linear_head_and_causal_attention(tmp_path):
    spec = load_model_spec(bm.build_checkpoint("tiny", tmp_path))
    one = bm.model_flops(spec, prompt_len=3, gen_len=2, rows=1)
    H, V, L, F = spec.hidden_size, spec.vocab_size, spec.num_layers, spec.ffn_size
    assert one["linear"] == 2 * L * (4 * H * H + 3 * H * F) * (3 + 2 - 1)
    assert one["head"] == 2 * V * H * 2
    assert one["attention"] == 4 * L * H * (1 + 2 + 3 + 4)  # prefill pairs 1+2+3, one decode step over 4 keys
    assert bm.model_flops(spec, 3, 2, rows=5)["total"] == 5 * one["total"]


@pytest.mark.parametrize("backends", ["ipex", "native,cuda", "native"])
def test_bench_backends_must_name_native_and_another(backends):
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--backends", backends])
    assert result.exit_code == 2 and "name native and at least one other of native, aten, ipex" in result.output


@pytest.mark.ipex
def test_bench_compares_backends_per_phase(tmp_path, one_thread):
    out = tmp_path / "engine.json"
    skip = [a for s in ("gemm", "transformers", "accelerate", "offload", "compress") for a in ("--skip", s)]
    args = ["bench", "engine", "--preset", "tiny", "--repeats", "1", "--gen-len", "4", "--prompt-len", "16",
            "--blocks", "2x1", "--backends", "native,ipex", "--threads", str(one_thread), *skip,
            "--cache-dir", str(tmp_path / "cache"), "--output", str(out)]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    lines = {d["id"]: d for d in json.loads(out.read_text())["lines"]}
    ids = [f"ipex{w}_{m}" for w in ("", "_w4") for m in ("prefill", "decode", "total", "rss")]
    assert [i for i in lines if i.startswith("ipex")] == ids
    for i in ids:
        assert lines[i]["ours"] > 0 and lines[i]["baseline"] > 0, lines[i]
