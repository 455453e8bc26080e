"""One engine and the shards it completes. `ShardWorker` is a plain class: the driver runs it as a Ray actor (one
per GPU, or per CPU node) or, with `--no-ray`, in its own process. Setup loads the model once and plans the
policy for this node's hardware; each shard is read, completed and written as one atomic output part, which
only counts once the driver records it in the manifest."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import FlexbatchError
from engine.memory.room import oom_kills_here
from engine.request import Completion
from pipeline.errors import InputError
from pipeline.execution.logs import setup_logging
from pipeline.input.openai_batch import line_completions, read_batch_shard
from pipeline.input.requests import build_requests, row_ids
from pipeline.input.scoring import CONTINUATION_COLUMN, UNUSED_COLUMNS, score_columns, scored, scoring_items
from pipeline.input.shards import Shard, read_shard
from pipeline.input.utf8 import column_values
from pipeline.job import JobSetup
from pipeline.output.openai_batch import choices_by_line, jsonl_bytes, output_lines
from pipeline.output.parts import output_table, write_part_atomic
from pipeline.plan.host import Completed, EngineHost
from pipeline.plan.planning import job_workload, prediction_record

if TYPE_CHECKING:
    from engine.policy import Policy
    from planner.predict import Prediction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardResult:
    """What a worker reports for a shard it wrote; the driver turns it into a manifest line."""

    shard: int
    part: str
    bytes: int
    sha256: str  # of the part's content: resume and `flexbatch verify` check it
    rows: int
    error_rows: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float  # spent generating
    wall_seconds: float  # reading + generating + writing
    worker: int
    shared_tokens: int = 0  # shared prefixes' tokens, computed once per block (engine/loop/shared_prefix.py)
    saved_tokens: int = 0  # prompt tokens rows did not compute because their block's prefix was shared


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker reports once its engine is set up for a job; the driver logs it, sizes shards by its policy's
    block and records it (`record`) in `_job.json` and the job's summary."""

    worker: int
    pid: int
    host: str
    threads: int
    policy: Policy
    predicted: Prediction | None  # the planner's prediction for this worker's share; None with --no-plan
    setup_seconds: float
    node: str | None  # the Ray node; None with --no-ray
    node_engines: int  # engines that started together on this node and share its memory
    cpu_budget: float | None
    oom_kills: int | None  # the driver's baseline for its node
    engine_reused: bool  # the engine of the worker's last job was kept (pipeline.plan.host.load_key)

    def record(self) -> dict:
        """As `_job.json`'s `run.workers` and `JobSummary.workers` hold it."""
        return {"worker": self.worker, "pid": self.pid, "host": self.host, "threads": self.threads,
                "policy": self.policy.to_dict(), "predicted": self.predicted and prediction_record(self.predicted),
                "setup_seconds": self.setup_seconds, "node": self.node, "node_engines": self.node_engines,
                "cpu_budget": self.cpu_budget, "oom_kills": self.oom_kills, "engine_reused": self.engine_reused}


