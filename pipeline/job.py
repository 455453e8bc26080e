"""A job's configuration and the checks that need no model weights (inputs, model config), and the input sample it
plans from. Each worker plans and loads its engine through pipeline/plan/host.py; the driver
(pipeline/execution/driver.py) checks the output folder once it holds its lock, and runs the job."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.env_settings import check_environment
from engine.guided import Guided
from engine.kernels.backend import DEFAULT_BACKEND
from engine.options import Flag, Option, option, option_field
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
from pipeline.output.folder import job_record
from pipeline.plan.settings import EngineSettings
from pipeline.preflight import check_before_run
from pipeline.storage import Folder, file_identity, is_uri

log = logging.getLogger(__name__)

# the options of a job over files: the Ray Data stage takes and returns batches, lm-eval runs requests in its process
_NO_FILES = (("ray", "the stage reads and returns Ray Data batches: no files, shards or output folder"),
             ("model_args", "lm-eval hands the model its requests, not files to read"))
_ANSWER_HOW = ("Enforced while decoding (xgrammar): only tokens that keep the answer valid are chosen, and the row ends "
               "when the answer is complete (or at --max-new-tokens, cut short). A row's guided column overrides it.")
# the job-wide answer constraint (`guided`, engine/guided.py) of the kinds the command line gives; a row's own
# guided column, a Batch line's response_format and the Ray stage's sampling_params give theirs per row
_PER_ROW = (("ray", "a batch row gives its own in sampling_params (guided_decoding)"),
            ("model_args", "lm-eval's requests carry no answer constraint"))
GUIDED = {o.name: o for o in (
    Option("choice", kind="texts", default=(), keyword="guided['choice']", absent=_PER_ROW,
           flag=Flag("--choice", metavar="TEXT"),
           help="The answer is exactly one of these strings; repeatable, e.g. --choice ' Yes' --choice ' No' (mind "
                "the leading space most prompts want). " + _ANSWER_HOW),
    Option("regex", kind="text", optional=True, keyword="guided['regex']", absent=_PER_ROW,
           flag=Flag("--regex", metavar="REGEX"),
           help="The answer matches this regular expression in full, e.g. ' [0-9]{1,4}'."),
    # in Python the schema itself (a dict or its JSON text, read by Guided); on the command line a file holding it
    Option("json_schema", kind="path", optional=True, keyword="guided['json_schema']", absent=_PER_ROW,
           flag=Flag("--json-schema", metavar="FILE", default_text=(
               "no constraint; per-row column guided: {\"choice\": [...]}, {\"regex\": ...}, {\"json_schema\": ...}, "
               "{\"json_object\": true} or {\"grammar\": ...}, as a struct or JSON text")),
           help="The answer is JSON that validates against the JSON schema in FILE (compact: one line, ', ' and ': ' "
                "separators; a string's maxLength becomes a pattern)."),
)}


@dataclass(frozen=True, kw_only=True)
class RunConfig(EngineSettings):
    """Everything a job needs: the engine settings, and the job's input, output, model and decoding options, each
    declared on its field (engine/options.py). `params` are the job-wide decoding options (declared on
    SamplingParams); per-row columns override them."""

    input: str = option(dataclasses.MISSING, kind="location", flag=Flag("--input", metavar="PATH"), absent=_NO_FILES,
                        help="A Parquet file, a folder (all *.parquet in it, sorted) or a glob (quote it); or a URI of "
                             "a filesystem pyarrow reads (s3://bucket/prompts/); or an OpenAI Batch file (*.jsonl).")
    # a local folder, or a URI of a pyarrow filesystem (s3://bucket/prefix)
    output: Path | str = option(dataclasses.MISSING, kind="location", flag=Flag("--output", metavar="DIR"),
                                absent=_NO_FILES,
                                help="Folder for the output parts (<stem>.parquet per input file, or "
                                     "<stem>.rows-<a>-<b>.parquet per shard of a larger one), _job.json, "
                                     "_manifest.jsonl and _SUCCESS.")
    model: Path = option(dataclasses.MISSING, kind="path",
                         flag=Flag("--model", default=None, default_text="the demo model in examples/demo-model"),
                         absent=(("model_args", "lm-eval names the checkpoint pretrained=DIR"),),
                         help="Checkpoint folder (config.json, tokenizer, *.safetensors).")
    prompt_column: str = option("prompt", kind="text", hint="a column name", flag=Flag("--prompt-column"),
                                absent=(("ray", "the stage reads Ray Data LLM's prompt (or messages) column"),
                                        _NO_FILES[1]),
                                help="Input column that holds the prompts.")
    chat: str = option("auto", kind="choice", choices=CHAT_CHOICES, flag=Flag("--chat"),
                       absent=(("model_args", "lm-eval renders conversations itself (--apply_chat_template)"),),
                       help="Rows are conversations (a messages column of {role, content} lists), rendered by the "
                            "checkpoint's chat template; auto: when every input file has a messages column.")
    format: str = option("auto", kind="choice", choices=FORMAT_CHOICES, flag=Flag("--format"), absent=_NO_FILES,
                         help="Input format: parquet (prompt or messages column), openai (OpenAI Batch JSONL: one "
                              "request per line, written back as Batch API output lines); auto picks openai for a "
                              "*.jsonl input.")
    params: SamplingParams = field(default_factory=SamplingParams)
    truncate: str = option_field(TRUNCATE)
    score: bool = option(False, kind="bool", flag=Flag("--score", default_text="off"),
                         absent=(("model_args", "lm-eval asks for scores per request (loglikelihood)"),),
                         help="Score each row instead of completing it: the log-probability of every prompt token "
                              "given the ones before (column prompt_logprobs), and of an optional continuation "
                              "column's text after the prompt (continuation_logprob, the sum; "
                              "continuation_is_greedy). No text is generated (completion is \"\").")
    overwrite: bool = option(False, kind="bool", flag=Flag("--overwrite", default_text="off, such a folder is refused"),
                             absent=_NO_FILES,
                             help="Replace the output of another job in --output (removes its Parquet parts).")
    shard_rows: int | None = option(None, kind="int", low=1, optional=True, absent=_NO_FILES,
                                    flag=Flag("--shard-rows", metavar="N", checked=True, default_text=(
                                        "up to 8 planned blocks, and at most each worker's share of the rows")),
                                    help="Rows per shard, the unit of work, retry and resume.")
    max_shard_retries: int = option(2, kind="int", low=0, flag=Flag("--max-shard-retries", checked=True),
                                    absent=_NO_FILES,
                                    help="Tries after the first for a shard whose worker died or that failed.")
    progress_seconds: float = option(10.0, kind="number", low=0,
                                     absent=(("cli", "the command keeps the default interval"), *_NO_FILES),
                                     help="Seconds between progress log lines when stdout is not a terminal.")

    def __post_init__(self) -> None:
        super().__post_init__()  # every declared option: the engine's and the job's
        object.__setattr__(self, "input", str(self.input))
        if not is_uri(self.output):
            object.__setattr__(self, "output", Path(self.output).expanduser().resolve())
        object.__setattr__(self, "model", Path(self.model).expanduser().resolve())
        if not isinstance(self.params, SamplingParams):
            raise ConfigError(f"params={self.params!r} is invalid: expected an engine.request.SamplingParams, or "
                              f"the decoding options as keywords (max_new_tokens=..., temperature=...)")
        _check_guided(self.params.guided)
        if self.score and self.params.guided is not None:
            flags = [o.flag.name for o in GUIDED.values()]
            raise ConfigError(f"--score scores the rows' own tokens and generates none, so the answer constraint "
                              f"({self.params.guided.describe(40)}) would never apply: drop {', '.join(flags[:-1])} "
                              f"or {flags[-1]} (a guided column is not read by a scoring job)")
        if self.score:  # one token asked for and dropped: the prefill scores the row (pipeline/input/scoring.py)
            object.__setattr__(self, "params", scoring_params(self.params))

    @classmethod
    def for_job(cls, engine: EngineSettings, **job) -> RunConfig:
        """A job's configuration: `engine`'s settings and the job's own fields (input, output, model, ...)."""
        return cls(**engine.settings(), **job)


