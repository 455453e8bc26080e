"""A job's configuration and the checks that need no model weights (inputs, model config), and the input sample it
plans from. Each worker plans and loads its engine through pipeline/plan/host.py; the driver
(pipeline/execution/driver.py) checks the output folder once it holds its lock, and runs the job."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.kernels.backend import DEFAULT_BACKEND
from engine.request import TRUNCATE, SamplingParams
from engine.spec import ModelSpec, load_model_spec
from engine.tokenizer import load_tokenizer
from pipeline.errors import ConfigError, InputError
from pipeline.input.parquet import (
    CHAT_CHOICES,
    FORMAT_CHOICES,
    MESSAGES_COLUMN,
    SUFFIXES,
    InputFile,
    input_format,
    inspect_inputs,
    resolve_inputs,
    uses_chat,
)
from pipeline.input.sample import InputSample, take_sample
from pipeline.input.scoring import scoring_params
from pipeline.option_checks import check_bool, check_path, number_at_least, whole_number
from pipeline.output.folder import job_record
from pipeline.plan.settings import EngineSettings
from pipeline.storage import Folder, file_identity, is_uri

log = logging.getLogger(__name__)

@dataclass(frozen=True, kw_only=True)
class RunConfig(EngineSettings):
    """Everything a job needs: the engine settings, and the job's input, output, model and decoding options.
    `params` are the job-wide decoding options; per-row columns override them."""

    input: str
    output: Path | str  # a local folder, or a URI of a pyarrow filesystem (s3://bucket/prefix)
    model: Path
    prompt_column: str = "prompt"
    chat: str = "auto"  # rows are conversations (`messages`): on, off, or auto (when there is a messages column)
    format: str = "auto"  # parquet, openai (Batch JSONL), or auto (by the input's extension)
    params: SamplingParams = field(default_factory=SamplingParams)
    truncate: str = TRUNCATE.default
    score: bool = False  # score each row's prompt (and continuation column) instead of completing it
    overwrite: bool = False
    shard_rows: int | None = None  # None: derived from the planned block size
    max_shard_retries: int = 2
    progress_seconds: float = 10.0  # log-line interval when stdout is not a terminal

    def __post_init__(self) -> None:
        check_path("input", self.input, "a Parquet file, a folder, a glob or a batch .jsonl file")
        check_path("output", self.output, "the output folder")
        check_path("model", self.model, "a checkpoint folder")
        object.__setattr__(self, "input", str(self.input))
        if not is_uri(self.output):
            object.__setattr__(self, "output", Path(self.output).expanduser().resolve())
        object.__setattr__(self, "model", Path(self.model).expanduser().resolve())
        if not isinstance(self.prompt_column, str) or not self.prompt_column:
            raise ConfigError(f"--prompt-column {self.prompt_column!r} is invalid: expected a column name")
        if self.format not in FORMAT_CHOICES:
            raise ConfigError(f"--format {self.format!r} is invalid: expected one of {', '.join(FORMAT_CHOICES)}")
        if self.chat not in CHAT_CHOICES:
            raise ConfigError(f"--chat {self.chat!r} is invalid: expected one of {', '.join(CHAT_CHOICES)}")
        super().__post_init__()
        TRUNCATE.check(self.truncate)
        if not isinstance(self.params, SamplingParams):
            raise ConfigError(f"params={self.params!r} is invalid: expected an engine.request.SamplingParams, or "
                              f"the decoding options as keywords (max_new_tokens=..., temperature=...)")
        check_bool("overwrite", self.overwrite)
        check_bool("score", self.score)
        if self.score and self.params.guided is not None:
            raise ConfigError(f"--score scores the rows' own tokens and generates none, so the answer constraint "
                              f"({self.params.guided.describe(40)}) would never apply: drop --choice, --regex or "
                              "--json-schema (a guided column is not read by a scoring job)")
        if self.score:  # one token asked for and dropped: the prefill scores the row (pipeline/input/scoring.py)
            object.__setattr__(self, "params", scoring_params(self.params))
        object.__setattr__(self, "shard_rows", whole_number("shard_rows", self.shard_rows, 1, "rows per shard "
                                                            "(--shard-rows)", optional=True))
        object.__setattr__(self, "max_shard_retries", whole_number("max_shard_retries", self.max_shard_retries, 0,
                                                                   "tries after a shard's first (--max-shard-retries)"))
        object.__setattr__(self, "progress_seconds", number_at_least("progress_seconds", self.progress_seconds, 0,
                                                                     "seconds between progress lines"))

    @classmethod
    def for_job(cls, engine: EngineSettings, **job) -> RunConfig:
        """A job's configuration: `engine`'s settings and the job's own fields (input, output, model, ...)."""
        return cls(**engine.settings(), **job)


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
    policy: dict | None = None  # the first worker's policy
    predicted_seconds: float | None = None  # the planner's prediction of generate_seconds
    workers: tuple[dict, ...] = ()  # each worker's pid, host, threads, policy and prediction
    shards: int = 0
    skipped_shards: int = 0  # committed by an earlier run of the same job
    failed_shards: tuple[dict, ...] = ()  # shards that failed every try: index, part, error
    wall_seconds: float = 0.0  # this run's time from the first shard handed out to the last one done
    run_completion_tokens: int = 0  # generated by this run (the other counts include earlier runs)
    shared_tokens: int = 0  # shared prefixes' tokens, computed once per block (engine/loop/shared_prefix.py)
    saved_tokens: int = 0  # prompt tokens not computed (nor cached) per row thanks to them

    @property
    def job_tokens_per_s(self) -> float:
        """This run's completion tokens per second of wall time, all workers together."""
        return self.run_completion_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return not self.failed_shards

    @property
    def shared_prefix(self) -> dict:
        """What shared prefixes saved: their tokens (summed over blocks), the prompt tokens rows did not compute,
        and that as a share of all prompt tokens."""
        share = self.saved_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {"shared_tokens": self.shared_tokens, "saved_prompt_tokens": self.saved_tokens,
                "saved_share": round(share, 4)}

    @property
    def out_of_memory(self) -> bool:
        """Whether a shard was given up because its worker was killed for memory."""
        return any(f.get("out_of_memory") for f in self.failed_shards)

    @property
    def tokens_per_s(self) -> float:
        """This run's completion tokens per second of engine time, summed over workers (reading and writing
        Parquet not counted): the speed of one engine."""
        return self.run_completion_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0


