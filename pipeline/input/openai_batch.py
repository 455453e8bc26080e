"""OpenAI Batch input files (the JSONL of OpenAI's Batch API and of vLLM's `run_batch`): one request per line,
`{custom_id, method: "POST", url: "/v1/chat/completions" | "/v1/completions", body: {...}}`.

A line becomes `n` engine requests (one per choice, each with its own seed) or a line error; a bad line (not
UTF-8, not JSON, an unknown url or body field) never stops the job. Lines are read as bytes and decoded one by
one, so that bytes that are not UTF-8 fail their line alone (never replaced silently); a UTF-8 byte order mark
before the first line is skipped. A file in which two lines share a `custom_id` is refused before any model loads,
as OpenAI's Batch API refuses it: the output lines could not be told apart. Body fields that are absent take the
job's options (`--max-new-tokens`, `--temperature`, ...), not OpenAI's defaults.

A completions line with `echo: true` gets its prompt back before its text; with `logprobs: 0` too, the prompt's
tokens are scored (engine `prompt_logprobs`), and `max_tokens: 0` scores without generating (the engine is asked
for one token, which is dropped: pipeline/output/openai_batch.py), as OpenAI's legacy completions did."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.chat import messages_problem
from engine.errors import InvalidParamsError
from engine.guided_limits import MAX_NESTING, json_text_nesting
from engine.request import Completion, Request, SamplingParams
from pipeline.errors import InputError
from pipeline.input.parquet import SUFFIXES, InputFile, part_names
from pipeline.input.requests import derive_seed
from pipeline.input.response_format import BODY_FIELDS as GUIDED_FIELDS
from pipeline.input.response_format import body_guided
from pipeline.input.utf8 import BOM, NotUtf8, decode
from pipeline.storage import filesystem, is_uri

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
LINE_FIELDS = ("custom_id", "method", "url", "body")
_COMMON = ("model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "logprobs", "user", *GUIDED_FIELDS)
BODY_FIELDS = {CHAT_URL: ("messages", "max_completion_tokens", "top_logprobs", *_COMMON),
               COMPLETIONS_URL: ("prompt", "echo", *_COMMON)}
# accepted only at the value that changes nothing; any other value is refused rather than silently ignored
NEUTRAL_FIELDS = {"stream": False, "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "echo": False,
                  "best_of": 1, "suffix": None, "parallel_tool_calls": None, "tools": None, "tool_choice": None}
MAX_CHOICES = 128
PARQUET_MAGIC = b"PAR1"
LINE_NESTING = MAX_NESTING + 8  # a line's own levels (line, body, messages) around a constraint's
_SHOWN = 3  # repeated custom_ids named in the refusal


@dataclass
class BatchLine:
    """One input line: its `n` requests, or the error that replaces its response."""

    row: int  # the line's index among the file's non-blank lines
    key: str  # `<file stem>:<row>`: the id of its requests, unique in the job
    custom_id: str | None = None
    url: str | None = None
    model: str | None = None
    requests: list[Request] = field(default_factory=list)
    error: dict | None = None  # {"code", "message"}
    echo: bool = False  # completions' echo: the prompt comes back before the text (and its scores with logprobs)
    score_only: bool = False  # max_tokens 0 with echo: nothing generated (the engine's one token is dropped)

    def fail(self, code: str, message: str) -> BatchLine:
        self.requests, self.error = [], {"code": code, "message": message}
        return self


def batch_lines(location: str, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, str | NotUtf8]]:
    """(row, text) of the non-blank lines `start <= row < stop` of a local file or a URI; a line that is not
    UTF-8 comes as `NotUtf8`. Lines end at \\n, \\r or \\r\\n, as in text mode."""
    row = 0
    with _open_bytes(location) as f:
        for n, chunk in enumerate(f):
            for raw in (chunk.removeprefix(BOM) if n == 0 else chunk).splitlines():
                text = decode(raw)
                if isinstance(text, str) and not text.strip():
                    continue
                if stop is not None and row >= stop:
                    return
                if row >= start:
                    yield row, text
                row += 1


def _open_bytes(location: str):
    if is_uri(location):
        fs, path = filesystem(location)
        with fs.open_input_stream(path) as f:
            return io.BytesIO(f.read())
    try:
        return open(location, "rb")
    except OSError as e:
        raise InputError(f"{location}: cannot read the batch file ({e.strerror})") from e


def scan_batch_file(location: str) -> tuple[int, dict[str, list[int]], int]:
    """The file's number of requests (non-blank lines), the custom_ids used by more than one line (with those
    lines' rows), and how many lines are chat requests; read once by the driver, before any model loads."""
    rows_of: dict[str, list[int]] = {}
    rows, chat = 0, 0
    for row, text in batch_lines(location):
        if row == 0 and (text.raw if isinstance(text, NotUtf8) else text.encode()).startswith(PARQUET_MAGIC):
            raise InputError(f"{location} is a Parquet file, not an OpenAI Batch file; pass --format parquet (or "
                             "--format auto with a .parquet name)")
        rows += 1
        try:
            line = load_line(text) if isinstance(text, str) else None
        except ValueError:
            continue
        if not isinstance(line, dict):
            continue
        cid = line.get("custom_id")
        if isinstance(cid, str) and cid:
            rows_of.setdefault(cid, []).append(row)
        chat += line.get("url") == CHAT_URL
    return rows, {cid: at for cid, at in rows_of.items() if len(at) > 1}, chat


