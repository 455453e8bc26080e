"""`flexbatch bench workloads --whole-process`: real `flexbatch run --no-ray` processes timed start to exit, the
CTranslate2 script run for real where it is installed, every row checked to generate exactly G tokens, and the
ratios taken to the CTranslate2 script's timed rounds."""

import json
import shlex
import sys

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from jobs.bench import models as bm
from jobs.bench import whole_process as wp
from jobs.bench import workloads as wl
from jobs.bench.side_by_side import side_by_side


def test_whole_process_lines_run_real_flexbatch_run_commands(tmp_path):
    out = tmp_path / "w.json"
    res = CliRunner().invoke(wl.workloads_command, [
        "--preset", "tiny", "--workload", "W3", "--no-in-process", "--whole-process", "int8", "--no-ctranslate2",
        "--repeats", "1", "--threads", "1", "--cache-dir", str(tmp_path), "--output", str(out)])
    assert res.exit_code == 0, res.output
    w = json.loads(out.read_text())["workloads"][0]
    assert w["lines"] == [] and w["whole_process"]["threads"] == 1
    (line,) = w["whole_process"]["lines"]
    argv = shlex.split(line["command"])
    exe = wp.flexbatch_exe()
    assert argv[:len(exe) + 2] == [*exe, "run", "--no-ray"]
    for flag, value in (("--model", str(tmp_path / "tiny")), ("--max-new-tokens", "16"), ("--dtype", "float32"),
                        ("--compress-weight", "int8")):
        assert argv[argv.index(flag) + 1] == value
    assert line["line"] == "flexbatch run float32 int8" and line["tokens"] == 128 * 16
    assert line["tokens_per_s"] == pytest.approx(line["tokens"] / line["seconds"])
    assert 0 < line["cpu_seconds"] and 50 << 20 < line["peak_rss_bytes"] < 8 << 30 and line["warm_up_seconds"] > 0
    assert line["vs_ct2_int8"] is None and len(line["runs_seconds"]) == 1
    assert 0 < line["generate_seconds"] < line["seconds"] and line["block"] == "128x1"
    assert "| W3 128x64 gen 16 | flexbatch run float32 int8 |" in res.output and "Generation, each line" not in res.output


def test_ctranslate2_script_generates_exactly_g_tokens_for_every_row(tmp_path):
    pytest.importorskip("ctranslate2")
    model_dir = bm.build_checkpoint("tiny", tmp_path)
    prompts = bm.prompt_ids(3, 8, bm.PRESETS["tiny"].vocab_size)
    input_ = wp.write_prompts(tmp_path / "in.parquet", prompts)
    argv = wp.ct2_command(wl.ct2_model(model_dir, "int8"), model_dir / "tokenizer.json", input_, 5, 1)
    done = wp.run_process(argv, 1, tmp_path)
    assert wp.check_script_output(done["stdout"], 3, 8, 5, "the CTranslate2 script")["completion_tokens"] == [5] * 3
    with pytest.raises(click.ClickException, match="the CTranslate2 script generated .* not 6 from 8 for 3"):
        wp.check_script_output(done["stdout"], 3, 8, 6, "the CTranslate2 script")


def write_output(folder, rows):
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.table({k: [r[i] for r in rows] for i, k in enumerate(
        ("id", "prompt_tokens", "completion_tokens", "error"))}), folder / "in.parquet")
    pq.write_table(pa.table({"x": [1]}), folder / "_ignored.parquet")
    return folder


