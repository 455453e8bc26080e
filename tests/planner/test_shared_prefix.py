"""The planner counts a shared prefix (engine/loop/shared_prefix.py): a row's KV cache and activations hold only its
own tokens, so under a memory limit that sends weights and cache to disk a few-shot job's block holds many more
rows, and the job is predicted faster; the prefix's own K/V are counted once."""

from dataclasses import replace

from engine.memory.footprint import kv_slot_bytes
from planner.memory_model import kv_block_bytes
from planner.search import search
from planner.workload import Workload
from tests.planner.specs import llama, server_cpu

GIB = 2**30
LLAMA_7B = llama(hidden=4096, ffn=11008, layers=32, heads=32, kv_heads=32, vocab=32000, context=4096, tied=False)
SHARED, OWN, GEN = 512, 64, 8  # a 5-shot prompt: 512 tokens every row shares, 64 of its own, 8 generated


def few_shot(shared: bool) -> Workload:
    prompt = OWN if shared else SHARED + OWN
    return Workload(prompt, GEN, 1024, max_prompt_len=prompt, shared_len=SHARED if shared else 0)


def test_a_block_holds_four_times_the_rows_under_a_memory_limit():
    plans = {s: search(LLAMA_7B, server_cpu(), few_shot(s), budgets={"cpu": 6 * GIB}) for s in (False, True)}
    alone, shared = plans[False], plans[True]
    assert alone.policy.weight_cpu < 1 and shared.policy.weight_cpu < 1  # the weights do not fit: disk tier
    assert shared.prediction.block_rows >= 4 * alone.prediction.block_rows, (shared.prediction, alone.prediction)
    assert shared.prediction.total_s < alone.prediction.total_s / 4


def test_the_prefix_is_counted_once_per_block():
    work = few_shot(True)
    slot = LLAMA_7B.num_layers * kv_slot_bytes(LLAMA_7B, work.dtype_bytes, False)
    rows = 16
    assert kv_block_bytes(LLAMA_7B, work, rows, False) == rows * (OWN + GEN) * slot + SHARED * slot
    assert kv_block_bytes(LLAMA_7B, replace(work, shared_len=0), rows, False) == rows * (OWN + GEN) * slot


def test_a_job_plans_with_the_prefix_its_sampled_prompts_share():
    from pipeline.input.sample import InputSample
    from pipeline.plan.planning import workload_from_sample

    prefix = list(range(100, 100 + SHARED))
    ids = {("a.parquet", n): tuple(prefix + [n] * (OWN - n)) for n in range(8)}
    sample = InputSample(prompt_lengths=tuple(len(v) for v in ids.values()), row_lengths=((GEN, False),) * 8,
                         prompt_ids=ids)
    shared = workload_from_sample(sample, LLAMA_7B, "bfloat16", 1024)
    assert shared.shared_len == SHARED and shared.max_prompt_len == OWN, shared
    alone = workload_from_sample(sample, LLAMA_7B, "bfloat16", 1024, share_prefix=False)
    assert alone.shared_len == 0 and alone.max_prompt_len == SHARED + OWN
