"""`flexbatch bench score`: scoring prompts (every token's log-probability given the ones before it: HELM's
language_modeling requests, lm-eval's loglikelihood), which is prefill only, side by side:

    flexbatch     the engine's prompt scores (`SamplingParams(prompt_logprobs=True)`, one token asked for)
    flexbatch F   the same with compressed weights of format F (`--compress-weight int8`: int8 x int8 GEMMs), a
                  different arithmetic: its scores differ from the first line's by what the max |diff| column says
    transformers  the model's forward over the batch, then log_softmax gathered at the next tokens

All in one process on one loaded checkpoint each, interleaved round by round (median quoted). Per line: scored
tokens/s, scored tokens per CPU second (the process's CPU time over the call: what the line costs on a shared
machine, where another line may use more cores than its threads), and model FLOP/s (layers at every position,
the LM head at every scored position, causal attention) as a fraction of a GEMM microbenchmark of the dtype (the
widest layer shape at 1024 rows), and the largest difference of its scores from the first line's.

`--choices K` makes the rows questions of K rows sharing all but their last token (a context, then a choice:
lm-eval's multiple-choice `loglikelihood` requests with `--score-last 1`). `--score-last N` scores each row's last N
tokens only, as lm-eval's loglikelihood asks of a continuation after its
context: flexbatch runs the LM head at those positions (`score_last`), transformers keeps those logits
(`logits_to_keep`), and vLLM computes `prompt_logprobs` over the whole prompt, as lm-eval's vllm backend asks it.

With --vllm-venv DIR a vLLM line, vLLM's `prompt_logprobs` (jobs/bench/vllm_script.py --score, run by DIR/bin/python
in a process of its own each round, after the in-process lines, with vLLM's CPU settings of the whole-process
bench): the seconds it spends in `llm.generate` (after an untimed warm-up of one batch of other rows) and the CPU
seconds its processes (the script's and vLLM's engine process) spend meanwhile, its process from start to exit,
and the largest difference of its scores from flexbatch's and from transformers'; every line's ratio to it."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import click
import torch

from engine.engine import Engine
from engine.policy import WEIGHT_FORMATS, Policy
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec
from jobs.bench import models as bm
from jobs.bench import whole_process as wp
from jobs.bench.options import bench_options, vllm_option, vllm_python
from jobs.bench.report import run_and_save
from jobs.bench.side_by_side import side_by_side
from jobs.bench.table import Column, format_table
from jobs.bench.workloads import cpu_flags, gemm_peak_gflops
from jobs.common import setup_logging
from planner.microbench import timed_call

UNCOMPRESSED = "uncompressed"


@dataclass(frozen=True)
class ScoreConfig:
    rows: int = 4096
    length: int = 256
    preset: str = "110m"
    dtype: str = "float32"
    batch: int = 32  # transformers' batch, and the engine's GPU batch (blocks of batch x 2 rows)
    repeats: int = 2
    cache_dir: str = str(bm.DEFAULT_CACHE_DIR)
    threads: int | None = None  # of the vLLM line (the in-process lines: torch's, set by the command)
    formats: tuple[str, ...] = (UNCOMPRESSED,)  # one flexbatch line per weight format (UNCOMPRESSED or WEIGHT_FORMATS)
    score_last: int = 0  # score each row's last this many tokens only (a continuation after its context); 0: all
    choices: int = 1  # rows per question: each question's rows share all but their last token (its context)
    vllm_venv: str | None = None  # a vLLM prompt_logprobs line (options.vllm_option)


def engine_scorer(model_dir: Path, dtype: str, batch: int, fmt: str = UNCOMPRESSED, score_last: int = 0):
    compressed = fmt != UNCOMPRESSED
    policy = Policy(gbs=batch, num_gb=2, compress_weight=compressed, **({"weight_format": fmt} if compressed else {}))
    eng = Engine.load(model_dir, dtype=dtype, policy=policy)

    def score(prompts: list[list[int]]) -> list[list[float]]:
        params = SamplingParams(max_new_tokens=1, prompt_logprobs=True, score_last=score_last)
        reqs = [Request(f"r{i}", "", params, prompt_ids=tuple(p)) for i, p in enumerate(prompts)]
        return [c.prompt_logprobs for c in eng.generate(reqs)]

    return score


def hf_scorer(model_dir: Path, dtype: str, batch: int, score_last: int = 0):
    """transformers' forward over batches of rows, log_softmax of the logits gathered at the next tokens; with
    `score_last` the logits of the positions that score those tokens only (`logits_to_keep`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()

    def score(prompts: list[list[int]]) -> list[list[float]]:
        out = []
        with torch.inference_mode():
            for i in range(0, len(prompts), batch):
                ids = torch.tensor(prompts[i : i + batch])  # equal lengths: no padding
                keep = score_last + 1 if score_last else 0  # 0: every position
                logits = model(ids, logits_to_keep=keep).logits[:, :-1].float()
                targets = ids[:, ids.shape[1] - logits.shape[1] :]
                out += logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0].tolist()
        return out

    return score


