"""W4, rows that finish early (lines of `flexbatch bench engine`): prompts of 64-512 tokens, per-row
max_new_tokens uniform in [8, 256], and on every other row the stop string " " (the end of the first word: a
one-word answer, as HELM's newline stop makes of most rows). fp32, greedy.

Runs, timed interleaved round by round (the machine is shared: medians of the rounds):
  - flexbatch with refill (finished rows' slots take waiting rows, engine/loop/refill.py);
  - flexbatch sorted: without refill, the engine's blocks of rows of similar max_new_tokens, finished rows
    dropped from their GPU batch (the fallback where refill does not pay);
  - the block schedule as it was before either (blocks by prompt length alone, every row computed until its block
    ends): the baseline of the W4 target;
  - transformers `generate` at each batch size, rows sorted by prompt length, each batch generating up to its
    longest row's useful length (what flexbatch's run produced for the row: stopped rows included), so it never
    computes a token that row would discard: a favourable bound for transformers.
Useful tokens/s counts each row's completion tokens up to its own stop. Exactness: every flexbatch run's tokens
equal the refill run's, row for row (checked every round).

The refill choice: what `--refill auto` picks (the planner's prediction, `refill_pick`) against the other choice,
measured, on W4 and on a workload where refill should pay (every row allowed one max_new_tokens, short prompts,
GPU batches of 8):
the pick agrees with measurement where its line's ratio is >= 1."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random

import torch

import engine.batching as batching
import engine.loop.schedule as schedule
from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from jobs.bench import models as bm
from jobs.bench.report import Line
from jobs.bench.runs import best, generations

log = logging.getLogger(__name__)
STOP = " "


@dataclasses.dataclass(frozen=True)
class EarlyStopConfig:
    preset: str = "tiny1k"
    prompts: int = 512
    prompt_lens: tuple[int, int] = (64, 512)
    max_new: tuple[int, int] = (8, 256)
    gbs: int = 32
    hf_batches: tuple[int, ...] = (8, 32)
    repeats: int = 2
    # the refill-choice line's second workload, where refill should pay: short prompts, every row allowed the same
    # max_new_tokens (so grouping rows by it gains nothing), the same stop string on every other row, and small
    # GPU batches (as a memory limit leaves a large model), where the steps refill saves cost the most
    one_length_prompt_lens: tuple[int, int] = (8, 64)
    one_length_max_new: int = 256
    one_length_gbs: int = 8
    hardware: str | None = None  # the profile the refill choice is planned with (a file); this machine's by default


def w4_requests(cfg: EarlyStopConfig, vocab_size: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(cfg.prompts):
        ids = [rng.randint(1, vocab_size - 1) for _ in range(rng.randint(*cfg.prompt_lens))]
        params = SamplingParams(max_new_tokens=rng.randint(*cfg.max_new), stop=(STOP,) if i % 2 else ())
        out.append(Request(f"r{i}", bm.prompt_text(ids), params))
    return out


@contextlib.contextmanager
def block_schedule_before():
    """The block schedule before rows were grouped by max_new_tokens and finished rows dropped: blocks by prompt
    length alone, every row computed until its block ends."""
    saved = batching.MAX_NEW_GROUP, schedule.DROP_SHARE
    batching.MAX_NEW_GROUP, schedule.DROP_SHARE = 0, 2.0  # one group; a share above 1 never drops
    try:
        yield
    finally:
        batching.MAX_NEW_GROUP, schedule.DROP_SHARE = saved


def engine_w4_runner(eng: Engine, reqs: list[Request], policy: Policy, record: dict, name: str,
                     schedule_of=contextlib.nullcontext):
    def run(_gen_len: int) -> int:
        with schedule_of():
            comps = eng.generate(reqs, policy)
        bad = [c for c in comps if c.error]
        assert not bad, f"{len(bad)} rows failed: {bad[0].error}"
        record[name] = comps
        record[name + " schedule"] = dict(eng.schedule_counts)
        return sum(c.completion_tokens for c in comps)

    return run


def hf_w4_runner(model, tokenizer, reqs: list[Request], useful: list[int], batch: int):
    """transformers `generate` over rows sorted by prompt length; each batch stops at its longest useful row."""
    order = sorted(range(len(reqs)), key=lambda i: len(reqs[i].prompt.split()))

    def run(_gen_len: int) -> int:
        total = 0
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            enc = tokenizer([reqs[i].prompt for i in idx], return_tensors="pt", padding=True)
            want = max(useful[i] for i in idx)
            with torch.inference_mode():
                model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], do_sample=False, max_new_tokens=want, min_new_tokens=want, pad_token_id=0)
            total += sum(useful[i] for i in idx)
        return total

    return run


def refill_pick(eng: Engine, reqs: list[Request], comps, gbs: int, hardware: str | None) -> dict:
    """What `--refill auto` picks for these rows at GPU batch `gbs`: the planner's prediction of each choice with
    this machine's profile, on the workload a job would plan (`pipeline.plan.planning`: the rows' prompt lengths, own
    max_new_tokens and stop strings), with the tokens the rows really generated measured."""
    from pipeline.input.sample import InputSample
    from pipeline.plan.planning import measured_workload, workload_from_sample
    from planner.hardware import load_hardware
    from planner.predict import predict
    from planner.profiler import load_or_profile

    sample = InputSample(tuple(len(eng.tokenizer(r.prompt)["input_ids"]) for r in reqs),
                         tuple((r.params.max_new_tokens, bool(r.params.stop)) for r in reqs))
    work = workload_from_sample(sample, eng.spec, "float32", len(reqs))
    work = measured_workload(work, len(comps), sum(c.completion_tokens for c in comps))
    hw = load_hardware(hardware) if hardware else load_or_profile()
    seconds = {r: predict(eng.spec, hw, work, Policy(gbs=gbs, num_gb=1, refill=r)).total_s for r in (False, True)}
    return {"refill": seconds[True] < seconds[False], "predicted_s": {"refill": seconds[True], "sorted": seconds[False]},
            "workload": dataclasses.asdict(work)}


def choice_line(name: str, what: str, pick: dict, rate: dict) -> Line:
    """The planner's pick (refill or sorted) against the other, measured: a ratio >= 1 means it picked the faster."""
    ours, other = ("flexbatch refill", "flexbatch sorted") if pick["refill"] else ("flexbatch sorted", "flexbatch refill")
    p = pick["predicted_s"]
    return Line(name, f"{what}: refill auto picks {ours.split()[1]} (predicted refill/sorted time "
                f"{p['refill'] / p['sorted']:.2f}x) vs {other.split()[1]}", "useful tokens/s", rate[ours], rate[other],
                1.0, pick)