def test_a_flexbatch_output_with_a_short_lost_repeated_or_failed_row_is_refused(tmp_path):
    ids = ["r0", "r1", "r2"]
    good = [("r0", 8, 4, None), ("r1", 8, 4, None), ("r2", 8, 4, None)]
    assert wp.check_flexbatch_output(write_output(tmp_path / "good", good), ids, 8, 4) == 12
    bad = {"short": (good[:2] + [("r2", 8, 3, None)], "row r2: 3 tokens generated"),
           "lost": (good[:2], "wrote 2 rows"),
           "repeated": (good + [good[0]], "wrote 4 rows \\(3 distinct"),
           "failed": (good[:2] + [("r2", 8, 0, "boom")], "error: boom"),
           "cut prompt": (good[:2] + [("r2", 7, 4, None)], "from a 7-token prompt")}
    for name, (rows, message) in bad.items():
        with pytest.raises(click.ClickException, match=message):
            wp.check_flexbatch_output(write_output(tmp_path / name.replace(" ", "_"), rows), ids, 8, 4)
    (tmp_path / "good" / "_SUCCESS").write_text(json.dumps({"generate_seconds": 1.5, "workers": [
        {"threads": 2, "setup_seconds": 3.0, "policy": {"gbs": 3, "num_gb": 1}}]}))
    assert wp.flexbatch_summary(tmp_path / "good", 2) == {"generate_seconds": 1.5, "setup_seconds": 3.0, "block": "3x1"}
    with pytest.raises(click.ClickException, match="used 2 threads, not 1"):
        wp.flexbatch_summary(tmp_path / "good", 1)


def canned_lines(tmp_path, runs_of: dict[str, list[dict]]) -> list[dict]:
    """The whole-process lines of lines that return the given runs (the warm-up's first), through the runner."""
    its = {name: iter(runs) for name, runs in runs_of.items()}
    lines = {name: wp.in_folder(lambda workdir, it=it: next(it), tmp_path) for name, it in its.items()}
    return wp.whole_process_lines(side_by_side(lines, len(next(iter(runs_of.values()))) - 1, warm_up=lines))


def test_ratios_are_to_the_faster_ctranslate2_script_over_the_timed_rounds_and_the_table_shows_them(tmp_path):
    def runs(*seconds):
        return [{"seconds": s, "tokens": 100, "cpu_seconds": 1.0, "peak_rss_bytes": 64 << 20, "generate_seconds": s / 2,
                 "command": ["flexbatch", "run"]} for s in seconds]

    lines = canned_lines(tmp_path, {"flexbatch run float32 int8": runs(100.0, 2.0, 4.0),
                                    wp.CT2_LINE: runs(100.0, 1.0, 1.0), wp.CT2_HEAP_LINE: runs(100.0, 2.0, 2.0)})
    ours, ct2, ct2_heap = lines
    assert ct2_heap["vs_ct2_int8"] == 0.5  # the faster script is the baseline, whichever it is
    assert ours["tokens_per_s"] == 37.5 and ct2["tokens_per_s"] == 100.0 and ours["vs_ct2_int8"] == 0.375
    assert ours["seconds"] == 3.0 and ours["warm_up_seconds"] == 100.0 and ours["runs_seconds"] == [2.0, 4.0]
    report = {"machine": {"cpu_flags": "avx2"}, "config": {"dtype": "float32"}, "gemm_peak_gflops": 90.0,
              "workloads": [{"workload": "W3", "rows": 128, "prompt_tokens": 64, "generated": 16, "lines": [],
                             "whole_process": {"threads": 2, "rounds": 2, "lines": lines}}]}
    table = wl.table_text(report)
    assert "Whole processes, 2 threads each, median of 2 rounds" in table
    assert "| W3 128x64 gen 16 | flexbatch run float32 int8 | 3.00 | 37.5 | 0.38x | 1.50 | 1.0 | 64 MiB |" in table
    assert "| W3 128x64 gen 16 | ctranslate2 int8 script | 1.00 | 100.0 | 1.00x | 0.50 | 1.0 | 64 MiB |" in table


def test_a_process_gets_the_environment_its_line_adds(tmp_path):
    argv = [sys.executable, "-c", "import os; print(os.environ['MALLOC_MMAP_MAX_'], os.environ['OMP_NUM_THREADS'])"]
    done = wp.run_process(argv, 3, tmp_path, wp.CT2_LINES[wp.CT2_HEAP_LINE])
    assert done["stdout"].split() == ["0", "3"]


def test_no_in_process_needs_a_whole_process_format_and_help_teaches_it():
    res = CliRunner().invoke(wl.workloads_command, ["--no-in-process"])
    assert res.exit_code == 2 and "--whole-process int8" in res.output
    help_text = CliRunner().invoke(wl.workloads_command, ["--help"]).output
    assert "--whole-process [int4|int8|uncompressed]" in help_text and "CTranslate2 int8 script" in help_text