def check_vllm_scores(stdout: str, logprobs: Path, rows: int, length: int) -> tuple[dict, list[list[float]]]:
    """The vLLM script's JSON line and its scores, once every row scored its length - 1 tokens."""
    res = wp.check_script_output(stdout, rows, length, 1)
    scores = json.loads(Path(logprobs).read_text())
    if res["scored_tokens"] != rows * (length - 1) or {len(s) for s in scores} != {length - 1}:
        raise click.ClickException(f"the vLLM script scored {res['scored_tokens']} tokens, not {rows * (length - 1)}")
    return res, scores


def vllm_scorer(python: Path, model_dir: Path, prompts: list[list[int]], dtype: str, threads: int, warm_up: int,
                tmp: Path, scores: dict, score_last: int = 0):
    """The vLLM line: a run is its script in a process of its own, in a fresh folder under `tmp`; its seconds and CPU
    seconds in llm.generate, and its scores kept under "vllm" (prompt_logprobs scores every token: with
    `score_last`, the tail that the other lines score)."""
    input_ = wp.write_prompt_ids(tmp / "prompt_ids.parquet", prompts)

    def run() -> dict:
        workdir = Path(tempfile.mkdtemp(dir=tmp))
        argv = wp.vllm_command(python, model_dir, input_, 1, dtype, score=True, logprobs_out=workdir / "lp.json",
                               warm_up_rows=warm_up)
        done = wp.run_process(argv, threads, workdir, wp.vllm_env(python, threads))
        res, every = check_vllm_scores(done["stdout"], workdir / "lp.json", len(prompts), len(prompts[0]))
        scores["vllm"] = [row[-score_last:] for row in every] if score_last else every
        return res | {"seconds": res["generate_seconds"], "cpu_seconds": res["generate_cpu_seconds"],
                      "process_seconds": done["seconds"], "command": argv}

    return run


def scoring_line(fn, prompts: list[list[int]], scores: dict, name: str):
    """A line of in-process scoring: the seconds and this process's CPU seconds of scoring every row; its scores
    kept under `name`."""
    def run() -> dict:
        cpu0 = time.process_time()
        scores[name], seconds = timed_call(lambda: fn(prompts))
        return {"seconds": seconds, "cpu_seconds": time.process_time() - cpu0}

    return run


def question_rows(rows: int, length: int, vocab_size: int, choices: int) -> list[list[int]]:
    """`rows` random rows of `length` tokens; with `choices` > 1, questions of that many rows, each question's rows
    sharing their first length - 1 tokens (its context) and ending in a token of their own (a choice)."""
    prompts = bm.prompt_ids(rows, length, vocab_size)
    if choices > 1:
        prompts = [prompts[i - i % choices][:-1] + p[-1:] for i, p in enumerate(prompts)]
    return prompts