def one_length_lines(cfg: EarlyStopConfig, eng: Engine) -> list[Line]:
    """The refill choice where refill should pay: every row allowed one max_new_tokens, short prompts; refill vs
    sorted timed interleaved, tokens checked equal."""
    one = dataclasses.replace(cfg, prompt_lens=cfg.one_length_prompt_lens,
                              max_new=(cfg.one_length_max_new, cfg.one_length_max_new))
    reqs, record, gbs = w4_requests(one, eng.spec.vocab_size), {}, cfg.one_length_gbs
    refill, plain = Policy(gbs=gbs, num_gb=1, refill=True), Policy(gbs=gbs, num_gb=1)
    engine_w4_runner(eng, reqs, refill, record, "refill")(0)  # warm-up
    res = generations({"flexbatch refill": engine_w4_runner(eng, reqs, refill, record, "refill"),
                       "flexbatch sorted": engine_w4_runner(eng, reqs, plain, record, "sorted")}, 0, cfg.repeats,
                      warm_up=False)
    exact = [c.token_ids for c in record["refill"]] == [c.token_ids for c in record["sorted"]]
    pick = refill_pick(eng, reqs, record["refill"], gbs, cfg.hardware)
    pick |= {"tokens_equal": exact, "runs_tokens_per_s": {k: [r["tokens_per_s"] for r in v["runs"]]
                                                          for k, v in res.items()}}
    what = (f"W4 one length ({cfg.prompts} rows, prompts {one.prompt_lens[0]}-{one.prompt_lens[1]}, max_new_tokens "
            f"{cfg.one_length_max_new}, gbs {gbs}), tokens equal: {exact}")
    return [choice_line("early-stop-choice-one-length", what, pick, {k: v["tokens_per_s"] for k, v in res.items()})]


