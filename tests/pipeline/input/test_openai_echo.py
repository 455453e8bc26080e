"""OpenAI Batch completions with `echo: true`: the prompt comes back before the text and, with `logprobs: 0`, its
tokens' log-probabilities (the first one null) equal transformers' log_softmax; `max_tokens: 0` scores without
generating; the lines validate against the Batch API's output schema."""

import json
from pathlib import Path

import jsonschema
import pytest

from engine.engine import Engine
from engine.request import Request, SamplingParams
from engine.tokenizer import load_tokenizer
from pipeline import RunConfig, run_job
from tests.engine.reference import hf_model
from tests.pipeline.input.test_scoring import hf_token_scores

SCHEMA = json.loads((Path(__file__).parent / "openai_batch_output.schema.json").read_text())
URL = "/v1/completions"
TEXT = "The quick brown fox"


def _line(cid, body):
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL, "body": body})


LINES = [
    _line("score", {"prompt": TEXT, "echo": True, "logprobs": 0, "max_tokens": 0}),
    _line("both", {"prompt": TEXT, "echo": True, "logprobs": 0, "max_tokens": 3}),
    _line("echo-only", {"prompt": TEXT, "echo": True, "max_tokens": 0}),
    _line("ids", {"prompt": [5, 6, 7, 8], "echo": True, "logprobs": 0, "max_tokens": 0, "n": 2}),
    _line("no-echo", {"prompt": TEXT, "max_tokens": 0}),
    _line("bad-echo", {"prompt": TEXT, "echo": "yes"}),
]


def test_echo_lines_answer_in_openais_shape(tmp_path, checkpoint):
    model = checkpoint("llama_gqa_llama3")
    (tmp_path / "requests.jsonl").write_text("\n".join(LINES) + "\n")
    summary = run_job(RunConfig(model=model, input=str(tmp_path / "requests.jsonl"), output=tmp_path / "out",
                                dtype="float32", use_ray=False, params=SamplingParams(max_new_tokens=8)))
    out = [json.loads(t) for t in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    for o in out:
        jsonschema.validate(o, SCHEMA)
    tok, ref = load_tokenizer(model), hf_model(model)
    ids = tok(TEXT)["input_ids"]
    lps, _ = hf_token_scores(ref, ids)

    score = out[0]["response"]["body"]
    choice = score["choices"][0]
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == [tok.decode([t]) for t in ids]
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(lps, abs=1e-4)
    assert choice["logprobs"]["text_offset"][:2] == [0, len(tok.decode([ids[0]]))]
    assert score["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}

    gen = Engine.load(model, dtype="float32").generate([Request("g", TEXT, SamplingParams(max_new_tokens=3,
                                                                                          logprobs=True))])[0]
    both = out[1]["response"]["body"]["choices"][0]
    assert both["text"] == TEXT + gen.text and both["logprobs"]["tokens"][len(ids):] == [
        tok.decode([t]) for t in gen.token_ids]
    assert both["logprobs"]["token_logprobs"][1:] == pytest.approx(lps + gen.logprobs, abs=1e-4)

    for c in (choice, both):  # every prompt token is where its offset says, in the text returned
        tokens, offsets = c["logprobs"]["tokens"][: len(ids)], c["logprobs"]["text_offset"][: len(ids)]
        assert [c["text"][o : o + len(t)] for t, o in zip(tokens, offsets)] == tokens

    echo_only = out[2]["response"]["body"]["choices"][0]
    assert echo_only["text"] == TEXT and echo_only["logprobs"] is None
    two = out[3]["response"]["body"]
    id_lps, _ = hf_token_scores(ref, [5, 6, 7, 8])
    assert [c["text"] for c in two["choices"]] == [tok.decode([5, 6, 7, 8])] * 2
    assert two["choices"][1]["logprobs"]["token_logprobs"][1:] == pytest.approx(id_lps, abs=1e-4)
    assert two["usage"]["completion_tokens"] == 0
    assert "max_tokens=0" in out[4]["error"]["message"] and "echo: true" in out[4]["error"]["message"]
    assert "echo='yes' is invalid" in out[5]["error"]["message"]
    assert summary.error_rows == 2 and summary.completion_tokens == 3


def test_echo_offsets_index_the_returned_text_when_the_tokenizer_adds_a_bos(tmp_path, demo_model_dir):
    """The BOS is the first token (scored as OpenAI's first token: null) but not part of the echoed text: it
    takes no characters, and every other token is found at its offset in `text`, as OpenAI's and vLLM's are."""
    lines = [_line("score", {"prompt": TEXT, "echo": True, "logprobs": 0, "max_tokens": 0}),
             _line("both", {"prompt": TEXT, "echo": True, "logprobs": 0, "max_tokens": 4})]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    run_job(RunConfig(model=demo_model_dir, input=str(tmp_path / "requests.jsonl"), output=tmp_path / "out",
                      dtype="float32", use_ray=False))
    tok = load_tokenizer(demo_model_dir)
    for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines():
        choice = json.loads(line)["response"]["body"]["choices"][0]
        lp, text = choice["logprobs"], choice["text"]
        assert lp["tokens"][0] == tok.decode([tok.bos_token_id]) and text.startswith(TEXT)
        assert lp["text_offset"][:2] == [0, 0] and lp["token_logprobs"][0] is None
        assert [text[o : o + len(t)] for t, o in zip(lp["tokens"][1:], lp["text_offset"][1:])] == lp["tokens"][1:]
        assert lp["text_offset"] == sorted(lp["text_offset"])