def run_score(cfg: ScoreConfig) -> dict:
    model_dir = bm.build_checkpoint(cfg.preset, cfg.cache_dir)
    spec = load_model_spec(model_dir)
    prompts = question_rows(cfg.rows, cfg.length, spec.vocab_size, cfg.choices)
    dtype = cfg.dtype if cfg.dtype != "auto" else str(Engine.load(model_dir, dtype="auto").dtype).split(".")[-1]
    scorers = {line_name(f): engine_scorer(model_dir, dtype, cfg.batch, f, cfg.score_last) for f in cfg.formats}
    scorers["transformers"] = hf_scorer(model_dir, dtype, cfg.batch, cfg.score_last)
    scores: dict[str, list] = {}
    lines = {name: scoring_line(fn, prompts, scores, name) for name, fn in scorers.items()}
    vllm = vllm_python(cfg.vllm_venv)
    with tempfile.TemporaryDirectory(prefix="flexbatch-score-vllm-") as tmp:
        if vllm:  # after the in-process lines each round, with a warm-up of its own in its process
            lines["vllm"] = vllm_scorer(vllm, model_dir, prompts, dtype, cfg.threads or torch.get_num_threads(),
                                        cfg.batch, Path(tmp), scores, cfg.score_last)
        res = side_by_side(lines, cfg.repeats, {k: partial(fn, prompts[: cfg.batch]) for k, fn in scorers.items()})
    first = torch.tensor(scores[line_name(cfg.formats[0])])
    worst = {k: float((torch.tensor(v) - first).abs().max()) for k, v in scores.items()}
    peak = gemm_peak_gflops(spec, getattr(torch, dtype))
    f = bm.model_flops(spec, cfg.length, 1, cfg.rows)
    scored = min(cfg.score_last, cfg.length - 1) if cfg.score_last else cfg.length - 1
    flops = f["linear"] + f["attention"] + f["head"] * (scored if cfg.score_last else cfg.length)
    tokens = cfg.rows * scored
    lines = [{"line": k, "seconds": r["seconds"], "tokens_per_s": tokens / r["seconds"], "cpu_seconds": r["cpu_seconds"],
              "tokens_per_cpu_s": tokens / r["cpu_seconds"], "gemm_fraction": flops / r["seconds"] / 1e9 / peak,
              "max_abs_diff": worst[k], "runs_seconds": [x["seconds"] for x in r["runs"]],
              "runs_cpu_seconds": [x["cpu_seconds"] for x in r["runs"]]} for k, r in res.items()]
    by_name = {ln["line"]: ln for ln in lines}
    for ln in lines:
        ln["vs_transformers"] = ln["tokens_per_s"] / by_name["transformers"]["tokens_per_s"]
        if "vllm" in by_name:
            ln["vs_vllm"] = ln["tokens_per_s"] / by_name["vllm"]["tokens_per_s"]
            ln["vs_vllm_per_cpu_s"] = ln["tokens_per_cpu_s"] / by_name["vllm"]["tokens_per_cpu_s"]
    if vllm:
        ln = lines[-1]
        ln["max_abs_diff_vs_transformers"] = float((torch.tensor(scores["vllm"]) - torch.tensor(scores["transformers"]))
                                                   .abs().max())
        ln |= {k: res["vllm"][k] for k in ("process_seconds", "startup_seconds")}
        ln["command"] = " ".join(res["vllm"]["runs"][-1]["command"])
    return {"config": asdict(cfg), "dtype": dtype, "gemm_peak_gflops": peak,
            "machine": bm.machine_info() | {"cpu_flags": cpu_flags()}, "lines": lines}


def line_name(fmt: str) -> str:
    return "flexbatch" if fmt == UNCOMPRESSED else f"flexbatch {fmt}"