def early_stop_lines(cfg: EarlyStopConfig, cache_dir: str) -> list[Line]:
    """W4: flexbatch with refill vs transformers at its best batch and vs the block schedule before; sorted vs
    that block schedule (useful tokens/s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = bm.build_checkpoint(cfg.preset, cache_dir)
    eng = Engine.load(model_dir, dtype="float32")
    reqs = w4_requests(cfg, eng.spec.vocab_size)
    record: dict = {}
    plain, refill = Policy(gbs=cfg.gbs, num_gb=1), Policy(gbs=cfg.gbs, num_gb=1, refill=True)
    engine_w4_runner(eng, reqs, refill, record, "refill")(0)  # warm-up, and the useful length of every row
    useful = [c.completion_tokens for c in record["refill"]]
    runners = {"flexbatch refill": engine_w4_runner(eng, reqs, refill, record, "refill"),
               "flexbatch sorted": engine_w4_runner(eng, reqs, plain, record, "sorted"),
               "flexbatch blocks": engine_w4_runner(eng, reqs, plain, record, "blocks", block_schedule_before)}
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left", trust_remote_code=False)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=False).eval()
    runners |= {f"transformers bs {b}": hf_w4_runner(hf, tok, reqs, useful, b) for b in cfg.hf_batches}
    res = generations(runners, 0, cfg.repeats, warm_up=False)
    tokens = {k: [c.token_ids for c in record[k]] for k in ("refill", "sorted", "blocks")}
    exact = tokens["refill"] == tokens["blocks"] == tokens["sorted"]
    theirs = {k: v for k, v in res.items() if k.startswith("transformers")}
    hf_top = best(theirs)
    rate = {k: v["tokens_per_s"] for k, v in res.items()}
    detail = {"tokens_per_s": rate, "runs_tokens_per_s": {k: [r["tokens_per_s"] for r in v["runs"]] for k, v in res.items()},
              "vs_blocks": rate["flexbatch refill"] / rate["flexbatch blocks"], "tokens_equal": exact,
              "refill_vs_sorted": rate["flexbatch refill"] / rate["flexbatch sorted"],
              "useful_tokens": sum(useful), "rows_stopped": sum(c.finish_reason == "stop" for c in record["refill"]),
              "schedule": {k: record[f"{k} schedule"] for k in ("refill", "sorted", "blocks")},
              "config": dataclasses.asdict(cfg)}
    what = f"W4 {cfg.prompts} rows, tokens equal: {exact}"
    return [Line("early-stop", f"{what}: flexbatch refill vs {hf_top}", "useful tokens/s", rate["flexbatch refill"],
                 rate[hf_top], 1.5, detail),
            Line("early-stop-blocks", f"{what}: refill vs the block schedule before (by prompt length, rows kept)",
                 "useful tokens/s", rate["flexbatch refill"], rate["flexbatch blocks"], 1.5),
            Line("early-stop-sorted", f"{what}: sorted by max_new_tokens, finished rows dropped, vs the block "
                 f"schedule before (refill {detail['refill_vs_sorted']:.2f}x sorted)", "useful tokens/s",
                 rate["flexbatch sorted"], rate["flexbatch blocks"], None),
            choice_line("early-stop-choice", what, refill_pick(eng, reqs, record["refill"], cfg.gbs, cfg.hardware), rate),
            *one_length_lines(cfg, eng)]
