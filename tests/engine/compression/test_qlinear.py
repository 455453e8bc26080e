"""Compressed weights computed on directly: the int4pack and int8 x int8 kernels against dequantize + GEMM,
the per-row-count choice, the measured and cached crossover that prices it, and what the int8 format stores."""

import json
import time

import pytest
import torch

from engine.compression.codecs import WeightCodec
from engine.compression.qlinear import QLinear, QWeight
from engine.engine import Engine
from engine.kernels import compiled, int4_tiles, int8_rows
from engine.kernels import rates as kernel_rates
from engine.kernels.native import NativeKernels
from engine.policy import Policy

NAME = "mlp.down_proj.weight"
TIMINGS = [{"rows": r, "fast_s": 1e-5 * r, "dense_s": 4e-5 + 1e-5 * r} for r in kernel_rates.ROWS]


def _layer(fmt: str, dtype: torch.dtype, n: int = 96, k: int = 192):
    torch.manual_seed(0)
    w = (torch.randn(n, k) * 0.02).to(dtype)
    codec = WeightCodec(dtype, format=fmt)
    stored, meta = codec.encode({NAME: w})
    return codec, stored, meta


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compressed_kernel_matches_dequantize_gemm(fmt, dtype, compressed_kernels):
    codec, stored, meta = _layer(fmt, dtype)
    kernels = NativeKernels()
    weights, _ = kernels.ready(kernels.pack_resident(stored, meta, codec), meta, codec, "cpu")
    q = weights[NAME]
    assert isinstance(q, QLinear) and q.weight.fast is not None
    x = torch.randn(5, 192).to(dtype)
    fast = kernels.linear(x, q).float()
    assert q._dense is None  # the kernel ran on the compressed weight, no dense copy was made
    dense = torch.nn.functional.linear(x, q.dense()).float()
    # int4pack computes the same dequantized weight in bfloat16; int8 rounds each activation row to 8 bits
    tol = {"int4": 0.02, "int8": 0.03}[fmt]
    assert (fast - dense).norm() <= tol * dense.norm(), (fast - dense).norm() / dense.norm()


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_rows_above_max_rows_take_the_dense_path(fmt, monkeypatch):
    monkeypatch.setattr("engine.kernels.native.max_rows", lambda f, n, k, dtype: 4)
    codec, stored, meta = _layer(fmt, torch.bfloat16)
    kernels = NativeKernels()
    packed = kernels.pack_resident(stored, meta, codec)
    q = kernels.ready(packed, meta, codec, "cpu")[0][NAME]
    kernels.linear(torch.randn(1, 4, 192).to(torch.bfloat16), q)  # 4 rows: the kernel
    assert q.weight.max_rows == 4 and q._dense is None
    y = kernels.linear(torch.randn(5, 192).to(torch.bfloat16), q)  # 5 rows: dequantize + GEMM
    assert q._dense is not None and y.shape == (5, 96)
    # the same dense weight as the stored form's, though the layer keeps the kernel's tiles alone
    assert (q.weight.stored is None) == (int4_tiles.available() if fmt == "int4" else int8_rows.available())
    assert torch.equal(q._dense, codec.dense(NAME, codec.split(stored, meta)[1][NAME], {}))
    again = kernels.ready(packed, meta, codec, "cpu")[0][NAME]  # the next step dequantizes anew
    assert again._dense is None


def test_a_crossover_is_measured_once_and_cached(tmp_path, monkeypatch):
    path = tmp_path / "rates.json"
    monkeypatch.setattr(kernel_rates, "measure_max_rows", lambda *a, **k: (16, TIMINGS))
    assert kernel_rates.shape_timings("int8", 64, 32, torch.float32, path=path)["max_rows"] == 16
    assert '"max_rows": 16' in path.read_text()

    def fail(*a):
        raise AssertionError("measured twice")

    monkeypatch.setattr(kernel_rates, "measure_max_rows", fail)
    kernel_rates._memo.clear()
    assert kernel_rates.shape_timings("int8", 64, 32, torch.float32, path=path)["max_rows"] == 16  # from the file


def _entry(**changes) -> dict:
    return {"max_rows": 16, "timings": TIMINGS, "measured_at": time.time(), "load_average": 0.5, "cpus": 2} | changes


