"""OpenAI Batch JSONL in and out: a file mixing chat, completion and bad lines round-trips with one output line per
input line in order, the output validates against the Batch API's schema, completions equal the engine's, and a
job resumes without losing or repeating a line."""

import json
from pathlib import Path

import jsonschema
import pytest

from engine.engine import Engine
from engine.request import Request, SamplingParams
from pipeline import RunConfig, prepare_job, run_job
from pipeline.errors import ConfigError
from pipeline.output.folder import MANIFEST_FILE

SCHEMA = json.loads((Path(__file__).parent / "openai_batch_output.schema.json").read_text())
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ASK = [{"role": "user", "content": "What is 12 plus 30?"}]


def _line(cid, url, body, method="POST"):
    return json.dumps({"custom_id": cid, "method": method, "url": url, "body": body})


LINES = [
    _line("chat-1", CHAT, {"model": "tiny", "messages": ASK, "max_tokens": 4}),
    _line("text-1", COMPLETIONS, {"prompt": "The quick brown fox", "max_tokens": 5, "logprobs": 0}),
    "{not json",
    _line("ids-1", COMPLETIONS, {"prompt": [5, 6, 7, 8], "max_tokens": 3}),
    _line("bad-url", "/v1/embeddings", {"input": "x"}),
    _line("ids-2", COMPLETIONS, {"prompt": [5, 6, 10**8]}),  # a token id outside the vocabulary
    "",
    _line("n-2", CHAT, {"messages": ASK, "n": 2, "temperature": 1.0, "seed": 7, "max_completion_tokens": 6}),
    _line("unknown", CHAT, {"messages": ASK, "tools": [{"type": "function"}]}),
    _line("top-k", CHAT, {"messages": ASK, "logprobs": True, "top_logprobs": 3}),
    _line("get", COMPLETIONS, {"prompt": "x"}, method="GET"),
    _line("chat-lp", CHAT, {"messages": ASK, "logprobs": True, "stop": ["\n"], "frequency_penalty": 0}),
]
ERRORS = {2: "invalid_json", 4: "invalid_url", 5: "invalid_request", 7: "unsupported_field",
          8: "invalid_value", 9: "invalid_request"}  # by request index (the blank line is not one)


def _config(tmp_path, model, **kw):
    return RunConfig(model=model, input=str(tmp_path / "requests.jsonl"), output=tmp_path / "out", dtype="float32",
                     use_ray=False, params=SamplingParams(max_new_tokens=8), **kw)


def _output(tmp_path) -> list[dict]:
    success = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    return [json.loads(t) for part in success["parts"] for t in (tmp_path / "out" / part).read_text().splitlines()]


@pytest.fixture
def batch(tmp_path, chat_checkpoint):
    (tmp_path / "requests.jsonl").write_text("\n".join(LINES) + "\n")
    return chat_checkpoint("llama3")


def test_mixed_batch_file_round_trips_every_line_once_in_order(tmp_path, batch):
    summary = run_job(_config(tmp_path, batch, shard_rows=4))
    out = _output(tmp_path)
    requests = [t for t in LINES if t]
    assert len(out) == len(requests) == summary.rows and summary.shards == 3
    assert [o["custom_id"] for o in out] == [json.loads(t)["custom_id"] if t[0] == "{" and t[1] == '"' else None
                                             for t in requests]
    assert len({o["id"] for o in out}) == len(out)
    for n, o in enumerate(out):
        jsonschema.validate(o, SCHEMA)
        if n in ERRORS:
            assert o["response"] is None and o["error"]["code"] == ERRORS[n] and o["error"]["message"], n
        else:
            assert o["error"] is None and o["response"]["status_code"] == 200, (n, o["error"])
    assert summary.error_rows == len(ERRORS)
    assert "tools" in out[7]["error"]["message"] and "top_logprobs=3" in out[8]["error"]["message"]
    assert "prompt_ids[2] is 100000000, outside the model's vocabulary" in out[5]["error"]["message"]


