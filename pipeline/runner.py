"""The single-process job: check everything cheap first, then load the model once and turn each input file
into one output part."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.policy import Policy
from engine.request import DTYPE_CHOICES, TRUNCATE_CHOICES, Completion, Request, SamplingParams
from engine.spec import ModelSpec, load_model_spec
from pipeline.errors import ConfigError, InputError
from pipeline.output_dir import OutputCheck, check_output, job_record, open_output
from pipeline.parquet_io import (
    InputFile,
    inspect_inputs,
    output_table,
    read_table,
    resolve_inputs,
    write_part_atomic,
)
from pipeline.planning import choose_policy, hardware, prediction_record, workload_from_input
from pipeline.rows import build_requests, row_ids

if TYPE_CHECKING:
    from engine.generate import Engine
    from planner.predict import Prediction

log = logging.getLogger(__name__)

# Requests handed to the engine per call: large enough for it to group prompts by length, small enough that
# progress is logged often.
_REQUESTS_PER_CALL_PER_BATCH = 16


@dataclass(frozen=True)
class RunConfig:
    """Everything a job needs. `params` are the job-wide decoding options; per-row columns override them."""

    input: str
    output: Path
    model: Path
    prompt_column: str = "prompt"
    params: SamplingParams = field(default_factory=SamplingParams)
    dtype: str = "auto"
    policy: Policy = field(default_factory=Policy)
    budgets: dict = field(default_factory=dict)
    offload_dir: Path | None = None
    truncate: str = "error"
    overwrite: bool = False
    plan: bool = True  # pick the policy with the planner, keeping `pins`; False runs `policy` as given
    pins: dict = field(default_factory=dict)
    hardware: Path | None = None  # hardware spec file; None: this machine's cached profile

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", str(self.input))
        object.__setattr__(self, "output", Path(self.output).expanduser().resolve())
        object.__setattr__(self, "model", Path(self.model).expanduser().resolve())
        if not self.input:
            raise ConfigError("--input is empty: expected a Parquet file, a folder or a glob")
        if not isinstance(self.prompt_column, str) or not self.prompt_column:
            raise ConfigError(f"--prompt-column {self.prompt_column!r} is invalid: expected a column name")
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"--dtype {self.dtype!r} is invalid: expected one of {', '.join(DTYPE_CHOICES)}")
        if self.truncate not in TRUNCATE_CHOICES:
            raise ConfigError(f"--truncate {self.truncate!r} is invalid: expected one of {', '.join(TRUNCATE_CHOICES)}")
        if not isinstance(self.policy, Policy):
            raise ConfigError(f"policy {self.policy!r} is invalid: expected an engine.policy.Policy")


@dataclass(frozen=True)
class JobSummary:
    output: Path
    files: int
    rows: int
    error_rows: int
    prompt_tokens: int
    completion_tokens: int
    generate_seconds: float
    parts: tuple[Path, ...]
    policy: dict | None = None
    predicted_seconds: float | None = None  # the planner's prediction of generate_seconds

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens per second of generation (reading and writing Parquet not counted)."""
        return self.completion_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0


@dataclass(frozen=True)
class JobPlan:
    """A job whose inputs, model folder and output folder have been checked; nothing is loaded or written yet."""

    config: RunConfig
    files: tuple[InputFile, ...]
    spec: ModelSpec
    record: dict
    output: OutputCheck


def plan_job(config: RunConfig) -> JobPlan:
    """All checks that need no model weights: Parquet footers, config.json, the output folder."""
    files = tuple(inspect_inputs(resolve_inputs(config.input), config.prompt_column))
    for f in files:
        if f.path.parent == config.output:
            raise InputError(f"input file {f.path} lies in the output folder {config.output}; choose another --output")
    spec = load_model_spec(config.model)
    record = job_record(_job_config(config, files), {str(f.path): f.part_name for f in files})
    record["run"] = {"input": config.input, "policy": config.policy.to_dict()}  # recorded, not hashed
    check = check_output(config.output, record, config.overwrite)
    return JobPlan(config=config, files=files, spec=spec, record=record, output=check)


def _job_config(config: RunConfig, files: tuple[InputFile, ...]) -> dict:
    """What the output depends on; its hash decides whether a folder holds this job's output. The input is
    named by its resolved files (not how it was spelled); of the policy only compression counts, as placement
    and block sizes do not change the completions."""
    return {
        "model": str(config.model),
        "input_files": [str(f.path) for f in files],
        "prompt_column": config.prompt_column,
        "params": dataclasses.asdict(config.params),
        "dtype": config.dtype,
        "truncate": config.truncate,
        "compress_weight": config.policy.compress_weight,
        "compress_cache": config.policy.compress_cache,
    }