@dataclass(frozen=True)
class JobSetup:
    """A job whose inputs and model folder have been checked; nothing is loaded or written yet (the driver checks
    the output folder under its lock: pipeline/execution/driver.py)."""

    config: RunConfig
    files: tuple[InputFile, ...]
    spec: ModelSpec
    record: dict
    folder: Folder  # where the output goes: a local folder or a URI
    chat: bool = False  # rows are conversations, rendered by the checkpoint's chat template
    sample: InputSample | None = None  # what the job plans from: taken once, by the driver, when it plans

    @property
    def format(self) -> str:
        """"parquet", or "openai" for OpenAI Batch JSONL files."""
        return self.files[0].format if self.files else "parquet"

    @property
    def column(self) -> str:
        """The input column a row's prompt comes from."""
        return MESSAGES_COLUMN if self.chat else self.config.prompt_column


def prepare_job(config: RunConfig) -> JobSetup:
    """All checks that need no model weights: Parquet footers, config.json, the chat template when rows are
    conversations; and, when the job plans, the input sample it plans from."""
    files, chat = _inspect(config)
    for f in files:
        if isinstance(f.path, Path) and f.path.parent == config.output:
            raise InputError(f"input file {f.path} lies in the output folder {config.output}; choose another --output")
    spec = load_model_spec(config.model)
    tokenizer = load_tokenizer(config.model)  # a tokenizer that is missing or needs the folder's code: refused before Ray
    if chat:
        check_chat_template(tokenizer, config.model)
    sample = None
    if config.plan:  # read and tokenized here, once; the workers plan from it and reuse its token ids
        column = MESSAGES_COLUMN if chat else config.prompt_column
        sample = take_sample(files, column, tokenizer, config.params.max_new_tokens, config.params.stop,
                             vocab_size=spec.vocab_size)
        if config.score:  # a scored row makes one token, whatever its max_new_tokens column says
            sample = dataclasses.replace(sample, row_lengths=((1, False),) * len(sample.row_lengths))
    record = job_record(_job_config(config, files, chat))
    record["run"] = {"input": config.input, "pins": dict(config.pins), "plan": config.plan}  # recorded, not hashed
    return JobSetup(config=config, files=files, spec=spec, record=record, folder=Folder(config.output), chat=chat,
                    sample=sample)


