"""The input a job plans from is sampled once, by the driver, and a prompt is tokenized once: the workers plan
from the driver's sample without reading the input or tokenizing, and hand the engine the sampled rows' token
ids, with completions equal to the engine's own tokenization."""

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from pipeline import RunConfig, prepare_job, run_job
from pipeline.plan.planning import choose_policy, job_workload
from planner.hardware import save_hardware
from tests.pipeline.parquet_files import read_rows
from tests.planner.specs import server_cpu

PROMPTS = ["Q: What is 12 plus 30? A:", None, "def add(a, b):", "Product A: red kettle", "The quick brown",
           "Once upon a time", "A list of fruit:"]


@pytest.fixture
def spies(monkeypatch):
    """Counts of tokenizer calls by text, and of Parquet data reads by row group (footers are not counted)."""
    calls, reads = Counter(), Counter()
    tokenize, read_group, read_groups = (PreTrainedTokenizerBase.__call__, pq.ParquetFile.read_row_group,
                                         pq.ParquetFile.read_row_groups)

    def spy_tokenize(self, text=None, *args, **kwargs):
        calls[text if isinstance(text, str) else repr(text)] += 1
        return tokenize(self, text, *args, **kwargs)

    def spy_group(self, i, *args, **kwargs):
        reads[i] += 1
        return read_group(self, i, *args, **kwargs)

    def spy_groups(self, groups, *args, **kwargs):
        reads.update(groups)
        return read_groups(self, groups, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", spy_tokenize)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy_group)
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy_groups)
    return calls, reads


def _config(tmp_path, model, **kw):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": pa.array(PROMPTS, pa.string())}), tmp_path / "in" / "a.parquet",
                   row_group_size=4)  # two row groups, and two shards cutting at row 4
    return RunConfig(model=model, input=str(tmp_path / "in"), output=tmp_path / "out", dtype="float32",
                     use_ray=False, hardware=save_hardware(server_cpu(), tmp_path / "hw.json"), shard_rows=4,
                     params=SamplingParams(max_new_tokens=4, logprobs=True), pins={"gbs": 2, "num_gb": 1}, **kw)


def test_workers_plan_from_the_drivers_sample_without_reading_or_tokenizing(tmp_path, tiny_llama_dir, spies):
    calls, reads = spies
    config = _config(tmp_path, tiny_llama_dir)
    job = prepare_job(config)
    assert reads == {0: 1, 1: 1}  # the sample: each row group read once, the prompt column with the row options
    assert calls == {p: 1 for p in PROMPTS if p}
    assert len(job.sample.prompt_ids) == 6 and (str(job.files[0].path), 1) not in job.sample.prompt_ids
    calls.clear(), reads.clear()
    policies = {choose_policy(config, job_workload(job, rows), job.spec).policy for rows in (3, 4)}  # each its share
    assert not calls and not reads and all(p.gbs == 2 for p in policies)


@pytest.mark.parametrize("score", [False, True])
def test_a_scoring_job_plans_the_head_at_every_position_of_its_rows(tmp_path, tiny_llama_dir, score):
    job = prepare_job(_config(tmp_path, tiny_llama_dir, score=score))
    work = job_workload(job)
    assert work.scored_len == (work.prompt_len if score else 0) and work.prompt_len > 1


def test_a_planned_job_tokenizes_each_prompt_once_and_completes_as_the_engine_does(tmp_path, tiny_llama_dir, spies):
    calls, reads = spies
    summary = run_job(_config(tmp_path, tiny_llama_dir))
    assert summary.ok and summary.shards == 2 and summary.workers[0]["predicted"] is not None
    assert {p: calls[p] for p in PROMPTS if p} == {p: 1 for p in PROMPTS if p}  # sampled once, never again
    assert reads == {0: 2, 1: 2}  # the sample, then each group once by the shard that holds it

    rows = [r for part in sorted((tmp_path / "out").glob("a.rows-*.parquet")) for r in read_rows(part)]
    assert [r["finish_reason"] == "error" for r in rows] == [p is None for p in PROMPTS]
    engine = Engine.load(tiny_llama_dir, dtype="float32", policy=Policy.from_dict(summary.workers[0]["policy"]))
    own = engine.generate([Request(r["id"], p, SamplingParams(max_new_tokens=4)) for r, p in zip(rows, PROMPTS) if p])
    assert [r["token_ids"] for r in rows if r["finish_reason"] != "error"] == [list(c.token_ids) for c in own]


def test_a_planned_ray_data_stage_tokenizes_its_first_batch_once(tmp_path, demo_model_dir, spies):
    from flexbatch.ray import Processor

    calls, _ = spies
    prompts = ["Q: What is 2 plus 3? A:", "copy: abc ->", "The capital of France is"]
    hw = save_hardware(server_cpu(), tmp_path / "hw.json")
    planned = Processor(demo_model_dir, max_new_tokens=3, dtype="float32", hardware=hw)({"prompt": prompts})
    assert {p: calls[p] for p in prompts} == {p: 1 for p in prompts}  # planning measured them; the engine reused
    given = Processor(demo_model_dir, max_new_tokens=3, dtype="float32", policy=Policy())({"prompt": prompts})
    assert planned["error"] == given["error"] == [None] * 3
    assert planned["generated_tokens"] == given["generated_tokens"]
    assert planned["num_input_tokens"] == given["num_input_tokens"]


def test_a_planned_batch_file_tokenizes_each_sampled_line_once(tmp_path, tiny_llama_dir, spies):
    import json

    calls, _ = spies
    prompts = ["Q: What is 12 plus 30? A:", "def add(a, b):", "Product A: red kettle"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "b.jsonl").write_text("".join(json.dumps(
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": p, "max_tokens": 4, "temperature": 0, "n": 2 if i == 1 else 1}}) + "\n" for i, p in enumerate(prompts)))
    hw = save_hardware(server_cpu(), tmp_path / "hw.json")

    def run(name, **kw):
        config = RunConfig(model=tiny_llama_dir, input=str(tmp_path / "in" / "b.jsonl"), output=tmp_path / name,
                           dtype="float32", use_ray=False, hardware=hw, **kw)
        summary = run_job(config)
        return summary, [json.loads(t) for t in (tmp_path / name / "b.jsonl").read_text().splitlines()]

    planned, lines = run("planned", pins={"gbs": 2, "num_gb": 1})
    assert planned.workers[0]["predicted"] is not None
    assert {p: calls[p] for p in prompts} == {p: 1 for p in prompts}  # the line of two choices too
    calls.clear()
    _, alone = run("given", plan=False, pins={"gbs": 2, "num_gb": 1})
    assert {p: calls[p] for p in prompts} == {prompts[0]: 1, prompts[1]: 2, prompts[2]: 1}  # the engine's own
    texts = [[c["text"] for c in line["response"]["body"]["choices"]] for line in lines]
    assert texts == [[c["text"] for c in line["response"]["body"]["choices"]] for line in alone]
    assert [len(t) for t in texts] == [1, 2, 1]