def inspect_batch_files(paths) -> list[InputFile]:
    """Each batch file scanned (requests, chat lines) with the output part it becomes; a file whose lines share
    a custom_id is refused, naming them."""
    files = []
    for path, name in zip(paths, part_names(paths, SUFFIXES["openai"])):
        rows, repeated, chat = scan_batch_file(str(path))
        if repeated:
            shown = "; ".join(f"{cid!r} (lines {', '.join(str(r + 1) for r in at[:_SHOWN])}"
                              f"{' and more' if len(at) > _SHOWN else ''})" for cid, at in list(repeated.items())[:_SHOWN])
            more = f"; and {len(repeated) - _SHOWN} more" if len(repeated) > _SHOWN else ""
            raise InputError(f"{path}: {len(repeated)} custom_ids appear on more than one line: {shown}{more}; "
                             "give each line its own custom_id (OpenAI's Batch API refuses such a file too)")
        files.append(InputFile(path=path, part_name=name, num_rows=rows, columns=(), format="openai",
                               chat_rows=chat))
    return files


def read_batch_shard(shard, file: InputFile, defaults: SamplingParams, chat: bool) -> list[BatchLine]:
    """The shard's lines parsed; a file that no longer has the scanned lines is an InputError."""
    lines = [parse_line(text, row, shard.part_stem, defaults, chat)
             for row, text in batch_lines(str(shard.path), shard.row_start, shard.row_stop)]
    if len(lines) != shard.num_rows:
        raise InputError(f"{shard.path}: expected {shard.num_rows} requests from line {shard.row_start + 1}, read "
                         f"{len(lines)}; was the file modified during the job?")
    return lines


def sample_batch_prompts(location, limit: int) -> list[tuple[int, object]]:
    """(line, prompt) of the first `limit` lines that have one (a string, token-id list or conversation), for the
    planner."""
    out: list = []
    for row, text in batch_lines(str(location), 0, limit):
        try:
            body = (load_line(text) if isinstance(text, str) else {}).get("body") or {}
            value = body.get("messages", body.get("prompt"))
        except (ValueError, AttributeError):
            continue
        if isinstance(value, (str, list)) and value:
            out.append((row, value))
    return out


class TooDeep(ValueError):
    """A line nesting past LINE_NESTING levels."""


def load_line(text: str):
    """A line's JSON; ValueError for a line nesting past LINE_NESTING levels, checked before parsing (Python's
    parser recurses per level and would raise RecursionError, which no line error catches)."""
    depth = json_text_nesting(text)
    if depth > LINE_NESTING:
        raise TooDeep(f"nests {depth} levels deep; the limit is {LINE_NESTING}: give a flatter request")
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep(f"nests too deeply for the JSON parser; the limit is {LINE_NESTING} levels") from None


