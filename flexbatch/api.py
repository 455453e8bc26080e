"""`flexbatch.run(model=..., input=..., output=..., **options)`: one job, the same code path as `flexbatch run`
(the command builds its `RunConfig` with `run_config` and runs it with `run_job`)."""

from __future__ import annotations

from dataclasses import fields

from engine.request import SamplingParams
from pipeline.errors import ConfigError
from pipeline.execution.driver import run_job
from pipeline.job import JobSummary, RunConfig

SAMPLING_OPTIONS = tuple(f.name for f in fields(SamplingParams))
JOB_OPTIONS = tuple(f.name for f in fields(RunConfig) if f.name not in ("model", "input", "output"))


def run_config(model, input, output, **options) -> RunConfig:
    """A job's configuration from keyword options: any `RunConfig` field (chat, format, prompt_column, dtype,
    truncate, policy, budgets, use_ray, workers, shard_rows, ...) and the decoding options max_new_tokens,
    temperature, top_p, top_k, stop, seed, logprobs and guided (an answer constraint such as {"choice": [...]},
    engine/guided.py) (or `params=SamplingParams(...)`)."""
    unknown = sorted(set(options) - set(JOB_OPTIONS) - set(SAMPLING_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown options {unknown}: use the job options {', '.join(JOB_OPTIONS)} or the "
                          f"decoding options {', '.join(SAMPLING_OPTIONS)}")
    decoding = {name: options.pop(name) for name in SAMPLING_OPTIONS if name in options}
    _check_decoding_types(decoding)
    if decoding:
        if "params" in options:
            raise ConfigError(f"options {sorted(decoding)} and params= both set decoding options; give one of them")
        options["params"] = SamplingParams(**decoding)  # a bad value raises InvalidParamsError
    return RunConfig(model=model, input=input, output=output, **options)


def _check_decoding_types(decoding: dict) -> None:
    """What SamplingParams would take without a word: a string of "yes" as logprobs (it is true), and a string as
    stop (it would become one stop string per character)."""
    if "logprobs" in decoding and not isinstance(decoding["logprobs"], bool):
        raise ConfigError(f"logprobs={decoding['logprobs']!r} is invalid: expected True or False")
    stop = decoding.get("stop", ())
    if not isinstance(stop, (list, tuple)):
        example = f", e.g. stop=[{stop!r}]" if isinstance(stop, str) else ""
        raise ConfigError(f"stop={stop!r} is invalid: expected a list of stop strings{example}")


def run(model, input, output, **options) -> JobSummary:
    """Complete every row of `input` (Parquet files, or an OpenAI Batch .jsonl) into `output`, resuming a job
    that an earlier call left unfinished; returns the job summary. Errors in the options, input, model or
    output folder raise a `FlexbatchError` subclass before any model loads."""
    return run_job(run_config(model, input, output, **options))
