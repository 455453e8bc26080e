"""`flexbatch run` / `python -m jobs.run`: complete the prompts of Parquet files (or the requests of an OpenAI Batch
file), write Parquet parts (or Batch API output lines). The command parses and reports; `flexbatch.run` runs.

User errors (bad input, model or output folder) print one line `flexbatch: error: ...` and exit with code 2.
After the summary, a job whose shards failed every try exits with code 1 (3 when a worker was killed for
memory); one whose shards were all written exits 0 when every row completed, 4 when some rows failed and 5 when
every row failed (jobs/common.py)."""

from __future__ import annotations

import json
import sys

import click

import flexbatch
from engine.errors import FlexbatchError
from engine.options import options_of
from jobs.common import default_model, fail, job_exit_code, setup_logging
from jobs.engine_options import (
    declared_options,
    engine_options,
    engine_settings,
    sampling_options,
    sampling_values,
)
from jobs.guided_options import guided_from_options, guided_options
from pipeline.input.ids import id_text
from pipeline.input.parquet import MESSAGES_COLUMN
from pipeline.input.utf8 import NotUtf8, column_values
from pipeline.job import JobSummary, RunConfig
from pipeline.plan.settings import EngineSettings
from pipeline.storage import Folder

_JOB = options_of(RunConfig)  # the job's options, declared on its fields (the engine's among them)
_ENGINE = options_of(EngineSettings)  # taken by engine_settings


@click.command("run", short_help="Complete Parquet prompts or an OpenAI Batch file; write Parquet or JSONL parts.")
@declared_options(*(_JOB[name] for name in ("model", "input", "format", "chat", "output", "prompt_column")))
@sampling_options
@guided_options
@declared_options(_JOB["score"])
@click.option("--show", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="After the run, print the first N rows' prompts and completions.")
@declared_options(*(_JOB[name] for name in ("overwrite", "shard_rows", "max_shard_retries")))
@engine_options
@click.pass_context
def run(ctx, show, choice, regex, json_schema, **options) -> None:
    """Complete every prompt (or request) of the input and write parts with the completions.

    Each part has the input columns plus completion, prompt_tokens, completion_tokens, finish_reason, error
    (and logprobs with --logprobs; prompt_logprobs, continuation_logprob and continuation_is_greedy with
    --score). Rows without an id column get the id <file stem>:<row index>. A messages
    column ({role, content} lists) instead of a prompt makes the rows chat rows (--chat).

    Formats: parquet, or openai: an OpenAI Batch input file (*.jsonl, one {custom_id, method, url, body}
    request per line, url /v1/chat/completions or /v1/completions) gives JSONL parts of Batch API output lines,
    one per input line, in order; a bad line gets an error object and the job goes on.

    Answers that parse: --choice, --regex or --json-schema constrain every row's answer while decoding; a
    guided column constrains its row ({"choice": [...]}, {"regex": ...}, {"json_schema": ...}, {"json_object":
    true}, {"grammar": ...}), and a Batch line its own (response_format json_object or json_schema, or vLLM's
    guided_choice, guided_regex, guided_json, guided_grammar). A constraint that does not compile fails its rows.

    The job runs on Ray, one engine per GPU or per CPU node, each planning its own policy. Work is cut into
    shards (row ranges of the input files); each shard's part is committed in _manifest.jsonl, and _SUCCESS
    holds the summary. Rerun the same command to resume: committed shards are skipped. A bad row fails alone
    (its error column says why). Exit codes: 0 every row completed; 4 some rows failed; 5 every row failed;
    1 a shard failed every try (listed in _SUCCESS; 3 when a worker was killed for memory: lower --cpu-mem or
    --shard-rows); 2 bad input or options (nothing ran). Ids must be unique across the input.

    \b
    Examples:
      flexbatch run --input prompts.parquet --output out/ --max-new-tokens 32
      flexbatch run --input requests.jsonl --output out/   # an OpenAI Batch file
      flexbatch run --input pairs.parquet --output out/ --choice ' Yes' --choice ' No'
      flexbatch run --input people.parquet --output out/ --json-schema person.json --max-new-tokens 128
      flexbatch run --input choices.parquet --output out/ --score   # prompt + continuation log-probabilities
      flexbatch run --input 'data/*.parquet' --output out/ --workers 2 --shard-rows 512
      flexbatch run --address auto --input /shared/prompts/ --output /shared/out/   # join a Ray cluster

    \b
    lm-evaluation-harness tasks on the same engine, through lm-eval's own command line (docs/SCORING.md):
      python -m flexbatch.lm_eval --model flexbatch --model_args pretrained=DIR --tasks TASKS
    """
    setup_logging()
    job = {name: options.pop(name) for name in _JOB if name in options and name not in _ENGINE}
    try:
        decoding = sampling_values(options)
        settings = engine_settings(ctx, options)
        guided = guided_from_options(choice, regex, json_schema)
        summary = flexbatch.run(job.pop("model") or default_model(), job.pop("input"), job.pop("output"),
                                guided=guided, **job, **decoding, **settings.settings())
    except FlexbatchError as e:
        fail(e)
    _print_summary(summary)
    _print_rows(summary, show, job["prompt_column"])
    code = job_exit_code(summary)
    if code:
        sys.exit(code)


