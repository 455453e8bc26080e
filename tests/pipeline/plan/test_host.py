"""The engine host every caller goes through (a job's worker, the Ray Data stage, lm-eval): it plans on the first
rows it is handed as a job plans on its sample, then completes rows in engine calls of one block and then
BLOCKS_PER_CALL blocks, every request once, each completion back in its row's place."""

from pathlib import Path

import pytest

from engine.batching import BLOCKS_PER_CALL
from engine.policy import Policy
from engine.request import Completion, Request, SamplingParams
from engine.spec import load_model_spec, spec_from_config
from engine.tokenizer import load_tokenizer
from pipeline.input.sample import SAMPLE_ROWS, requests_sample
from pipeline.plan.host import EngineHost
from pipeline.plan.planning import planned_policy, unplanned_policy, workload_from_sample
from pipeline.plan.settings import EngineSettings
from planner.hardware import save_hardware
from tests.planner.specs import server_cpu

PROMPTS = ["Q: What is 12 plus 30? A:", "def add(a, b):", "Product A: red kettle", "The quick brown fox", "copy: abc ->",
           "Pack my box with five dozen", "hello", "x y z"]


def _items(n: int) -> list:
    """`n` requests of varied lengths, every third row one that failed before the engine (a `Completion`)."""
    return [Completion.failed(f"r{i}", "bad row") if i % 3 == 2 else
            Request(id=f"r{i}", prompt=PROMPTS[i % len(PROMPTS)] * (1 + i % 4),
                    params=SamplingParams(max_new_tokens=2 + i % 5, stop=("\n",) if i % 2 else ()))
            for i in range(n)]


@pytest.fixture
def spied_calls(monkeypatch):
    """The ids of every engine call's requests, in call order."""
    from engine.engine import Engine

    calls, generate = [], Engine.generate

    def spy(self, requests, *args, **kwargs):
        if requests and requests[0].id != "warm-up":
            calls.append([r.id for r in requests])
        return generate(self, requests, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    return calls


def test_the_host_plans_on_the_first_rows_as_a_job_plans_on_its_sample(tmp_path, tiny_llama_dir):
    hw = save_hardware(server_cpu(), tmp_path / "hw.json")
    spec, tokenizer = load_model_spec(tiny_llama_dir), load_tokenizer(tiny_llama_dir)
    items = _items(9)
    host = EngineHost()
    taken = host.take_first(Path(tiny_llama_dir), spec, EngineSettings(dtype="float32", hardware=hw), items)
    try:
        requests = [item for item in taken if isinstance(item, Request)]
        assert [item.id for item in taken] == [item.id for item in items] and len(requests) == 6
        assert [r.prompt_ids for r in requests] == [tuple(tokenizer(r.prompt)["input_ids"]) for r in requests]
        assert all(a is b for a, b in zip(taken, items) if isinstance(a, Completion))  # failed rows kept as they are
        sample = requests_sample(taken, SamplingParams())
        assert sample.prompt_lengths == tuple(len(r.prompt_ids) for r in requests)
        assert sample.row_lengths == tuple((r.params.max_new_tokens, bool(r.params.stop)) for r in requests)
        assert host.prediction.workload == workload_from_sample(sample, spec, "float32", 6)
        assert host.engine is not None and host.measured == (0, 0)
    finally:
        host.close()


def test_a_sample_of_many_first_rows_spreads_over_them_and_without_rows_takes_the_defaults():
    many = [Request(id=str(i), prompt="", prompt_ids=(1,) * (1 + i), params=SamplingParams(max_new_tokens=1 + i))
            for i in range(3 * SAMPLE_ROWS)]
    sample = requests_sample(many, SamplingParams())
    assert sample.prompt_lengths == tuple(range(1, 3 * SAMPLE_ROWS + 1, 3))
    assert requests_sample([Completion.failed("a", "bad")], SamplingParams(max_new_tokens=7, stop=("x",))) \
        .row_lengths == ((7, True),)


def test_rows_run_in_calls_of_one_block_then_many_each_once_and_in_place(tiny_llama_dir, spied_calls):
    block = 2
    items = _items(3 * block * BLOCKS_PER_CALL)
    settings = EngineSettings(dtype="float32", plan=False, pins={"gbs": block, "num_gb": 1})
    host = EngineHost()
    try:
        host.take(Path(tiny_llama_dir), load_model_spec(tiny_llama_dir), settings, None)
        done, calls = host.complete(items, truncate="error", label="test"), list(spied_calls)
        alone = host.engine.generate([item for item in items if isinstance(item, Request)], host.policy)
    finally:
        host.close()
    requests = [item.id for item in items if isinstance(item, Request)]
    assert [len(call) for call in calls] == [block, block * BLOCKS_PER_CALL, len(requests) - block * (1 + BLOCKS_PER_CALL)]
    assert [row for call in calls for row in call] == requests  # every request once, in row order
    assert [c.id for c in done.completions] == [item.id for item in items]
    assert all(c is item for c, item in zip(done.completions, items) if isinstance(item, Completion))
    by_id = {c.id: c for c in done.completions}
    assert [by_id[c.id].token_ids for c in alone] == [c.token_ids for c in alone]  # as one call computes them
    assert host.measured == (len(requests), sum(c.completion_tokens for c in alone)) and done.seconds > 0


BF16_LLAMA = spec_from_config(dict(model_type="llama", hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=256, torch_dtype="bfloat16"))


def test_without_planning_a_bf16_checkpoint_in_float32_keeps_bf16_weights_on_the_avx2_class(monkeypatch):
    """The rule the planner's search follows (engine/compression/bf16.py: kept_unasked), for an engine that does not
    plan; a pinned weight form, a bfloat16 run or another machine class keep the policy as given."""
    monkeypatch.setattr("engine.compression.bf16.kernel_class", lambda: "avx2")
    unplanned = unplanned_policy(EngineSettings(dtype="float32", plan=False), BF16_LLAMA)
    assert unplanned.compress_weight and unplanned.weight_format == "bf16"
    for pins in ({"compress_weight": False}, {"compress_weight": True}, {"weight_format": "int8"}):
        settings = EngineSettings(dtype="float32", plan=False, pins=pins)
        assert unplanned_policy(settings, BF16_LLAMA) == settings.policy
    assert not unplanned_policy(EngineSettings(dtype="bfloat16", plan=False), BF16_LLAMA).compress_weight
    monkeypatch.setattr("engine.compression.bf16.kernel_class", lambda: "amx")
    assert not unplanned_policy(EngineSettings(dtype="float32", plan=False), BF16_LLAMA).compress_weight


def test_a_planned_engine_runs_the_bf16_weights_the_planner_chose_and_a_pinned_format_otherwise():
    at_rest = Policy(compress_weight=True, weight_format="bf16")
    assert planned_policy(EngineSettings(dtype="float32"), at_rest) == at_rest
    pinned = EngineSettings(dtype="float32", pins={"compress_weight": True, "weight_format": "int8"})
    assert planned_policy(pinned, Policy(compress_weight=True)).weight_format == "int8"