def run_job(config: RunConfig) -> JobSummary:
    """Check, load the model, complete every row of every input file, write one part per file."""
    plan = plan_job(config)
    rows = sum(f.num_rows for f in plan.files)
    log.info("%d rows in %d files; model %s (%s)", rows, len(plan.files), config.model, plan.spec.model_type)
    policy, predicted = choose(config, plan)
    plan.record["run"].update(policy=policy.to_dict(), predicted=predicted and prediction_record(predicted))
    engine = _load_engine(config, policy)
    open_output(plan.output, plan.record)
    results = [_run_file(engine, config, f) for f in plan.files]
    summary = JobSummary(
        output=config.output,
        files=len(results),
        rows=sum(r.rows for r in results),
        error_rows=sum(r.error_rows for r in results),
        prompt_tokens=sum(r.prompt_tokens for r in results),
        completion_tokens=sum(r.completion_tokens for r in results),
        generate_seconds=sum(r.seconds for r in results),
        parts=tuple(r.part for r in results),
        policy=policy.to_dict(),
        predicted_seconds=predicted and predicted.total_s,
    )
    log.info("done: %d rows, %d errors, %.1f tokens/s", summary.rows, summary.error_rows, summary.tokens_per_s)
    if predicted is not None:
        log.info("predicted %.2f s (%.1f tokens/s at %d new tokens per row), measured %.2f s (%.1f tokens/s)",
                 predicted.total_s, predicted.tokens_per_s, predicted.workload.gen_len, summary.generate_seconds,
                 summary.tokens_per_s)
    return summary


def choose(config: RunConfig, plan: JobPlan) -> tuple[Policy, Prediction | None]:
    """The planner's policy for this job (keeping the user's pins and compression choice), or the given one."""
    if not config.plan:
        return config.policy, None
    from engine.dtypes import resolve_dtype
    from engine.tokenizer import load_tokenizer

    dtype = str(resolve_dtype(config.dtype)).removeprefix("torch.")
    work = workload_from_input(plan.files, config.prompt_column, load_tokenizer(config.model), plan.spec,
                               config.params.max_new_tokens, dtype)
    pins = {"compress_weight": config.policy.compress_weight, "compress_cache": config.policy.compress_cache,
            **config.pins}
    chosen = choose_policy(plan.spec, work, hardware(config.hardware), pins, config.budgets)
    return chosen.policy, chosen.prediction


def _load_engine(config: RunConfig, policy: Policy) -> Engine:
    from engine.generate import Engine  # torch is imported only when a job runs, not for --help

    started = time.perf_counter()
    engine = Engine.load(config.model, dtype=config.dtype, policy=policy, budgets=config.budgets,
                         offload_dir=config.offload_dir)
    log.info("loaded %s as %s in %.1f s", config.model, engine.dtype, time.perf_counter() - started)
    return engine


@dataclass(frozen=True)
class _FileResult:
    part: Path
    rows: int
    error_rows: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def _run_file(engine: Engine, config: RunConfig, f: InputFile) -> _FileResult:
    table = read_table(f.path)
    if table.num_rows != f.num_rows:
        raise InputError(f"{f.path}: footer says {f.num_rows} rows but {table.num_rows} were read; was it modified?")
    ids = row_ids(table, f.part_stem)
    if len(set(ids)) != len(ids):
        log.warning("%s: the id column has repeated values; output rows stay in input order", f.path)
    items = build_requests(table, ids, config.prompt_column, config.params)
    completions, seconds = _complete(engine, items, config, f.path.name)
    _check_one_per_row(completions, ids)
    out = output_table(table, completions, ids, config.params.logprobs)
    part = write_part_atomic(out, config.output, f.part_name)
    return _FileResult(
        part=part,
        rows=len(completions),
        error_rows=sum(c.finish_reason == "error" for c in completions),
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        completion_tokens=sum(c.completion_tokens for c in completions),
        seconds=seconds,
    )


def _complete(engine: Engine, items: list[Request | Completion], config: RunConfig, name: str):
    """Run the requests among `items` through the engine; return one completion per item, in order, and the
    seconds spent generating."""
    slots = [i for i, item in enumerate(items) if isinstance(item, Request)]
    done = list(items)
    per_call = engine.policy.block_size * _REQUESTS_PER_CALL_PER_BATCH
    seconds = 0.0
    for start in range(0, len(slots), per_call):
        chunk = slots[start : start + per_call]
        started = time.perf_counter()
        out = engine.generate([items[i] for i in chunk], truncate=config.truncate)
        seconds += time.perf_counter() - started
        if len(out) != len(chunk):
            raise RuntimeError(f"engine returned {len(out)} completions for {len(chunk)} requests")
        for i, completion in zip(chunk, out):
            done[i] = completion
        log.info("%s: %d/%d requests done", name, start + len(chunk), len(slots))
    return done, seconds


def _check_one_per_row(completions: list, ids: list[str]) -> None:
    """Exactly one completion per input row, each carrying that row's id: checked before a part is committed."""
    if len(completions) != len(ids):
        raise RuntimeError(f"{len(completions)} completions for {len(ids)} input rows")
    for row, (c, row_id) in enumerate(zip(completions, ids)):
        if not isinstance(c, Completion) or c.id != row_id:
            raise RuntimeError(f"row {row}: expected the completion of id {row_id!r}, got {c!r}")