def test_a_cached_crossover_is_measured_again_when_stale_implausible_or_measured_busier(monkeypatch):
    monkeypatch.setattr(kernel_rates.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert kernel_rates.stale(_entry()) is None
    assert "older" in kernel_rates.stale(_entry(measured_at=time.time() - 31 * 86400))
    disturbed = [dict(t) for t in TIMINGS]
    disturbed[0]["dense_s"] = 1.0  # one row took longer than 64: the first call was disturbed
    assert "implausible" in kernel_rates.stale(_entry(timings=disturbed))
    assert "busier" in kernel_rates.stale(_entry(load_average=6.0))  # 6 on 2 CPUs then, 1 now
    assert kernel_rates.stale(_entry(load_average=0.8)) is None
    assert "short" in kernel_rates.stale(_entry(timings=TIMINGS[:2]), every_row_count=True)
    assert kernel_rates.stale(None) == "not measured yet"


def test_a_stale_entry_is_replaced_by_a_new_measurement(tmp_path, monkeypatch):
    path = tmp_path / "rates.json"
    key = f"{kernel_rates.machine_key()}|v{kernel_rates.VERSION}|int8|float32|64x32"
    path.write_text(json.dumps({key: _entry(max_rows=1024, measured_at=0)}))
    monkeypatch.setattr(kernel_rates, "measure_max_rows", lambda *a, **k: (16, TIMINGS))
    kernel_rates._memo.clear()
    assert kernel_rates.shape_timings("int8", 64, 32, torch.float32, path=path)["max_rows"] == 16
    assert json.loads(path.read_text())[key]["measured_at"] > 0


def test_the_machine_key_names_the_cpu_flags_torch_threads_and_the_kernel_build():
    key = kernel_rates.machine_key()
    assert "|flags " in key and f"torch {torch.__version__}" in key and f"threads {torch.get_num_threads()}" in key
    if compiled.ops() is not None:  # a rebuilt kernel library is measured anew
        assert f"build {compiled.build_key()}" in key


def test_measure_max_rows_times_both_paths():
    best, timings = kernel_rates.measure_max_rows("int8", 64, 64, torch.float32, repeats=1)
    assert best in (0, *kernel_rates.ROWS) and timings
    assert all(t["fast_s"] > 0 and t["dense_s"] > 0 for t in timings)
    assert best == max([0] + [t["rows"] for t in timings if t["fast_s"] < t["dense_s"]])
    assert len(timings) == len(kernel_rates.ROWS) or all(t["fast_s"] >= t["dense_s"] for t in timings[-2:])


def test_int8_layers_store_a_quarter_of_float32(checkpoint, tmp_path):
    src = checkpoint("qwen2")
    plain = Engine.load(src, dtype="float32")
    int8 = Engine.load(src, dtype="float32", policy=Policy(compress_weight=True, weight_format="int8"))
    ratio = sum(int8.weights.layer_bytes) / sum(plain.weights.layer_bytes)
    assert 0.25 <= ratio < 0.3, ratio  # one byte per weight, a float32 scale per row, norms and biases as they are


@pytest.mark.parametrize(("args", "expected"), [(["--compress-weight", "--compress-cache"], (True, "int4", True)),
                                                (["--compress-weight", "int8"], (True, "int8", False)),
                                                ([], (False, "int4", False))])
def test_compress_weight_option_takes_a_format(args, expected):
    import click
    from click.testing import CliRunner

    from jobs.engine_options import engine_options, engine_settings

    @click.command()
    @engine_options
    @click.pass_context
    def show(ctx, **o):
        p = engine_settings(ctx, o).policy
        click.echo(f"{p.compress_weight} {p.weight_format} {p.compress_cache}")

    assert CliRunner().invoke(show, args).output.split() == [str(e) for e in expected]


def test_unknown_weight_format_names_the_choices():
    from engine.errors import InvalidParamsError

    with pytest.raises(InvalidParamsError, match="weight_format='int3' is invalid: expected one of int4, int8"):
        Policy(compress_weight=True, weight_format="int3")


def test_rows_beyond_the_measured_range_run_the_kernel_in_chunks(monkeypatch):
    from engine.compression.qlinear import LARGEST_MEASURED
    from engine.kernels.int8_rows import fast_linear

    monkeypatch.setattr("engine.kernels.native.max_rows", lambda f, n, k, dtype: LARGEST_MEASURED)
    codec, stored, meta = _layer("int8", torch.float32)
    kernels = NativeKernels()
    q = kernels.ready(stored, meta, codec, "cpu")[0][NAME]
    x = torch.randn(2, LARGEST_MEASURED // 2 + 3, 192)  # more rows than measured, in two chunks
    y = kernels.linear(x, q)
    assert q._dense is None and torch.equal(y, fast_linear(x, q.weight.fast))  # rows are quantized one by one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_rows_in_chunks_equal_one_pass_and_the_formula(dtype):
    """int8_linear's chunks of rows (written into one output, int32 sums turned to float32 in place) equal the
    whole call and y = a_m s_n sum_k qx q computed directly."""
    from engine.compression.int8 import int8_linear, quantize_int8

    w = quantize_int8(torch.randn(48, 40))
    x = (torch.randn(3, 11, 40) * 3).to(dtype)
    x2 = x.reshape(-1, 40).float()
    a = x2.abs().amax(dim=1, keepdim=True) / 127
    qx = (x2 / a).round().to(torch.int8)
    ref = (torch._int_mm(qx, w.codes.T.contiguous()).double() * a.double() * w.scales.double()).float().to(dtype)
    whole = int8_linear(x, w, chunk_rows=1000)
    assert torch.equal(int8_linear(x, w, chunk_rows=4), whole) and whole.shape == (3, 11, 48)
    torch.testing.assert_close(whole.view(-1, 48), ref, rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-5)


def test_compressed_load_peaks_at_a_fraction_of_float32(tmp_path):
    """Layers are quantized one by one as they are read, and the freed full-precision copies go back to the OS:
    the peak RSS of placing an int8 / int4 model's layers stays well under the float32 model's."""
    import json
    import subprocess
    import sys

    from planner.overhead_probe import write_probe_checkpoint
    from tests.conftest import REPO

    cfg = dict(model_type="llama", hidden_size=512, intermediate_size=1408, num_attention_heads=8,
               num_key_value_heads=8, vocab_size=64, max_position_embeddings=128, tie_word_embeddings=True)
    model = write_probe_checkpoint(tmp_path / "m", 8, cfg)  # 8 layers, 103 MB in float32

    def probe(fmt):
        out = subprocess.run([sys.executable, "-m", "tests.engine.load_probe", str(model), fmt], cwd=REPO,
                             capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    plain, int8, int4 = probe("none"), probe("int8"), probe("int4")
    assert int8["stored"] < 0.27 * plain["stored"] and int4["stored"] < 0.15 * plain["stored"]
    # measured 0.46-0.51 of float32's peak for both formats on this 8-layer model (one layer in full precision
    # at a time on top of the stored codes); the bound leaves room for the allocator's variation
    assert int8["peak_growth"] < 0.6 * plain["peak_growth"], (int8, plain)
    assert int4["peak_growth"] < 0.6 * plain["peak_growth"], (int4, plain)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "llama_tied"])
def test_compressed_weights_keep_the_head_in_int8_and_the_planner_counts_it(checkpoint, variant, fmt):
    """With int8 or 4-bit weights the LM head is its own row-wise int8 weight (the embeddings stay for the lookup,
    tied or not), its logits within int8's error of the dense head's, and the planner counts it at that size;
    uncompressed weights keep a dense head."""
    from engine.memory.footprint import global_bytes
    from engine.spec import load_model_spec

    model_dir = checkpoint(variant)
    spec = load_model_spec(model_dir)
    policy = Policy(compress_weight=True, weight_format=fmt)
    eng, dense = Engine.load(model_dir, dtype="float32", policy=policy), Engine.load(model_dir, dtype="float32")
    head = eng.gw["lm_head.weight"]
    kept = head.fast if head.stored is None else head.stored  # the int8 kernel's tiles alone where it is built
    assert isinstance(head, QWeight) and kept.codes.dtype == torch.int8
    assert eng.gw["embed_tokens.weight"].dtype == torch.float32
    h = torch.randn(5, spec.hidden_size)
    got, want = eng.model.head(eng.gw, h), dense.model.head(dense.gw, h)
    assert not torch.equal(got, want)  # computed on the int8 codes, not the dense weight
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())
    dropped = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size * 4  # the dense head
    assert global_bytes(spec, 4, policy) - global_bytes(spec, 4) == kept.nbytes - dropped
    assert all(isinstance(w, torch.Tensor) for w in dense.gw.values())