def table_text(report: dict) -> str:
    c = report["config"]
    vs_vllm = any("vs_vllm" in ln for ln in report["lines"])
    columns = ("line", "scored tokens/s", "per CPU-s", "vs transformers",
               *(("vs vLLM", "vs vLLM per CPU-s") if vs_vllm else ()), "fraction of GEMM peak",
               f"max |diff| vs {report['lines'][0]['line']}")
    rows = [(ln["line"], f"{ln['tokens_per_s']:.0f}", f"{ln['tokens_per_cpu_s']:.0f}", f"{ln['vs_transformers']:.2f}x",
             *((f"{ln['vs_vllm']:.2f}x", f"{ln['vs_vllm_per_cpu_s']:.2f}x") if vs_vllm else ()),
             f"{ln['gemm_fraction']:.2f}", f"{ln['max_abs_diff']:.1e}") for ln in report["lines"]]
    below = [f"vllm: seconds in llm.generate (after a warm-up batch), {ln['cpu_seconds']:.1f} CPU-s there (its "
             f"process and its engine process); its process {ln['process_seconds']:.1f} s start to exit, of which "
             f"{ln['startup_seconds']:.1f} s to a loaded engine; max |diff| vs transformers "
             f"{ln['max_abs_diff_vs_transformers']:.1e}" for ln in report["lines"] if ln["line"] == "vllm"]
    return format_table(tuple(Column(t) for t in columns), rows, markdown=True, below=below, above=[
        f"CPU flags: {report['machine']['cpu_flags']}",
        f"{c['rows']} rows x {c['length']} tokens, {report['dtype']}, batch {c['batch']}; GEMM peak "
        f"{report['gemm_peak_gflops']:.1f} GFLOP/s; median of {c['repeats']} rounds after a warm-up:"])


@click.command("score")
@click.option("--rows", type=click.IntRange(min=1), default=ScoreConfig.rows, show_default=True)
@click.option("--length", type=click.IntRange(min=2), default=ScoreConfig.length, show_default=True,
              help="Tokens per row.")
@click.option("--batch", type=click.IntRange(min=1), default=ScoreConfig.batch, show_default=True,
              help="transformers' batch and the engine's GPU batch (blocks of 2 GPU batches).")
@click.option("--score-last", type=click.IntRange(min=0), default=ScoreConfig.score_last, show_default=True,
              help="Score each row's last N tokens only (lm-eval's loglikelihood: a continuation after its context); "
                   "the vLLM line still asks prompt_logprobs of the whole prompt, as lm-eval's vllm backend does. "
                   "0: every token.")
@click.option("--choices", type=click.IntRange(min=1), default=ScoreConfig.choices, show_default=True,
              help="Rows per question: each question's rows share all but their last token (a multiple-choice "
                   "question's context, each row one choice; with --score-last 1, lm-eval's loglikelihood of it).")
@click.option("--compress-weight", "formats", type=click.Choice((UNCOMPRESSED, *WEIGHT_FORMATS)), multiple=True,
              default=ScoreConfig.formats, show_default=True,
              help="A flexbatch line per weight format (repeat the option); the first line is the one every line's "
                   "scores are compared with.")
@bench_options(ScoreConfig, "score.json")
@vllm_option("vLLM's prompt_logprobs in a process of its own each round")
def score_command(threads, vllm_venv, output: Path, **kw):
    """Scoring prompts (prefill only): flexbatch's prompt scores vs transformers' forward + log_softmax.

    \b
    Example:
      flexbatch bench score --rows 256 --threads 2
      flexbatch bench score --rows 256 --threads 2 --vllm-venv .venv-vllm
      flexbatch bench score --rows 64 --threads 1 --dtype bfloat16 --compress-weight uncompressed --compress-weight int8
      flexbatch bench score --rows 64 --length 601 --choices 4 --score-last 1 --threads 1 --dtype bfloat16
    """
    setup_logging()
    vllm_python(vllm_venv)  # a missing venv is an error before any line runs
    if threads:
        torch.set_num_threads(threads)
    cfg = ScoreConfig(threads=threads, vllm_venv=vllm_venv and str(vllm_venv), **kw)
    click.echo(table_text(run_and_save(run_score, cfg, output)))
