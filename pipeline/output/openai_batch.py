"""OpenAI Batch output lines: `{id, custom_id, response: {status_code, request_id, body}, error}`, one per input
line and in input order, the body a `chat.completion` or `text_completion` object with one choice per `n`.

A line that could not run has `response: null` and `error: {code, message}`; ids are derived from the job's
config hash and the line, so a resumed job writes the same ids for the same lines.

A completions line with `echo: true` has its prompt before the text; with `logprobs` its `tokens` and
`token_logprobs` start with the prompt's tokens, the first one's log-probability `null` (it has no context), as
OpenAI's legacy completions wrote them; `text_offset` indexes the returned `text`, where a BOS the tokenizer added
is not written (it takes no characters). A `max_tokens: 0` line's choices hold no generated token."""

from __future__ import annotations

import hashlib
import json
import time

from engine.request import Completion
from pipeline.input.openai_batch import CHAT_URL, BatchLine
from pipeline.input.scoring import scored

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # OpenAI's names for the engine's finish reasons


def choices_by_line(lines: list[BatchLine], completions: list[Completion]) -> list[list[Completion]]:
    """`completions` (laid out as `line_completions` laid out the requests) cut back into each line's choices."""
    out, at = [], 0
    for line in lines:
        count = len(line.requests) or 1
        choices = completions[at : at + count]
        out.append([scored(c, 0) for c in choices] if line.score_only else choices)
        at += count
    if at != len(completions):
        raise RuntimeError(f"{len(completions)} completions for {at} choices of {len(lines)} lines")
    return out


def output_lines(lines: list[BatchLine], choices: list[list[Completion]], tokenizer, model: str,
                 job_hash: str) -> list[dict]:
    """One output object per input line, from each line's choices (one failed completion for a line error)."""
    created = int(time.time())
    return [output_line(line, c, tokenizer, line.model or model, job_hash, created) for line, c in zip(lines, choices)]


def output_line(line: BatchLine, choices: list[Completion], tokenizer, model: str, job_hash: str,
                created: int) -> dict:
    tag = hashlib.sha256(f"{job_hash}\x00{line.key}".encode()).hexdigest()[:24]
    failed = next((c for c in choices if c.finish_reason == "error"), None)
    if line.error is not None or failed is not None:
        error = line.error or {"code": "invalid_request", "message": failed.error}
        return {"id": f"batch_req_{tag}", "custom_id": line.custom_id, "response": None, "error": error}
    chat = line.url == CHAT_URL
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{tag}",
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [_choice(k, c, line, tokenizer) for k, c in enumerate(choices)],
        "usage": {"prompt_tokens": choices[0].prompt_tokens,
                  "completion_tokens": sum(c.completion_tokens for c in choices),
                  "total_tokens": choices[0].prompt_tokens + sum(c.completion_tokens for c in choices)},
    }
    return {"id": f"batch_req_{tag}", "custom_id": line.custom_id,
            "response": {"status_code": 200, "request_id": f"req_{tag}", "body": body}, "error": None}


def _choice(index: int, c: Completion, line: BatchLine, tokenizer) -> dict:
    finish = FINISH[c.finish_reason]
    if line.url == CHAT_URL:
        return {"index": index, "message": {"role": "assistant", "content": c.text, "refusal": None},
                "logprobs": _chat_logprobs(c, tokenizer), "finish_reason": finish}
    if line.echo:
        text, ids = _echoed(line, c, tokenizer)
        return {"index": index, "text": text + c.text, "logprobs": _echo_logprobs(c, ids, tokenizer, text + c.text),
                "finish_reason": finish}
    return {"index": index, "text": c.text, "logprobs": _completion_logprobs(c, tokenizer), "finish_reason": finish}


def _echoed(line: BatchLine, c: Completion, tokenizer) -> tuple[str, list[int]]:
    """The prompt as echoed and the ids the engine ran (its last `prompt_tokens`, after --truncate left): the
    prompt's own text where nothing was cut, else those ids decoded."""
    request = line.requests[0]
    ids = list(request.prompt_ids) if request.prompt_ids is not None else tokenizer(request.prompt)["input_ids"]
    kept = ids[len(ids) - c.prompt_tokens :]
    return (request.prompt if request.prompt and len(kept) == len(ids) else tokenizer.decode(kept)), kept


def _scored(c: Completion, tokenizer) -> list[tuple[str, float]]:
    """(token text, logprob) of the answer's tokens; an ending EOS is not part of the answer."""
    if c.logprobs is None:
        return []
    ids = c.token_ids[:-1] if c.finish_reason == "eos" else c.token_ids
    return [(tokenizer.decode([t]), float(lp)) for t, lp in zip(ids, c.logprobs)]


def _chat_logprobs(c: Completion, tokenizer) -> dict | None:
    if c.logprobs is None:
        return None
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in _scored(c, tokenizer)], "refusal": None}


def _completion_logprobs(c: Completion, tokenizer) -> dict | None:
    if c.logprobs is None:
        return None
    return _logprobs_object(_scored(c, tokenizer), c.text)


def _echo_logprobs(c: Completion, prompt_ids: list[int], tokenizer, text: str) -> dict | None:
    """The prompt's tokens (the first with a null log-probability) and then the generated ones; `text` is the
    choice's text (the prompt as echoed, then the answer)."""
    if c.prompt_logprobs is None:
        return None
    prompt = [tokenizer.decode([t]) for t in prompt_ids]
    lps = [None, *(float(lp) for lp in c.prompt_logprobs)]
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    hidden = {i for i, t in enumerate(prompt_ids) if t in special}
    return _logprobs_object(list(zip(prompt, lps)) + _scored(c, tokenizer), text, hidden)


def _logprobs_object(scored: list[tuple[str, float | None]], text: str, hidden: set[int] = frozenset()) -> dict:
    """OpenAI's logprobs object. `text_offset` is where each token starts in the choice's `text`, as OpenAI's and
    vLLM's offsets index the returned text; a special token that the text does not show (the BOS a tokenizer
    adds, which an echoed prompt does not hold) takes no characters, so the next token starts where it stands."""
    offsets, at = [], 0
    for i, (t, _) in enumerate(scored):
        offsets.append(min(at, len(text)))
        if i not in hidden or text.startswith(t, at):
            at += len(t)
    return {"tokens": [t for t, _ in scored], "token_logprobs": [lp for _, lp in scored], "top_logprobs": None,
            "text_offset": offsets}


def jsonl_bytes(objects: list[dict]) -> bytes:
    return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects).encode()
