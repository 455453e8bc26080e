"""Scoring jobs (`score=True`, `flexbatch run --score`): prompt and continuation log-probabilities equal
transformers' log_softmax over the joined token ids (prompt ids + continuation ids, tokenized apart), scored rows
carry no completion text, bad continuations fail their row alone, and a scoring job's inputs are checked first."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import flexbatch
from engine.policy import Policy
from engine.tokenizer import load_tokenizer
from pipeline.errors import ConfigError, InputError
from pipeline.job import _job_config, prepare_job
from tests.engine.reference import hf_model
from tests.pipeline.parquet_files import write_parquet

VARIANT = "llama_gqa_llama3"
PROMPTS = ["Q: What is 12 plus 30? A:", "The quick brown fox", "Pack my box with", "x", "copy: abc ->", "y"]
CONTS = [" 42", " jumps over the lazy dog", None, " z", "", " abc"]


def hf_token_scores(model, ids: list[int]) -> tuple[list[float], list[bool]]:
    """log p(token_i | tokens_<i) and whether token_i was the argmax, for i = 1..n-1."""
    t = torch.tensor([ids])
    with torch.no_grad():
        logits = model(t).logits[0, :-1].float()
    lp = logits.log_softmax(-1).gather(-1, t[0, 1:].view(-1, 1)).view(-1)
    return lp.tolist(), (logits.argmax(-1) == t[0, 1:]).tolist()


def test_a_scoring_job_writes_the_scores_of_prompt_and_continuation(tmp_path, checkpoint):
    model = checkpoint(VARIANT)
    path = write_parquet(tmp_path / "in.parquet", prompt=PROMPTS, continuation=pa.array(CONTS, pa.string()),
                         max_new_tokens=[5, None, 9, None, None, None])
    summary = flexbatch.run(model, str(path), tmp_path / "out", score=True, max_new_tokens=20, dtype="float32",
                            use_ray=False, plan=False, pins=Policy(gbs=2, num_gb=2).to_dict())
    out = pq.read_table(summary.parts[0]).to_pylist()
    tok, ref = load_tokenizer(model), hf_model(model)
    for row, prompt, cont in zip(out, PROMPTS, CONTS):
        if cont == "":
            assert row["finish_reason"] == "error" and "'continuation' is empty" in row["error"]
            assert row["prompt_logprobs"] is None and row["continuation_logprob"] is None
            continue
        p_ids = tok(prompt)["input_ids"]
        c_ids = tok(cont, add_special_tokens=False)["input_ids"] if cont else []
        lps, greedy = hf_token_scores(ref, p_ids + c_ids)
        assert row["error"] is None and row["finish_reason"] == "length"
        assert row["completion"] == "" and row["completion_tokens"] == 0  # the engine's one token is dropped
        assert row["prompt_tokens"] == len(p_ids) + len(c_ids)
        assert row["prompt_logprobs"] == pytest.approx(lps, abs=1e-4)
        if cont is None:
            assert row["continuation_logprob"] is None and row["continuation_is_greedy"] is None
        else:
            assert row["continuation_logprob"] == pytest.approx(sum(lps[-len(c_ids):]), abs=1e-4 * len(c_ids))
            assert row["continuation_is_greedy"] == all(greedy[-len(c_ids):])
    assert summary.error_rows == 1 and summary.completion_tokens == 0
    schema = pq.read_schema(summary.parts[0])
    assert schema.field("prompt_logprobs").type == pa.list_(pa.float32())
    assert schema.field("continuation_logprob").type == pa.float64()
    assert schema.field("continuation_is_greedy").type == pa.bool_()


def test_a_scoring_job_refuses_a_continuation_that_is_not_text_and_a_batch_file(tmp_path, checkpoint, no_model_load):
    model = checkpoint(VARIANT)
    path = write_parquet(tmp_path / "in.parquet", prompt=["a"], continuation=[3])
    with pytest.raises(InputError, match=r"column 'continuation' holds int64, not strings; cast it to string"):
        flexbatch.run(model, str(path), tmp_path / "out", score=True, use_ray=False)
    flexbatch.run_config(model, str(path), tmp_path / "out", use_ray=False)  # not scoring: an ordinary column
    (tmp_path / "b.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="--score reads Parquet rows.*echo: true"):
        flexbatch.run(model, str(tmp_path / "b.jsonl"), tmp_path / "out", score=True, use_ray=False)
    with pytest.raises(ConfigError, match="score='yes' is invalid"):
        flexbatch.run_config(model, str(path), tmp_path / "out", score="yes")


def test_scoring_asks_one_token_and_keeps_generation_hashes(tmp_path, checkpoint):
    model = checkpoint(VARIANT)
    path = write_parquet(tmp_path / "in.parquet", prompt=["a"])
    plain = flexbatch.run_config(model, str(path), tmp_path / "out", use_ray=False, plan=False)
    scoring = flexbatch.run_config(model, str(path), tmp_path / "out", use_ray=False, plan=False, score=True)
    assert scoring.params.max_new_tokens == 1 and scoring.params.prompt_logprobs
    record = _job_config(plain, prepare_job(plain).files, chat=False)
    assert "prompt_logprobs" not in record["params"] and "score" not in record  # older jobs' hashes hold
    assert _job_config(scoring, prepare_job(scoring).files, chat=False)["score"] is True


@pytest.mark.parametrize("policy", [None, Policy(gbs=4, num_gb=1)], ids=["planned", "given"])
def test_the_ray_data_stage_scores_rows_as_a_job_does(checkpoint, policy):
    from flexbatch.ray import Processor

    model = checkpoint(VARIANT)
    stage = Processor(model, dtype="float32", policy=policy, score=True)
    out = stage({"prompt": PROMPTS[:3], "continuation": CONTS[:3], "sampling_params": [{"max_tokens": 9}, None, None]})
    tok, ref = load_tokenizer(model), hf_model(model)
    for i in range(3):
        c_ids = tok(CONTS[i], add_special_tokens=False)["input_ids"] if CONTS[i] else []
        lps, greedy = hf_token_scores(ref, tok(PROMPTS[i])["input_ids"] + c_ids)
        assert out["error"][i] is None and out["generated_text"][i] == "" and out["num_generated_tokens"][i] == 0
        assert out["prompt_logprobs"][i] == pytest.approx(lps, abs=1e-4)
        expected = sum(lps[-len(c_ids):]) if c_ids else None
        assert out["continuation_logprob"][i] == (pytest.approx(expected, abs=1e-3) if c_ids else None)
        assert out["continuation_is_greedy"][i] == (all(greedy[-len(c_ids):]) if c_ids else None)
    with pytest.raises(ConfigError, match="score='on' is invalid"):
        Processor(model, score="on")


def test_the_command_scores_with_score_and_says_so_in_its_help(tmp_path, checkpoint):
    from click.testing import CliRunner

    from jobs import cli

    model = checkpoint(VARIANT)
    path = write_parquet(tmp_path / "in.parquet", prompt=PROMPTS[:2], continuation=CONTS[:2])
    result = CliRunner().invoke(cli.main, ["run", "--model", str(model), "--input", str(path), "--output",
                                           str(tmp_path / "out"), "--score", "--no-ray", "--no-plan",
                                           "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    out = pq.read_table(tmp_path / "out" / "in.parquet").to_pylist()
    assert [r["completion"] for r in out] == ["", ""] and all(r["continuation_logprob"] < 0 for r in out)
    text = " ".join(CliRunner().invoke(cli.main, ["run", "--help"]).output.split())
    assert "--score" in text and "continuation_logprob" in text and "python -m flexbatch.lm_eval" in text


def test_a_constraint_a_scoring_job_never_applies_fails_no_row(tmp_path, checkpoint):
    """A guided column (even a bad one) is not read by a scoring job; a job-wide constraint is refused at once."""
    from click.testing import CliRunner

    from jobs import cli

    model = checkpoint(VARIANT)
    guided = ['{"regex": "(a"}', "{not json", '{"choice": ["a"]}']
    path = write_parquet(tmp_path / "in.parquet", prompt=PROMPTS[:3], continuation=CONTS[:3], guided=guided)
    summary = flexbatch.run(model, str(path), tmp_path / "out", score=True, dtype="float32", use_ray=False,
                            plan=False)
    out = pq.read_table(summary.parts[0]).to_pylist()
    assert summary.error_rows == 0 and all(r["prompt_logprobs"] for r in out), [r["error"] for r in out]
    result = CliRunner().invoke(cli.main, ["run", "--model", str(model), "--input", str(path), "--output",
                                           str(tmp_path / "out2"), "--score", "--regex", "(a", "--no-ray"])
    assert result.exit_code == 2 and "--score scores the rows' own tokens" in result.output, result.output
    assert "drop --choice, --regex or --json-schema" in result.output


def test_a_scored_row_past_the_context_is_told_to_shorten_not_to_generate_less(tmp_path, checkpoint):
    model = checkpoint(VARIANT)  # a context of 256 tokens
    path = write_parquet(tmp_path / "in.parquet", prompt=["x " * 400, PROMPTS[1]], continuation=[" y", " jumps"])
    summary = flexbatch.run(model, str(path), tmp_path / "out", score=True, dtype="float32", use_ray=False, plan=False)
    long, fine = pq.read_table(summary.parts[0]).to_pylist()
    assert fine["error"] is None and long["finish_reason"] == "error"
    assert "the row to score has" in long["error"] and "shorten its prompt or continuation" in long["error"]
    assert "max_new_tokens" not in long["error"]