def parse_line(text: str | NotUtf8, row: int, stem: str, defaults: SamplingParams, chat: bool) -> BatchLine:
    """One line as requests, or as a line error naming what is wrong and the fix. `chat=False` refuses chat
    lines (the job runs with --chat off)."""
    out = BatchLine(row=row, key=f"{stem}:{row}")
    if isinstance(text, NotUtf8):
        return out.fail("invalid_json", f"line {row + 1} is not UTF-8 ({text.reason}); save the batch file as "
                        "UTF-8 (JSON text is UTF-8)")
    try:
        line = load_line(text)
    except TooDeep as e:
        return out.fail("invalid_request", f"line {row + 1} {e}")
    except ValueError as e:
        return out.fail("invalid_json", f"line {row + 1} is not JSON ({e}); write one JSON object per line")
    if not isinstance(line, dict):
        return out.fail("invalid_request", f"line {row + 1} is a JSON {type(line).__name__}; expected an object")
    cid = line.get("custom_id")
    out.custom_id = cid if isinstance(cid, str) else None
    problem = _line_problem(line)
    if problem:
        return out.fail(*problem)
    out.url, body = line["url"], line["body"]
    out.model = body.get("model") if isinstance(body.get("model"), str) else None
    problem = _body_problem(body, out.url) or (None if chat or out.url != CHAT_URL else (
        "unsupported_value", "chat requests are turned off (--chat off); run with --chat auto"))
    if problem:
        return out.fail(*problem)
    try:
        params = body_params(body, out.url, defaults)
    except InvalidParamsError as e:
        return out.fail("invalid_value", str(e))
    out.echo, out.score_only = body.get("echo") is True, _score_only(body)
    n = body.get("n", 1)
    seeds = _choice_seeds(body.get("seed"), defaults.seed, out.custom_id, n)
    prompt = {"prompt": "", "messages": tuple(body["messages"])} if out.url == CHAT_URL else _prompt_fields(body["prompt"])
    out.requests = [Request(id=out.key, params=dataclasses.replace(params, seed=s), **prompt) for s in seeds]
    return out


def _line_problem(line: dict) -> tuple[str, str] | None:
    unknown = sorted(set(line) - set(LINE_FIELDS))
    if not isinstance(line.get("custom_id"), str) or not line["custom_id"]:
        return "invalid_request", f"custom_id is {line.get('custom_id')!r}; give each line a unique string custom_id"
    if unknown:
        return "unknown_field", f"unknown line fields {unknown}; a line holds {', '.join(LINE_FIELDS)}"
    if line.get("method") != "POST":
        return "invalid_request", f"method is {line.get('method')!r}; use \"POST\""
    if line.get("url") not in BODY_FIELDS:
        return "invalid_url", f"url {line.get('url')!r} is not supported; use {CHAT_URL} or {COMPLETIONS_URL}"
    if not isinstance(line.get("body"), dict):
        return "invalid_request", "body is missing or not an object; give the request's parameters in body"
    return None


def _body_problem(body: dict, url: str) -> tuple[str, str] | None:
    known = BODY_FIELDS[url]
    for name, value in body.items():
        if name in known:
            continue
        if name in NEUTRAL_FIELDS and (value == NEUTRAL_FIELDS[name] or value == {} and name == "logit_bias"):
            continue
        what = "is not supported" if name in NEUTRAL_FIELDS else "is unknown"
        return "unsupported_field", (f"body field {name!r} {what} here (value {value!r}); remove it (supported: "
                                     f"{', '.join(sorted(known))})")
    if url == CHAT_URL:
        problem = messages_problem(body.get("messages"))
        return ("invalid_value", problem) if problem else None
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None
    return "invalid_value", (f"prompt is {type(prompt).__name__ if prompt is not None else 'missing'}"
                             f"{' (empty)' if prompt in ('', []) else ''}; give one non-empty string or one list of "
                             "token ids (send several prompts as several lines)")