def _print_rows(s: JobSummary, n: int, prompt_column: str) -> None:
    """The first `n` output rows, prompt and completion side by side (newlines shown as \\n)."""
    shown = 0
    for part in s.parts:
        if shown >= n:
            break
        for row_id, prompt, completion, finish in _part_rows(s, part, prompt_column)[: n - shown]:
            prompt, completion = (str(t or "").replace("\n", "\\n") for t in (prompt, completion))
            click.echo(f"[{row_id}] {prompt} -> {completion!s}  ({finish})")
            shown += 1


def _part_rows(s: JobSummary, part, prompt_column: str) -> list[tuple]:
    """(id, prompt, completion, finish reason) of each row of a Parquet part or an OpenAI Batch JSONL part (whose
    lines hold no prompt); a chat row shows its last message."""
    name = str(part).rsplit("/", 1)[-1]
    if name.endswith(".jsonl"):
        return [_batch_row(json.loads(t)) for t in (Folder(s.output).read_text(name) or "").splitlines()]
    import pyarrow.parquet as pq

    table = pq.read_table(part)
    column = prompt_column if prompt_column in table.column_names else MESSAGES_COLUMN
    ids, completions, finishes = (table.column(c).to_pylist() for c in ("id", "completion", "finish_reason"))
    prompts = [id_text(p) if isinstance(p, NotUtf8) else p for p in column_values(table, column)]  # escaped bytes
    return [(i, p[-1]["content"] if isinstance(p, list) and p else p, c, f)
            for i, p, c, f in zip(ids, prompts, completions, finishes)]


def _first_error(s: JobSummary) -> tuple[str, str] | None:
    """(id, error) of the first row that failed, read from the parts in order."""
    for part in s.parts:
        name = str(part).rsplit("/", 1)[-1]
        if name.endswith(".jsonl"):
            for text in (Folder(s.output).read_text(name) or "").splitlines():
                line = json.loads(text)
                if line["error"] is not None:  # a line without a readable custom_id: its message names the line
                    return str(line["custom_id"] or "no custom_id"), line["error"]["message"]
            continue
        import pyarrow.parquet as pq

        table = pq.read_table(part, columns=["id", "error"])
        for row_id, error in zip(table.column("id").to_pylist(), table.column("error").to_pylist()):
            if error is not None:
                return row_id, error
    return None


def _batch_row(line: dict) -> tuple:
    if line["error"] is not None:
        return line["custom_id"], "", line["error"]["message"], "error"
    choice = line["response"]["body"]["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return line["custom_id"], "", text, choice["finish_reason"]


def _print_summary(s: JobSummary) -> None:
    click.echo(f"rows: {s.rows} in {s.files} files, {s.error_rows} with errors")
    first = _first_error(s) if s.error_rows else None
    if first:
        what = "every row failed, the first" if s.error_rows == s.rows else "first row error"
        click.echo(f"  {what}: [{first[0]}] {first[1]}")
    click.echo(f"shards: {s.shards}, {s.skipped_shards} committed earlier, {len(s.failed_shards)} failed")
    for f in s.failed_shards:
        click.echo(f"  failed shard {f['shard']} ({f['part']}, {f['rows']} rows) after {f['tries']} tries: {f['error']}")
    click.echo(f"tokens: {s.prompt_tokens} prompt, {s.completion_tokens} completion")
    if s.saved_tokens:
        click.echo(f"shared prefixes: {s.saved_tokens} prompt tokens ({s.shared_prefix['saved_share']:.0%}) computed "
                   f"once per block instead of once per row")
    click.echo(f"speed: {s.job_tokens_per_s:.1f} completion tokens/s with {len(s.workers)} engines "
               f"({s.wall_seconds:.2f} s)")
    if s.predicted_seconds is not None:
        click.echo(f"planner: predicted {s.predicted_seconds:.2f} s, measured {s.wall_seconds:.2f} s "
                   f"(policy {s.policy})")
    click.echo(f"output: {s.output}")