class ShardWorker:
    def __init__(self, job: JobSetup, worker_id: int, threads: int | None = None, planned_rows: int | None = None,
                 node_engines: int = 1):
        """Load the model once and plan the policy for this node and `planned_rows` rows (this worker's share),
        within this worker's share of the node's memory (`node_engines` engines start on it)."""
        setup_logging()
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.worker_id, self.host = worker_id, EngineHost(node_engines)
        self.take_job(job, planned_rows)

    @property
    def engine(self):
        return self.host.engine

    def take_job(self, job: JobSetup, planned_rows: int | None = None) -> None:
        """The next job of the same command (a HELM suite's next run), planned here again. The loaded engine is
        kept where the new job's model, engine settings and policy keep the weights as they are
        (`pipeline.plan.host.load_key`); else the model is loaded again."""
        self.job, self._setup_error = job, None
        try:
            self._setup(planned_rows)
        except FlexbatchError as e:  # a user error (model, budget, job): reported by info(), not a dead actor
            self._setup_error = e

    def _setup(self, planned_rows: int | None) -> None:
        started = time.perf_counter()
        config = self.job.config
        reused = self.host.take(config.model, self.job.spec, config, job_workload(self.job, planned_rows))
        self._info = WorkerSetup(
            worker=self.worker_id, pid=os.getpid(), host=socket.gethostname(), threads=_threads(),
            policy=self.host.policy, predicted=self.host.prediction, setup_seconds=time.perf_counter() - started,
            node=_node_id(), node_engines=self.host.node_engines, cpu_budget=self.host.budgets.get("cpu"),
            oom_kills=oom_kills_here(), engine_reused=reused)

    def info(self) -> WorkerSetup:
        if self._setup_error is not None:
            raise self._setup_error
        return self._info

    def run_shard(self, shard: Shard) -> ShardResult:
        if self._setup_error is not None:
            raise self._setup_error
        started = time.perf_counter()
        log.info("worker %d (pid %d) starts shard %d: %s rows %d-%d", self.worker_id, os.getpid(), shard.index,
                 os.path.basename(shard.path), shard.row_start, shard.row_stop)
        run = self._batch_part if self.job.format == "openai" else self._parquet_part
        (size, sha256), rows, done = run(shard)
        return ShardResult(
            shard=shard.index, part=shard.part_name, bytes=size, sha256=sha256, rows=len(rows),
            error_rows=sum(any(c.finish_reason == "error" for c in row) for row in rows),
            prompt_tokens=sum(row[0].prompt_tokens for row in rows),
            completion_tokens=sum(c.completion_tokens for row in rows for c in row),
            seconds=done.seconds, wall_seconds=time.perf_counter() - started, worker=self.worker_id,
            shared_tokens=done.shared_tokens, saved_tokens=done.saved_tokens,
        )

    def _parquet_part(self, shard: Shard) -> tuple[tuple[int, str], list[list[Completion]], Completed]:
        """Complete a Parquet shard and write its part: (bytes, SHA-256), each row's completion, what the engine
        did."""
        config = self.job.config
        table = read_shard(shard)
        if table.num_rows != shard.num_rows:
            raise InputError(f"{shard.path}: expected {shard.num_rows} rows at {shard.row_start}, read "
                             f"{table.num_rows}; was the file modified during the job?")
        ids = row_ids(table, shard.part_stem, offset=shard.row_start)
        items = build_requests(table, ids, config.prompt_column, config.params, chat=self.job.chat,
                               unused=UNUSED_COLUMNS if config.score else ())
        if self.job.sample is not None:  # the rows the driver sampled are tokenized already
            items = self.job.sample.with_ids(items, shard)
        if config.score:  # prompt ids + continuation ids (pipeline/input/scoring.py)
            continuations = (column_values(table, CONTINUATION_COLUMN) if CONTINUATION_COLUMN in table.column_names
                             else None)
            items, lengths = scoring_items(items, continuations, self.engine.tokenizer, self.job.spec.vocab_size)
        done = self.host.complete(items, config.truncate, label=f"shard {shard.index}")
        completions = done.completions
        check_one_per_row(completions, ids)
        scores = None
        if config.score:
            completions = [scored(c, n) for c, n in zip(completions, lengths)]
            scores = score_columns(completions, lengths)
        out = output_table(table, completions, ids, config.params.logprobs, scores)
        return write_part_atomic(out, self.job.folder, shard.part_name), [[c] for c in completions], done

    def _batch_part(self, shard: Shard) -> tuple[tuple[int, str], list[list[Completion]], Completed]:
        """Complete a shard of an OpenAI Batch file and write its JSONL part: (bytes, SHA-256), each line's
        choices, what the engine did."""
        config = self.job.config
        file = next(f for f in self.job.files if str(f.path) == shard.path)
        lines = read_batch_shard(shard, file, config.params, self.job.chat)
        if self.job.sample is not None:  # the lines the driver sampled are tokenized already
            self.job.sample.with_line_ids(lines, shard)
        items = line_completions(lines)
        done = self.host.complete(items, config.truncate, label=f"shard {shard.index}")
        check_one_per_row(done.completions, [item.id for item in items])
        rows = choices_by_line(lines, done.completions)
        objects = output_lines(lines, rows, self.engine.tokenizer, config.model.name, self.job.record["config_hash"])
        folder, data = self.job.folder, jsonl_bytes(objects)
        folder.write_bytes(shard.part_name, data)
        log.info("wrote %s (%d lines)", folder.child(shard.part_name), len(objects))
        return (len(data), hashlib.sha256(data).hexdigest()), rows, done


def check_one_per_row(completions: list, ids: list[str]) -> None:
    """Exactly one completion per input row, each carrying that row's id: checked before a part is written."""
    if len(completions) != len(ids):
        raise RuntimeError(f"{len(completions)} completions for {len(ids)} input rows")
    for row, (c, row_id) in enumerate(zip(completions, ids)):
        if not isinstance(c, Completion) or c.id != row_id:
            raise RuntimeError(f"row {row}: expected the completion of id {row_id!r}, got {c!r}")


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _node_id() -> str | None:
    if "ray" not in sys.modules:  # not inside Ray (--no-ray): importing it would only cost start-up time
        return None
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # not inside Ray, or Ray without a runtime context
        return None
