"""Constrained decoding through xgrammar: each distinct constraint (engine/guided.py) is compiled once per engine
call, each constrained row gets its own matcher, and at every sampling step the rows' token bitmasks set the
logits of the tokens their grammar forbids to -inf before a token is chosen; the chosen token then advances the
row's matcher. The grammar allows the end-of-sequence tokens only where the answer may end, so a row ends with
EOS once its answer is complete (or at max_new_tokens, cut short, like any row).

The logits are on the CPU when tokens are chosen (engine/loop/schedule.py `_head`), whatever the policy, so the
mask is applied there (`blocked_tokens`). xgrammar is imported only when a call has a constrained row."""

from __future__ import annotations

import functools
import json
import re
import time

import numpy as np
import torch

from engine.guided import Guided
from engine.guided_limits import COMPILE_SECONDS, COMPILE_WAIT_FACTOR
from engine.loop.compile_jobs import CompileJobs
from engine.loop.schema_rules import regex_problem, schema_problem

# xgrammar's C++ errors start with a timestamp and a source location, and checks with their condition
_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


SETTLE_SECONDS = 1.0  # how long a call's other rows wait for its compiles before they run without them


class GuidedError(ValueError):
    """A constraint that cannot be enforced (the row's error message)."""


def xgrammar():
    """The xgrammar module, or the row's error naming how to install it (make's environment has it; a plain
    `pip install flexbatch` takes it with the `grammar` extra)."""
    try:
        import xgrammar as xgr
    except ImportError as e:
        raise GuidedError(f"constrained decoding needs xgrammar ({e}): pip install 'flexbatch[grammar]'") from None
    return xgr


