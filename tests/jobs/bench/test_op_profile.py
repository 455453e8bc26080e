"""`flexbatch bench ops` on a tiny model: the categories account for the profiled wall time, the GEMM FLOPs read
from the recorded shapes are the model's, and the command prints its table or names a bad workload."""

import pytest
from click.testing import CliRunner

from jobs import cli
from jobs.bench import op_profile as op
from jobs.bench.op_profile import CATEGORIES, OpProfileConfig, run_ops

WORKLOAD = "4x16+3"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("op-profile"))


@pytest.fixture(scope="module")
def report(cache_dir):
    return run_ops(OpProfileConfig(workload=WORKLOAD, preset="tiny", dtypes=("float32",),
                                   formats=("uncompressed", "int8"), onednn_verbose=False, cache_dir=cache_dir))


def test_the_categories_add_up_to_the_profiled_wall_time(report):
    for line in report["lines"]:
        phases = line["phases"]
        assert set(phases) == {"prefill", "decode", "rest"} and line["tokens"] == 4 * 3
        for name, ph in phases.items():
            assert set(ph["seconds"]) == set(CATEGORIES)
            assert all(s >= 0 for s in ph["seconds"].values()), (line["weights"], name, ph["seconds"])
            assert sum(ph["seconds"].values()) == pytest.approx(ph["wall_s"], rel=1e-6, abs=1e-9)
        assert phases["prefill"]["wall_s"] > 0 and phases["decode"]["wall_s"] > 0
        total = sum(s for ph in phases.values() for s in ph["seconds"].values())
        assert total == pytest.approx(line["profiled_s"], rel=0.02)
        assert phases["prefill"]["seconds"]["gemm"] > 0 and phases["prefill"]["seconds"]["attention"] > 0
        top = phases["decode"]["top_ops"]
        assert top and all(o["seconds"] >= 0 and o["category"] in CATEGORIES for o in top)


def test_the_gemm_flops_counted_from_shapes_are_the_models(report):
    for line in report["lines"]:
        counted = sum(ph["gemm_flops"] for ph in line["phases"].values())
        assert counted == pytest.approx(report["model_gemm_flops"], rel=0.03), line["weights"]
        assert not any(ph["gemm_uncounted"] for ph in line["phases"].values())
        prefill = line["phases"]["prefill"]
        assert prefill["gemm_gflops"] > 0 and prefill["peak_gflops"] > 0 and prefill["peak_rows"] >= 4


def test_ops_are_categorized_by_name_and_by_the_range_they_run_in():
    assert op.category("aten::mm", {"prefill", "linear"}) == "gemm"
    assert op.category("aten::_int_mm", {"decode", "linear"}) == "gemm"
    assert op.category("aten::abs", {"decode", "linear"}) == "linear other"
    assert op.category("aten::bmm", {"decode", "attention"}) == "attention"
    assert op.category("aten::exp", {"decode", "attention"}) == "attention"
    assert op.category("mkldnn::_reorder_linear_weight", {"linear"}) == "reorder"
    assert op.category("aten::argmax", {"decode", "sampling"}) == "sampling"
    assert op.category("aten::view", {"decode"}) == "other"
    assert op.category("aten::silu", {"decode"}) == "elementwise"
    assert op.gemm_mnk("aten::addmm", [[8], [3, 5], [5, 8], [], []]) == (3, 8, 5)
    assert op.gemm_mnk("mkldnn::_linear_pointwise", [[2, 3, 5], [8, 5], [], [], [], []]) == (6, 8, 5)
    assert op.gemm_mnk("aten::_weight_int4pack_mm_for_cpu", [[3, 128], [128, 64], [], [2, 256, 2]]) == (3, 256, 128)


def test_onednn_verbose_lines_are_summed_by_primitive_and_weight_layout():
    text = "\n".join([
        "onednn_verbose,v1,info,oneDNN v3.12.0",
        "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,"
        "src:bf16::blocked:ab::f0 wei:bf16::blocked:ba::f0 dst:bf16::blocked:ab::f0,,,64x1024:1024x2816,2.5",
        "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,"
        "src:bf16::blocked:ab::f0 wei:bf16::blocked:ba::f0 dst:bf16::blocked:ab::f0,,,64x1024:1024x1024,0.5",
        "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,"
        "src:bf16::blocked:ab::f0 wei:bf16::blocked:ba::f0 dst:bf16::blocked:ab::f0,,,8x1024:1024x2816,1.0",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:ab::f0 "
        "dst:f32::blocked:AB16b64a::f0,,,256x128,0.25",
        "some other line"])
    assert op.onednn_primitives(text) == [
        {"primitive": "matmul", "implementation": "brg_matmul:avx512_core_bf16", "weights": "bf16 ba",
         "shape": "1024x2816", "calls": 2, "ms": 3.5},
        {"primitive": "matmul", "implementation": "brg_matmul:avx512_core_bf16", "weights": "bf16 ba",
         "shape": "1024x1024", "calls": 1, "ms": 0.5},
        {"primitive": "reorder", "implementation": "jit:uni", "weights": "-", "shape": "", "calls": 1, "ms": 0.25}]
    assert op.weight_dims("mb32ic128oc256") == "128x256"


def test_the_command_prints_its_table_and_names_a_bad_workload(cache_dir, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli.main, ["bench", "ops", "--help"])
    assert result.exit_code == 0 and "--workload ROWSxPROMPT+GEN" in result.output
    result = runner.invoke(cli.main, ["bench", "ops", "--workload", "64x128"])
    assert result.exit_code == 2 and "'64x128': write a workload as ROWSxPROMPT+GEN" in result.output
    out = tmp_path / "ops.json"
    result = runner.invoke(cli.main, ["bench", "ops", "--preset", "tiny", "--workload", "2x8+2", "--dtype", "float32",
                                      "--threads", "1", "--cache-dir", cache_dir, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "| float32 | uncompressed | decode |" in result.output and "CPU flags:" in result.output
    assert "load average" in result.output and "oneDNN primitives" in result.output and out.is_file()
