"""`flexbatch.run` and the Ray Data stage: the same completions as a `flexbatch run` job."""

from dataclasses import replace

import pyarrow.parquet as pq
import pytest

import flexbatch
from engine.errors import InvalidParamsError
from engine.policy import Policy
from flexbatch.ray import Processor, build_processor
from pipeline.errors import ConfigError
from tests.pipeline.parquet_files import write_parquet


def test_run_takes_job_and_decoding_options_and_names_unknown_ones(tmp_path, demo_model_dir, no_model_load):
    config = flexbatch.run_config(demo_model_dir, "in.parquet", tmp_path / "out", max_new_tokens=5, stop=["\n"],
                                  chat="off", use_ray=False)
    assert config.params.max_new_tokens == 5 and config.params.stop == ("\n",) and config.chat == "off"
    with pytest.raises(ConfigError, match=r"unknown options \['max_tokens'\]"):
        flexbatch.run(demo_model_dir, "in.parquet", tmp_path / "out", max_tokens=5)
    with pytest.raises(InvalidParamsError, match="temperature"):
        flexbatch.run(demo_model_dir, "in.parquet", tmp_path / "out", temperature=-1)


def test_processor_rows_follow_ray_data_llm_columns(tmp_path, chat_checkpoint, demo_model_dir):
    stage = Processor(demo_model_dir, max_new_tokens=4, dtype="float32", policy=Policy(gbs=4, num_gb=1))
    out = stage({"prompt": ["Q: What is 2 plus 3? A:", None, "copy: abc ->"],
                 "sampling_params": [{"max_tokens": 2}, None, {"max_tokens": 3, "frequency_penalty": 0.5}]})
    assert out["prompt"][0] == "Q: What is 2 plus 3? A:" and out["num_generated_tokens"][0] == 2
    assert out["error"][0] is None and out["generated_tokens"][0] and out["num_input_tokens"][0] > 0
    assert "null" in out["error"][1] and "frequency_penalty" in out["error"][2]
    chat = Processor(chat_checkpoint("qwen2"), max_new_tokens=3, dtype="float32", policy=Policy())
    out = chat({"messages": [[{"role": "user", "content": "hi"}], []], "id": [7, 8]})
    assert out["error"][0] is None and out["num_generated_tokens"][0] == 3 and "empty list" in out["error"][1]
    kwargs = build_processor(demo_model_dir, concurrency=2, batch_size=8, max_new_tokens=3)
    assert kwargs["compute"].min_size == kwargs["compute"].max_size == 2
    assert {k: v for k, v in kwargs.items() if k != "compute"} == {
        "fn": Processor, "fn_constructor_kwargs": {"model": demo_model_dir, "max_new_tokens": 3, "engines_per_node": 2},
        "batch_size": 8}


def test_a_processor_loads_within_its_share_of_the_nodes_memory(demo_model_dir, monkeypatch):
    """Planned or not, a stage's engine keeps to plan_budgets: its share of the room among `engines_per_node`."""
    import engine.memory.room
    from pipeline.plan.planning import CPU_BUDGET_SHARE

    room = engine.memory.room.MemoryRoom(8 * 2**30, None, None, None, None)
    monkeypatch.setattr(engine.memory.room, "memory_room", lambda: room)
    stage = Processor(demo_model_dir, max_new_tokens=2, dtype="float32", policy=Policy(gbs=2, num_gb=1),
                      engines_per_node=2)
    assert stage({"prompt": ["copy: abc ->"]})["error"] == [None]
    assert stage.engine.devices.tiers["cpu"].budget == pytest.approx(CPU_BUDGET_SHARE * 8 * 2**30 / 2)
    with pytest.raises(ConfigError, match="engines_per_node=0 is invalid"):
        Processor(demo_model_dir, engines_per_node=0)


def test_a_planned_processor_plans_from_each_rows_own_lengths_and_measures_them(tmp_path, demo_model_dir):
    """A planned stage's workload comes from its first batch as a job's comes from its sample: each row's own
    max_new_tokens and stop strings (not only the largest max_new_tokens); then what its rows generate is counted,
    and refill is chosen again from it, as the planner prices it."""
    from planner.hardware import save_hardware
    from planner.search import with_refill_choice
    from tests.planner.specs import server_cpu

    hw = save_hardware(server_cpu(), tmp_path / "hw.json")
    stage = Processor(demo_model_dir, max_new_tokens=8, dtype="float32", hardware=hw)
    out = stage({"prompt": ["Q: What is 2 plus 3? A:", "copy: abc ->", "The capital of France is"],
                 "sampling_params": [{"max_tokens": 16, "stop": ["\n"]}, None, {"max_tokens": 4}]})
    assert out["error"] == [None] * 3
    work = stage.host.prediction.workload
    assert (work.gen_len, work.expected_gen_len) == (16, pytest.approx((16 * 0.5 + 8 + 4) / 3))
    assert stage.host.measured == (3, sum(out["num_generated_tokens"]))
    measured = replace(work, expected_gen_len=min(work.block_gen_len, max(1.0, stage.host.measured[1] / 3)))
    want = with_refill_choice(stage.engine.spec, server_cpu(), measured, stage.host.policy, {}).policy.refill
    assert stage.host.policy.refill == want


@pytest.mark.slow
def test_ray_data_pipeline_equals_flexbatch_run(tmp_path, demo_model_dir, demo_prompts, ray_address):
    """read_parquet -> map_batches(Processor) -> take_all gives what `flexbatch.run` writes (fp32, greedy)."""
    import ray

    from pipeline.execution.ray_runtime import connect

    prompts = demo_prompts[:12]
    write_parquet(tmp_path / "in" / "p.parquet", prompt=prompts, id=list(range(len(prompts))))
    summary = flexbatch.run(demo_model_dir, str(tmp_path / "in"), tmp_path / "out", max_new_tokens=8,
                            dtype="float32", use_ray=False)
    expected = {r["id"]: r["completion"] for r in pq.read_table(summary.parts[0]).to_pylist()}
    connect(ray_address)  # the suite's shared cluster; left by `ray_address`
    ds = ray.data.read_parquet(str(tmp_path / "in"))
    rows = ds.map_batches(**build_processor(demo_model_dir, concurrency=1, batch_size=6, max_new_tokens=8,
                                            dtype="float32")).take_all()
    assert len(rows) == len(prompts) and all(r["error"] is None for r in rows)
    assert {str(r["id"]): r["generated_text"] for r in rows} == expected