@functools.lru_cache(maxsize=8)
def tokenizer_info(tokenizer, vocab_size: int, eos_ids: tuple[int, ...]):
    """xgrammar's view of the tokenizer (each token's bytes), built once per tokenizer; the grammar's stop
    tokens are the engine's end-of-sequence ids."""
    xgr = xgrammar()

    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_ids) or None)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar whose sentences are exactly `choices` (JSON string escapes are EBNF's too)."""
    if not choices:
        raise GuidedError("guided choice is an empty list: give at least one choice")
    empty = [c for c in choices if c == ""]
    if empty:
        raise GuidedError(f"guided choice {list(choices)!r} holds an empty string: every choice needs text")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class Grammars:
    """The compiled constraints of one engine call, by their text. Each distinct constraint compiles once, on a
    background thread within COMPILE_SECONDS (engine/loop/compile_jobs.py); one that does not compile, or not in
    time, is kept as its error, so every row that carries it fails with the same message."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: tuple[int, ...], seconds: float | None = None):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, tuple(eos_ids)
        self.seconds = COMPILE_SECONDS if seconds is None else seconds
        self._guided: dict[tuple[str, str], Guided] = {}
        self._jobs = CompileJobs(self._compile_key, self.seconds, _too_slow, COMPILE_WAIT_FACTOR)

    def start(self, constraints) -> None:
        """Start compiling each of these constraints in the background (those not started yet). The tokenizer's
        table is built here, once, before any compile thread reads it."""
        constraints = list(constraints)
        if constraints:
            try:
                tokenizer_info(self.tokenizer, self.vocab_size, self.eos_ids)
            except GuidedError:
                pass  # each compile raises it again: its rows fail naming it
        for guided in constraints:
            self._guided.setdefault(guided.key, guided)
            self._jobs.submit(guided.key)

    def ready(self, guided: Guided) -> bool:
        job = self._jobs.jobs.get(guided.key)
        return job is not None and job.done.is_set()

    def settle(self, seconds: float) -> None:
        """Wait up to `seconds` in all for the started compiles (most take milliseconds)."""
        give_up = time.monotonic() + seconds
        for job in list(self._jobs.jobs.values()):
            self._jobs.wait(job, max(0.0, give_up - time.monotonic()))

    def compiled(self, guided: Guided):
        """The constraint's xgrammar CompiledGrammar (compiled on first use, waiting at most its time limit), or
        GuidedError saying why it cannot be used."""
        self.start([guided])
        compiled = self._jobs.wait(self._jobs.jobs[guided.key])
        if isinstance(compiled, GuidedError):
            raise compiled
        return compiled

    def matcher(self, guided: Guided):
        """A fresh matcher for one row, or GuidedError."""
        compiled = self.compiled(guided)
        xgr = xgrammar()

        return xgr.GrammarMatcher(compiled, terminate_without_stop_token=not self.eos_ids)

    def _compile_key(self, key: tuple[str, str]):
        """Runs on a compile thread: the compiled grammar or the row's GuidedError, never an exception."""
        guided = self._guided[key]
        try:
            return self._compile(guided)
        except GuidedError as e:
            return e
        except Exception as e:  # whatever the compiler raises fails the constraint's rows, not the call
            return GuidedError(f"guided {guided.describe()} does not compile: {type(e).__name__}: {_clean(e)}; "
                               f"{_FIX[guided.kind]}")

    def _compile(self, guided: Guided):
        xgr = xgrammar()

        info = tokenizer_info(self.tokenizer, self.vocab_size, self.eos_ids)
        c = xgr.GrammarCompiler(info, max_threads=1)
        try:
            if guided.kind == "choice":
                compiled = c.compile_grammar(choice_grammar(guided.choice))
            elif guided.kind == "regex":
                problem = regex_problem(guided.regex)
                if problem:
                    raise GuidedError(f"guided {problem}")
                compiled = c.compile_regex(guided.regex)
            elif guided.kind == "json_schema":
                schema = _load_schema(guided.json_schema)
                problem = schema_problem(schema)
                if problem:
                    raise GuidedError(f"guided json_schema refused: {problem}")
                compiled = c.compile_json_schema(json.dumps(bounded_strings_as_patterns(schema)),
                                                 any_whitespace=False)
            elif guided.kind == "json_object":
                compiled = c.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
            else:
                compiled = c.compile_grammar(guided.grammar)
        except (RuntimeError, ValueError) as e:
            if isinstance(e, GuidedError):
                raise
            return GuidedError(f"guided {guided.describe()} does not compile: {_clean(e)}; {_FIX[guided.kind]}")
        return _check_start(compiled, guided, self.vocab_size)


def _too_slow(seconds: float) -> GuidedError:
    return GuidedError(f"the constraint did not compile within {seconds:g} s (the limit per constraint, in the "
                       f"compile's CPU time; {seconds * COMPILE_WAIT_FACTOR:g} s by the clock on a busy machine); give "
                       "a smaller one (fewer optional properties, alternatives or repetitions)")


_FIX = {
    "choice": "give a list of non-empty strings",
    "regex": "fix the regular expression",
    "json_schema": "give a valid JSON schema (draft 2020-12 keywords that xgrammar supports)",
    "json_object": "",
    "grammar": "fix the EBNF grammar (xgrammar's syntax, start rule root)",
}


def _load_schema(text: str):
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise GuidedError(f"guided json_schema {text[:80]!r} is not JSON ({e}): give a JSON schema object") from None
    if not isinstance(schema, (dict, bool)):
        raise GuidedError(f"guided json_schema {text[:80]!r} is not a schema: give a JSON object such as "
                          '{"type": "object", "properties": {...}}')
    return schema


# a string character that needs no escape: not a quote, a backslash or a control character. Not `.`: with a large
# count (`.{1,10000}`) xgrammar stops unrolling the repetition, and its `.` then lets raw newlines and quotes through
_PLAIN_CHAR = '[^"\\\\\\x00-\\x1f]'


def bounded_strings_as_patterns(schema):
    """The schema with each string that only bounds its length (minLength/maxLength, no pattern, format, enum or
    const) bounded by an equivalent `pattern` instead. xgrammar 0.2 compiles a length-bounded string to a
    character class that admits raw control characters, which is not JSON (mlc-ai/xgrammar#800); its pattern
    path follows JSON's string rules. The bounded string then holds no escapes (no quote, backslash, newline)."""
    if isinstance(schema, list):
        return [bounded_strings_as_patterns(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded_strings_as_patterns(v) for k, v in schema.items()}
    bounded = ("minLength" in out or "maxLength" in out) and not {"pattern", "format", "enum", "const"} & out.keys()
    if out.get("type") == "string" and bounded:
        low, high = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^{_PLAIN_CHAR}{{{low},{high}}}$"
    return out


def _clean(e: Exception) -> str:
    return _NOISE.sub("", str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def _check_start(compiled, guided: Guided, vocab_size: int):
    """The compiled grammar, or GuidedError when no token of the vocabulary can start an answer."""
    xgr = xgrammar()

    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(mask, 0)
    if not bool(mask.any()):
        return GuidedError(f"guided {guided.describe()}: no token of this model's vocabulary can start such an "
                           "answer; use text that the tokenizer can produce")
    return compiled


def mask_logits(logits: torch.Tensor, rows, keep: bool = True) -> torch.Tensor:
    """logits [B, V] -> the same logits where no row is constrained, else (a copy of them with `keep`, so that
    the original stays the model's for logprobs) with each live constrained row's forbidden tokens at -inf. A row
    whose grammar allows no token at all is failed here, before a token is drawn for it."""
    guided = [b for b, r in enumerate(rows) if r.matcher is not None and not r.done]
    if not guided:
        return logits
    xgr = xgrammar()

    B, V = logits.shape
    mask = xgr.allocate_token_bitmask(len(guided), V)  # [G, ceil(V / 32)] int32, bit j of word w: token 32w + j
    for i, b in enumerate(guided):
        rows[b].matcher.fill_next_token_bitmask(mask, i)
    alive = (mask != 0).any(-1).tolist()
    for b, ok in zip(guided, alive):
        if not ok:
            rows[b].fail("the constraint allows no next token here (the grammar cannot be completed with this "
                         "tokenizer)")
    out = logits.clone() if keep else logits
    blocked = blocked_tokens(mask, V)
    for i, b in enumerate(guided):
        out[b].masked_fill_(blocked[i], float("-inf"))  # in place, row by row: no gather and scatter of the rows
    return out


def blocked_tokens(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's bitmask [G, W] int32 (bit set: allowed) -> blocked [G, vocab_size] bool. numpy unpacks the
    inverted bits of every row at once (little-endian bytes, low bit first: token 32w + 8k + j is bit j of byte k
    of word w), about twice as fast as xgrammar's own CPU kernel at a 32k vocabulary (`flexbatch bench guided`)."""
    bits = np.unpackbits((~mask.numpy()).view(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size]).view(torch.bool)


def advance(row, token: int) -> None:
    """Feed the row's matcher the token just chosen for it; a token the grammar refuses (a forced token) fails
    the row, and a grammar that has ended ends the row."""
    if not row.matcher.accept_token(token):
        row.fail(f"token {token} breaks the row's constraint")
    elif row.matcher.is_terminated() and not row.done:
        row.finish = "stop"
