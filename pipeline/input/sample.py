"""The sample a job plans from: the first rows of its input, read once by the driver (the prompt column and the
rows' own max_new_tokens and stop columns, in one pass) and each prompt tokenized once. The planner takes its
prompt and generation lengths from it (pipeline/plan/planning.py); the sampled rows' token ids (a Parquet row's, a
batch file line's) travel with the job, so the worker whose shard holds such a row hands the engine its ids
instead of tokenizing it again. An engine that plans on the first rows it is handed (the Ray Data stage's first
batch, lm-eval's first requests: `pipeline.plan.host.EngineHost.take_first`) samples them the same way
(`requests_sample`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.prompt_ids import PromptError, request_prompt_ids
from engine.prompt_ids import prompt_ids as rule_prompt_ids
from engine.request import Request, SamplingParams
from pipeline.input.parquet import InputFile
from pipeline.input.utf8 import NotUtf8, column_values
from pipeline.storage import open_parquet

SAMPLE_ROWS = 256
PARAM_COLUMNS = ("max_new_tokens", "stop")  # the row columns that set how long a row may generate


@dataclass(frozen=True)
class InputSample:
    """Token counts of up to SAMPLE_ROWS usable prompts (0: a conversation the chat template cannot render),
    (max_new_tokens, whether a stop string may end it) of up to SAMPLE_ROWS rows, and the token ids of the
    sampled prompts by (file, row: a Parquet row or a batch file's line)."""

    prompt_lengths: tuple[int, ...]
    row_lengths: tuple[tuple[int, bool], ...]
    prompt_ids: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self):
        if not self.row_lengths:
            raise ValueError("an InputSample needs at least one row length (the job's max_new_tokens and stop)")

    def with_line_ids(self, lines: list, shard) -> None:
        """The same for a shard of a batch file: each sampled line's requests (its `n` choices) carry its ids."""
        for line in lines:
            ids = self.prompt_ids.get((shard.path, line.row))
            if ids:
                line.requests = [dataclasses.replace(r, prompt_ids=ids) for r in line.requests]

    def with_ids(self, items: list, shard) -> list:
        """`items` (a shard's requests and failed rows, in row order) with each sampled row's request carrying
        the token ids measured for it, so the engine does not tokenize that prompt again."""
        out = list(items)
        for (path, row), ids in self.prompt_ids.items():
            i = row - shard.row_start
            if path == shard.path and 0 <= i < len(out) and isinstance(out[i], Request):
                out[i] = dataclasses.replace(out[i], prompt_ids=ids)
        return out


def take_sample(files: tuple[InputFile, ...], column: str, tokenizer, gen_len: int, stop: tuple[str, ...],
                limit: int = SAMPLE_ROWS, vocab_size: int | None = None) -> InputSample:
    """The first `limit` usable prompts of `column` (strings, or conversations from a messages column) and the
    first `limit` rows' generation lengths, each row's own max_new_tokens and stop where present and valid, else
    the job's `gen_len` and `stop`. A batch file gives its prompts only (its rows are measured as they finish).
    A prompt that fails the prompt-ids rule counts 0 tokens and carries no ids (its row fails in its shard)."""
    prompts: list[tuple[tuple[str, int], object]] = []
    rows: list[tuple[int, bool]] = []
    for f in files:
        if f.format == "openai":
            from pipeline.input.openai_batch import sample_batch_prompts

            prompts += [((str(f.path), row), p) for row, p in sample_batch_prompts(f.path, limit - len(prompts))]
        else:
            _sample_parquet(f, column, gen_len, stop, limit, prompts, rows)
        if len(prompts) >= limit:
            break
    ids = [(key, prompt_ids(tokenizer, p, vocab_size)) for key, p in prompts[:limit]]
    return InputSample(prompt_lengths=tuple(len(t or ()) for _, t in ids),
                       row_lengths=tuple(rows[:limit]) or ((gen_len, bool(stop)),),
                       prompt_ids={key: tuple(t) for key, t in ids if t})


def requests_sample(items: list, default: SamplingParams, limit: int = SAMPLE_ROWS) -> InputSample:
    """The sample of the requests among `items` (the rows a caller hands the engine first): up to `limit` of them,
    spread evenly, each one's prompt token count (its `prompt_ids`; 0 where it has none) and (max_new_tokens,
    whether a stop string may end it); `default`'s where no row runs."""
    requests = [item for item in items if isinstance(item, Request)]
    picked = requests[:: max(1, len(requests) // limit)][:limit]
    rows = tuple((r.params.max_new_tokens, bool(r.params.stop)) for r in picked)
    return InputSample(tuple(len(r.prompt_ids or ()) for r in picked),
                       rows or ((default.max_new_tokens, bool(default.stop)),))


def with_prompt_ids(items: list, tokenizer, vocab_size: int | None = None) -> list:
    """`items` with each request that has no token ids yet carrying them, by the engine's rule
    (engine/prompt_ids.py); a request the rule fails is left as it is (the engine fails that row, naming why)."""
    out = []
    for item in items:
        if isinstance(item, Request) and item.prompt_ids is None:
            try:
                item = dataclasses.replace(item, prompt_ids=tuple(request_prompt_ids(tokenizer, vocab_size, item)))
            except PromptError:
                pass
        out.append(item)
    return out


def _sample_parquet(f: InputFile, column: str, gen_len: int, stop: tuple[str, ...], limit: int, prompts: list,
                    rows: list) -> None:
    """Row group by row group, the prompt column and the row parameter columns read together, until `prompts`
    holds `limit` usable prompts."""
    with open_parquet(f.path) as pf:
        params = [c for c in PARAM_COLUMNS if c in pf.schema_arrow.names]
        first = 0
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g, columns=[column, *params])
            cols = {name: column_values(table, name) for name in table.column_names}  # NotUtf8 where not UTF-8
            values = cols[column]
            prompts += [((str(f.path), first + i), v) for i, v in enumerate(values)
                        if (isinstance(v, str) and v) or isinstance(v, list)]
            for m, s in zip(cols.get("max_new_tokens", [None] * len(values)), cols.get("stop", [None] * len(values))):
                ok = isinstance(m, (int, float)) and m >= 1 and float(m).is_integer()
                rows.append((int(m) if ok else gen_len, bool(stop) if s is None or isinstance(s, NotUtf8) else bool(s)))
            first += len(values)
            if len(prompts) >= limit:
                return


def prompt_ids(tokenizer, prompt, vocab_size: int | None = None) -> list[int] | None:
    """A prompt's token ids by the engine's rule (engine/prompt_ids.py: a string tokenized, a conversation
    rendered by the chat template, a list of token ids its own), or None where that rule fails the row. Only a
    row the engine would run carries them (`InputSample.with_ids` gives them to requests only)."""
    if isinstance(prompt, str):
        kind = "text"
    else:
        kind = "token_ids" if prompt and all(isinstance(t, int) for t in prompt) else "messages"
    try:
        return rule_prompt_ids(tokenizer, vocab_size, **{kind: prompt})
    except PromptError:
        return None