def body_params(body: dict, url: str, defaults: SamplingParams) -> SamplingParams:
    """The job's decoding options with this body's fields applied; raises InvalidParamsError for a bad value."""
    changes = {}
    limit = body.get("max_tokens")
    if url == CHAT_URL and body.get("max_completion_tokens") is not None:
        if limit is not None and limit != body["max_completion_tokens"]:
            raise InvalidParamsError(f"max_tokens={limit} and max_completion_tokens={body['max_completion_tokens']}"
                                     " disagree; give one of them")
        limit = body["max_completion_tokens"]
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise InvalidParamsError(f"echo={echo!r} is invalid: use true or false")
    if _score_only(body) and not echo:
        raise InvalidParamsError("max_tokens=0 asks for no new tokens (max_new_tokens=0), which only a scoring "
                                 "request does: add echo: true (and logprobs: 0 for the prompt's scores), or give "
                                 "max_tokens >= 1")
    if limit is not None:
        changes["max_new_tokens"] = 1 if _score_only(body) else limit
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            changes[name] = body[name]
    stop = body.get("stop")
    if stop is not None:
        changes["stop"] = (stop,) if isinstance(stop, str) else stop
        if not isinstance(changes["stop"], (list, tuple)) or len(changes["stop"]) > 4:
            raise InvalidParamsError(f"stop={stop!r} is invalid: give a string or a list of up to 4 strings")
    guided = body_guided(body)  # response_format and vLLM's guided_* fields; absent: the job's constraint
    if guided is not None:
        changes["guided"] = guided
    changes["logprobs"] = _wants_logprobs(body, url)
    if echo and changes["logprobs"]:  # the prompt's tokens are scored in its prefill
        changes["prompt_logprobs"] = True
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise InvalidParamsError(f"n={n!r} is invalid: give a number of choices from 1 to {MAX_CHOICES}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InvalidParamsError(f"seed={seed!r} is invalid: use a non-negative integer")
    return dataclasses.replace(defaults, **changes)


def _score_only(body: dict) -> bool:
    """`max_tokens: 0`: nothing is generated (with `echo`, the prompt is scored)."""
    limit = body.get("max_tokens")
    return limit == 0 and not isinstance(limit, bool)


def _wants_logprobs(body: dict, url: str) -> bool:
    """Chat: `logprobs: true`; completions: `logprobs: 0`. Alternatives per token (top_logprobs > 0, or
    completions' logprobs > 0) are not computed, so they are refused rather than returned empty."""
    value = body.get("logprobs")
    if url == CHAT_URL:
        top = body.get("top_logprobs")
        if top not in (None, 0):
            raise InvalidParamsError(f"top_logprobs={top!r} is not supported: flexbatch returns the chosen token's "
                                     "logprob only; use top_logprobs 0 or leave it out")
        if value is not None and not isinstance(value, bool):
            raise InvalidParamsError(f"logprobs={value!r} is invalid: use true or false")
        return bool(value)
    if value is None or value is False:
        return False
    if value != 0 or value is True:
        raise InvalidParamsError(f"logprobs={value!r} is not supported: flexbatch returns the chosen token's "
                                 "logprob only; use logprobs 0 or leave it out")
    return True


def _prompt_fields(prompt) -> dict:
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt": "", "prompt_ids": tuple(prompt)}


def _choice_seeds(seed: int | None, job_seed: int, custom_id: str, n: int) -> list[int]:
    """Choice 0 takes the body's seed as given; each other choice (and every choice of a line without a seed)
    a seed derived from it (or from the job seed and the custom_id), so choices differ and reruns repeat."""
    if seed is not None:
        return [seed] + [derive_seed(seed, f"choice {k}") for k in range(1, n)]
    return [derive_seed(job_seed, custom_id if k == 0 else f"{custom_id}\x00choice {k}") for k in range(n)]


def line_completions(lines: list[BatchLine]) -> list[Request | Completion]:
    """Every line's requests, flattened in order, a failed `Completion` standing in for an error line."""
    items: list[Request | Completion] = []
    for line in lines:
        items += line.requests or [Completion.failed(line.key, line.error["message"])]
    return items