def _inspect(config: RunConfig) -> tuple[tuple[InputFile, ...], bool]:
    return inspect_job_inputs(config.input, config.prompt_column, config.chat, config.format, config.score)


def inspect_job_inputs(input: str, prompt_column: str = "prompt", chat: str = "auto",
                       format: str = "auto", score: bool = False) -> tuple[tuple[InputFile, ...], bool]:
    """The input files, checked, and whether their rows are conversations. A batch file's lines say so by their
    url; --chat off turns its chat lines into line errors."""
    fmt = input_format(input, format)
    if score and fmt == "openai":
        raise ConfigError(f"--score reads Parquet rows, and {input} is an OpenAI Batch file; drop --score and ask "
                          "for scores in its lines (/v1/completions with echo: true, logprobs: 0, max_tokens: 0)")
    paths = resolve_inputs(input, SUFFIXES[fmt])
    if fmt == "openai":
        from pipeline.input.openai_batch import inspect_batch_files

        files = tuple(inspect_batch_files(paths))
        return files, chat != "off" and any(f.chat_rows for f in files)
    rows_chat = uses_chat(paths, chat)
    return tuple(inspect_inputs(paths, MESSAGES_COLUMN if rows_chat else prompt_column, score)), rows_chat


def check_chat_template(tokenizer, model: Path) -> None:
    """Chat rows need the checkpoint's chat template; checked from its tokenizer files, before any weights."""
    from engine.chat import has_chat_template

    if not has_chat_template(tokenizer):
        raise ConfigError(f"{model} has no chat template (chat_template in tokenizer_config.json, or "
                          "chat_template.jinja) but the rows are conversations; use a chat checkpoint, or pass "
                          "--chat off to read the prompt column as plain text")


def _job_config(config: RunConfig, files: tuple[InputFile, ...], chat: bool) -> dict:
    """What the output depends on; its hash decides whether a folder holds this job's output. The input is
    named by its resolved files (not how it was spelled); of the policy only compression counts, as placement
    and block sizes do not change the completions."""
    return {
        "model": str(config.model),
        "input_files": [file_identity(f.path) for f in files],
        "prompt_column": config.prompt_column,
        "params": _params_record(config.params),
        "dtype": config.dtype,
        "truncate": config.truncate,
        "compress_weight": config.pinned("compress_weight"),
        "compress_cache": config.pinned("compress_cache"),
        **({"weight_format": config.pinned("weight_format")} if config.pinned("weight_format") != "int4" else {}),
        # kernels other than native may change bf16 outputs; native adds nothing, so older hashes still match
        **({"backend": config.backend} if config.backend != DEFAULT_BACKEND else {}),
        **({"score": True} if config.score else {}),
        **({"chat": True} if chat else {}),  # likewise: plain-prompt jobs keep their hashes
        **({"format": files[0].format} if files and files[0].format != "parquet" else {}),
    }


def _params_record(params: SamplingParams) -> dict:
    """The decoding options as hashed: prompt_logprobs, score_last and guided only when set, so that jobs made before
    them keep their hashes (and resume)."""
    record = dataclasses.asdict(params)
    for name in ("prompt_logprobs", "score_last"):
        if not record.get(name):
            record.pop(name, None)
    if record.get("guided") is None:
        record.pop("guided", None)
    return record
