"""`flexbatch.run(model=..., input=..., output=..., **options)`: one job, the same code path as `flexbatch run`
(the command builds its `RunConfig` with `run_config`, checks it with `prepare_job` and runs it with
`run_prepared`)."""

from __future__ import annotations

from dataclasses import fields

from engine.request import SamplingParams, check_context
from pipeline.errors import ConfigError
from pipeline.execution.driver import run_prepared
from pipeline.job import JobSummary, RunConfig, prepare_job

SAMPLING_OPTIONS = tuple(f.name for f in fields(SamplingParams))
JOB_OPTIONS = tuple(f.name for f in fields(RunConfig) if f.name not in ("model", "input", "output"))


def run_config(model, input, output, **options) -> RunConfig:
    """A job's configuration from keyword options: any `RunConfig` field (chat, format, prompt_column, dtype,
    truncate, pins, budgets, use_ray, workers, shard_rows, ...) and the decoding options max_new_tokens,
    temperature, top_p, top_k, stop, seed, logprobs and guided (an answer constraint such as {"choice": [...]},
    engine/guided.py) (or `params=SamplingParams(...)`). Each option is checked as declared (engine/options.py):
    a bad value is an `OptionError` naming the keyword and what it expects."""
    unknown = sorted(set(options) - set(JOB_OPTIONS) - set(SAMPLING_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown options {unknown}: use the job options {', '.join(JOB_OPTIONS)} or the "
                          f"decoding options {', '.join(SAMPLING_OPTIONS)}")
    decoding = {name: options.pop(name) for name in SAMPLING_OPTIONS if name in options}
    if decoding:
        if "params" in options:
            raise ConfigError(f"options {sorted(decoding)} and params= both set decoding options; give one of them")
        options["params"] = SamplingParams(**decoding)
    return RunConfig(model=model, input=input, output=output, **options)


def run(model, input, output, **options) -> JobSummary:
    """Complete every row of `input` (Parquet files, or an OpenAI Batch .jsonl) into `output`, resuming a job
    that an earlier call left unfinished; returns the job summary. Errors in the options, input, model or
    output folder raise a `FlexbatchError` subclass before any model loads; so does a max_new_tokens that leaves
    no room for a prompt in the model's context (which would fail every row)."""
    job = prepare_job(run_config(model, input, output, **options))  # the inputs, then the model's config
    check_context(job.config.params, job.spec.max_position_embeddings)
    return run_prepared(job)