def test_batch_completions_equal_the_engine(tmp_path, batch):
    run_job(_config(tmp_path, batch, shard_rows=5))
    out = _output(tmp_path)
    engine = Engine.load(batch, dtype="float32")
    p = SamplingParams(max_new_tokens=8)
    chat, text, ids = engine.generate([
        Request("a", "", SamplingParams(max_new_tokens=4), messages=tuple(ASK)),
        Request("b", "The quick brown fox", SamplingParams(max_new_tokens=5, logprobs=True)),
        Request("c", "", SamplingParams(max_new_tokens=3), prompt_ids=(5, 6, 7, 8)),
    ])
    body = out[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"][0]["message"]["content"] == chat.text
    assert body["usage"] == {"prompt_tokens": chat.prompt_tokens, "completion_tokens": chat.completion_tokens,
                             "total_tokens": chat.prompt_tokens + chat.completion_tokens}
    body = out[1]["response"]["body"]
    assert body["object"] == "text_completion" and body["model"] == Path(batch).name
    assert body["choices"][0]["text"] == text.text and body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(text.logprobs)
    assert out[3]["response"]["body"]["choices"][0]["text"] == ids.text
    two = out[6]["response"]["body"]
    assert [c["index"] for c in two["choices"]] == [0, 1] and two["usage"]["completion_tokens"] == 12
    assert two["choices"][0]["message"]["content"] != two["choices"][1]["message"]["content"]
    lp = out[10]["response"]["body"]["choices"][0]
    assert len(lp["logprobs"]["content"]) >= 1 and all(t["logprob"] <= 0 for t in lp["logprobs"]["content"])
    assert engine.generate([Request("d", "", p, messages=tuple(ASK))])[0].text.split("\n")[0] == \
        lp["message"]["content"]


def test_a_resumed_batch_job_redoes_only_uncommitted_parts(tmp_path, batch):
    config = _config(tmp_path, batch, shard_rows=4)
    run_job(config)
    first = _output(tmp_path)
    manifest = tmp_path / "out" / MANIFEST_FILE
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(lines[:-1]) + "\n")  # the driver died before recording the last part
    (tmp_path / "out" / "_SUCCESS").unlink()
    summary = run_job(config)
    assert summary.skipped_shards == 2 and summary.rows == len(first)
    again = _output(tmp_path)
    for a, b in zip(first, again):
        if a["response"]:
            a["response"]["body"].pop("created"), b["response"]["body"].pop("created")
    assert again == first


def test_chat_lines_need_a_chat_template_before_any_load(tmp_path, tiny_llama_dir, no_model_load):
    (tmp_path / "requests.jsonl").write_text(_line("a", CHAT, {"messages": ASK}) + "\n")
    with pytest.raises(ConfigError, match="no chat template"):
        prepare_job(_config(tmp_path, tiny_llama_dir))
    job = prepare_job(_config(tmp_path, tiny_llama_dir, chat="off"))  # chat lines then fail one by one
    assert job.format == "openai" and not job.chat and job.files[0].part_name == "requests.jsonl"


@pytest.mark.parametrize(("body", "problem"), [
    ({"prompt": "x", "stream": True}, "'stream' is not supported"),
    ({"prompt": "x", "logprobs": 2}, "logprobs=2 is not supported"),
    ({"prompt": "x", "max_tokens": 0}, "max_new_tokens=0"),
    ({"prompt": "x", "n": True}, "n=True"),
    ({"prompt": ["a", "b"]}, "one non-empty string"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "up to 4"),
    ({"prompt": "x", "seed": -3}, "seed=-3"),
    ({"prompt": "x", "frequency_penalty": 0.5}, "'frequency_penalty' is not supported"),
])
def test_bad_completion_bodies_name_the_field(body, problem):
    from pipeline.input.openai_batch import parse_line

    line = parse_line(_line("c", COMPLETIONS, body), 0, "f", SamplingParams(), chat=True)
    assert line.error is not None and problem in line.error["message"] and not line.requests


def test_neutral_fields_are_accepted_and_choices_get_their_own_seeds():
    from pipeline.input.openai_batch import parse_line

    body = {"messages": ASK, "n": 3, "seed": 11, "logit_bias": {}, "stream": False, "presence_penalty": 0,
            "max_completion_tokens": 5, "max_tokens": 5, "logprobs": False, "top_logprobs": 0, "user": "u"}
    line = parse_line(_line("c", CHAT, body), 4, "f", SamplingParams(), chat=True)
    assert line.error is None and [r.id for r in line.requests] == ["f:4"] * 3
    seeds = [r.params.seed for r in line.requests]
    assert seeds[0] == 11 and len(set(seeds)) == 3 and all(r.params.max_new_tokens == 5 for r in line.requests)
    off = parse_line(_line("c", CHAT, {"messages": ASK}), 0, "f", SamplingParams(), chat=False)
    assert "--chat off" in off.error["message"]


def test_batch_files_on_a_filesystem_uri(tmp_path, batch):
    (tmp_path / "small.jsonl").write_text("\n".join(LINES[:4]) + "\n")
    config = RunConfig(model=batch, input=f"file://{tmp_path}/small.jsonl", output=f"file://{tmp_path}/uri-out",
                       dtype="float32", use_ray=False, params=SamplingParams(max_new_tokens=3))
    summary = run_job(config)
    out = [json.loads(t) for t in (tmp_path / "uri-out" / "small.jsonl").read_text().splitlines()]
    assert summary.rows == 4 and [o["custom_id"] for o in out] == ["chat-1", "text-1", None, "ids-1"]
    assert [o["error"] is None for o in out] == [True, True, False, True]