def _check_guided(guided: Guided | None) -> None:
    """The job-wide constraint's choices and regex, as declared (`GUIDED`): a job refuses a bad one before it runs,
    where a row's own constraint fails only that row. A JSON schema is the schema itself here, read by Guided."""
    for name in ("choice", "regex"):
        value = getattr(guided, name, None)
        if value is not None:
            GUIDED[name].check(value)


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
    check_environment()  # the environment the workers inherit: a bad FLEXBATCH_ISA fails here, not in each worker
    files, chat = _inspect(config)
    for f in files:
        if isinstance(f.path, Path) and f.path.parent == config.output:
            raise InputError(f"input file {f.path} lies in the output folder {config.output}; choose another --output")
    spec = load_model_spec(config.model)
    tokenizer = load_tokenizer(config.model)  # a tokenizer that is missing or needs the folder's code: refused before Ray
    if chat:
        check_chat_template(tokenizer, config.model)
    check_before_run(config, config.params.guided, spec, tokenizer, config.model)  # hardware file, offload folder,
    # the job-wide constraint: refused here, in one line, rather than in every shard or row
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
        "model_files": model_identity(config.model),
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


MODEL_FILES = (".safetensors", ".json", ".jinja", ".model", ".tiktoken", ".txt")  # weights, config, tokenizer


def model_identity(model: Path) -> list[dict]:
    """The checkpoint's files the completions depend on (weights, config, tokenizer, chat template), each by path,
    size and mtime as an input file is: a checkpoint replaced or changed in place at the same path makes another
    job, whose output the folder of the old one refuses, instead of reporting the old completions as done."""
    return [file_identity(f) for f in sorted(Path(model).iterdir()) if f.is_file() and f.suffix in MODEL_FILES]


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
