"""The job driver: check the job, start the engines (Ray actors, or one in this process), cut the input into
shards, hand them out (showing the progress), record each committed part in the manifest, and write `_SUCCESS`
with the summary.

Rerunning the same command resumes: shards recorded in the manifest are skipped and their parts left alone.
A dead worker is replaced and its shard requeued; a shard that fails `max_shard_retries + 1` times is reported
and every other shard still completes."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING

from engine.batching import shard_rows
from engine.errors import FlexbatchError
from pipeline.input.shards import Shard, make_shards
from pipeline.job import JobSetup, JobSummary, RunConfig, prepare_job
from pipeline.output.folder import (
    JOB_FILES,
    OutputCheck,
    append_manifest,
    check_output,
    open_output,
    read_manifest,
    write_success,
)
from pipeline.output.lock import lock_output
from pipeline.storage import Folder, temp_target

if TYPE_CHECKING:
    from pipeline.execution.worker import WorkerSetup

log = logging.getLogger(__name__)

_WAIT_SECONDS = 1.0


class WorkerPool:
    """Engines kept from one job to the next, for a command that runs many small jobs (a HELM suite's runs):
    a job whose engines run where the last job's did (`--no-ray`, or the same Ray address and --workers) hands
    its set-up to the same workers, which plan it and keep their loaded engine where `pipeline.plan.host.load_key` allows.
    Closed at the end of the command (a `with` block)."""

    def __init__(self):
        self._dispatcher, self._where = None, None

    def workers(self, config: RunConfig, job: JobSetup, total: int):
        where = (config.use_ray, config.address, config.workers)
        if self._dispatcher is not None and where == self._where:
            try:
                return self._dispatcher, self._dispatcher.take_job(job, total)
            except Exception as e:  # FlexbatchError: the user's to fix; else a lost worker: start afresh
                self.close()
                if isinstance(e, FlexbatchError):
                    raise
                log.warning("the kept engines could not take the next job (%s); starting new ones", e)
        self.close()
        self._dispatcher, infos = _start_workers(config, job, total)
        self._where = where
        return self._dispatcher, infos

    def close(self) -> None:
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is not None:
            dispatcher.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_job(config: RunConfig, pool: WorkerPool | None = None) -> JobSummary:
    """Check the job (`prepare_job`) and run it (`run_prepared`)."""
    return run_prepared(prepare_job(config), pool)


def run_prepared(job: JobSetup, pool: WorkerPool | None = None) -> JobSummary:
    """Run a job `prepare_job` checked: lock the output folder and check it (once: as it is now that no other run
    can change it), start the engines (or take `pool`'s), complete every shard not yet committed, write
    `_SUCCESS`."""
    lock = lock_output(job.config.output)
    try:
        output = check_output(job.folder, job.record, job.config.overwrite)
        return _run_locked(job, output, lock, pool)
    finally:
        lock.release()


def _run_locked(job: JobSetup, output: OutputCheck, lock, pool: WorkerPool | None = None) -> JobSummary:
    config = job.config
    total = sum(f.num_rows for f in job.files)
    log.info("%d rows in %d files; model %s (%s)", total, len(job.files), config.model, job.spec.model_type)
    recorded = _recorded_shards(job, output)
    committed = read_manifest(job.folder, job.record["config_hash"]) if output.action == "reuse" else {}
    if recorded is not None and all(s.part_name in committed for s in recorded):
        log.info("every shard of this job is already committed in %s", job.folder)
        return _finish(job, recorded, committed, {}, [], [], 0.0)
    dispatcher, infos = pool.workers(config, job, total) if pool else _start_workers(config, job, total)
    kept = False
    try:
        shards = recorded or make_shards(job.files, config.shard_rows or derived_shard_rows(total, infos))
        job.record["shards"] = [s.to_dict() for s in shards]
        job.record["run"]["workers"] = [info.record() for info in infos]
        open_output(output, job.record)
        pending = [s for s in shards if s.part_name not in committed]
        log.info("%d shards: %d committed by an earlier run, %d to do", len(shards), len(shards) - len(pending),
                 len(pending))
        started = time.perf_counter()
        progress = Progress(total, sum(r["rows"] for r in committed.values()), config.progress_seconds)
        new, failed = _dispatch(dispatcher, job, pending, progress, lock)
        seconds = time.perf_counter() - started
        kept = pool is not None
    finally:
        if not kept:  # a job that failed leaves no engines behind for the next
            (pool or dispatcher).close()
    lock.check()
    return _finish(job, shards, committed, new, failed, infos, seconds)


def _recorded_shards(job: JobSetup, output: OutputCheck) -> list[Shard] | None:
    """The shard layout of an earlier run of this job (kept so that its committed parts stay valid); else the
    shards are cut once the workers have planned (--shard-rows, or `derived_shard_rows`)."""
    old = output.old_record if output.action == "reuse" else None
    recorded = (old or {}).get("shards") or []
    try:
        shards = [Shard.from_dict(d) for d in recorded]
    except (KeyError, TypeError):
        return None
    files = {str(f.path): f.num_rows for f in job.files}
    covered = Counter()
    for s in shards:
        covered[s.path] += s.num_rows
    return shards if shards and dict(covered) == {p: n for p, n in files.items()} else None


def derived_shard_rows(total_rows: int, infos: list[WorkerSetup]) -> int:
    """The shard size of `engine.batching.shard_rows` for the workers' largest planned block."""
    return shard_rows(total_rows, max(info.policy.block_size for info in infos), len(infos))


def _start_workers(config: RunConfig, job: JobSetup, total: int):
    from pipeline.execution.dispatch import InlineDispatcher, RayDispatcher

    if not config.use_ray:
        dispatcher = InlineDispatcher(job)
    else:
        from pipeline.execution.ray_runtime import actor_specs, alive_nodes, connect

        where, joined = connect(config.address)
        try:
            specs = actor_specs(alive_nodes(), config.workers)
        except BaseException:
            if joined:
                import ray

                ray.shutdown()
            raise
        log.info("running on %s: %d engines (%s)", where, len(specs),
                 ", ".join(f"{s.node_ip} {s.num_cpus} CPU {s.num_gpus} GPU" for s in specs))
        dispatcher = RayDispatcher(job, specs, math.ceil(total / len(specs)), leave_ray=joined)
    try:
        infos = dispatcher.start()
    except BaseException:
        dispatcher.close()
        raise
    for info in infos:
        log.info("worker %d: pid %d on %s, %d threads, setup %.1f s; policy %s%s", info.worker, info.pid, info.host,
                 info.threads, info.setup_seconds, info.policy.to_dict(),
                 f"; predicted {info.predicted.total_s:.1f} s for its share" if info.predicted else "")
    return dispatcher, infos


def _dispatch(dispatcher, job: JobSetup, pending: list[Shard], progress: Progress, lock):
    """Keep every idle worker busy until each pending shard is committed or has failed every try."""
    config = job.config
    queue, attempts = deque(pending), Counter()
    new: dict[str, dict] = {}
    failed: list[dict] = []
    try:
        while queue or dispatcher.busy():
            for worker in dispatcher.idle():
                if queue:
                    dispatcher.submit(worker, queue.popleft())
            for o in dispatcher.wait(_WAIT_SECONDS):
                if o.result is not None:
                    lock.check()
                    new[o.shard.part_name] = _commit(job.folder, job.record["config_hash"], o.shard, o.result)
                    progress.add(o.result.rows, o.result.completion_tokens)
                    continue
                attempts[o.shard.index] += 1
                tries = attempts[o.shard.index]
                what = "its worker died" if o.worker_lost else "it failed"
                if tries > config.max_shard_retries or not o.retry:
                    log.error("shard %d (%s) %s on try %d, giving up: %s", o.shard.index, o.shard.part_name, what,
                              tries, o.error)
                    failed.append({**_failure(o.shard, o.error, tries), "out_of_memory": o.out_of_memory})
                    if not o.retry:  # every other shard would fail the same way
                        failed += [_failure(s, f"not started: {o.error}", 0) for s in queue]
                        queue.clear()
                else:
                    log.warning("shard %d (%s) %s (try %d of %d), requeued: %s", o.shard.index, o.shard.part_name,
                                what, tries, config.max_shard_retries + 1, o.error)
                    queue.append(o.shard)
            progress.tick()
    finally:
        progress.close()
    progress.log_line()
    return new, failed


class Progress:
    """The driver's progress: a tqdm bar (rows done/total, completion tokens/s, ETA) when stderr is a terminal,
    else one log line every `every` seconds."""

    def __init__(self, total_rows: int, done_rows: int, every: float, bar: bool | None = None):
        self.total, self.done, self.every = total_rows, done_rows, every
        self.tokens = 0
        self.run_rows = 0  # rows done by this run (not counting those committed by an earlier one)
        self.started = self._last_log = time.monotonic()
        self._bar = None
        if sys.stderr.isatty() if bar is None else bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_rows, initial=done_rows, unit="row", dynamic_ncols=True, file=sys.stderr)

    def add(self, rows: int, completion_tokens: int) -> None:
        self.done += rows
        self.run_rows += rows
        self.tokens += completion_tokens
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix_str(f"{self.tokens_per_s:.1f} tok/s", refresh=True)
        self.tick()

    @property
    def tokens_per_s(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def eta_seconds(self) -> float | None:
        elapsed = time.monotonic() - self.started
        if self.run_rows <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / self.run_rows

    def tick(self) -> None:
        """A log line if `every` seconds have passed since the last one (no bar only)."""
        now = time.monotonic()
        if self._bar is not None or now - self._last_log < self.every:
            return
        self._last_log = now
        self.log_line()

    def log_line(self) -> None:
        eta = self.eta_seconds()
        eta_text = f", ETA {eta:.0f} s" if eta is not None else ""
        log.info("progress: %d/%d rows, %.1f completion tokens/s%s", self.done, self.total, self.tokens_per_s,
                 eta_text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _failure(shard: Shard, error: str, tries: int) -> dict:
    return {"shard": shard.index, "part": shard.part_name, "rows": shard.num_rows, "error": error, "tries": tries}


def _commit(folder: Folder, config_hash: str, shard: Shard, result) -> dict:
    """Record a written part: from this line on, the shard is done."""
    record = {"config_hash": config_hash, "shard": shard.index, "part": result.part, "bytes": result.bytes,
              "sha256": result.sha256,
              "rows": result.rows, "error_rows": result.error_rows, "prompt_tokens": result.prompt_tokens,
              "completion_tokens": result.completion_tokens, "shared_tokens": result.shared_tokens,
              "saved_tokens": result.saved_tokens, "seconds": round(result.seconds, 4),
              "wall_seconds": round(result.wall_seconds, 4), "worker": result.worker,
              "committed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    append_manifest(folder, record)
    return record


def _finish(job: JobSetup, shards, committed: dict, new: dict, failed: list, infos: list[WorkerSetup],
            seconds: float):
    """Remove temporaries, write `_SUCCESS` and return the summary (of the whole job, earlier runs included)."""
    folder = job.folder
    ours = {s.part_name for s in shards} | set(JOB_FILES)
    for name, is_file in folder.entries():
        if is_file and temp_target(name) in ours:
            folder.delete(name)
    done = {**committed, **new}
    predictions = [i.predicted.total_s for i in infos if i.predicted]
    summary = JobSummary(
        output=job.config.output, files=len(job.files), rows=sum(r["rows"] for r in done.values()),
        error_rows=sum(r["error_rows"] for r in done.values()),
        prompt_tokens=sum(r["prompt_tokens"] for r in done.values()),
        completion_tokens=sum(r["completion_tokens"] for r in done.values()),
        generate_seconds=sum(r["seconds"] for r in new.values()),
        parts=tuple(part_location(folder, s.part_name) for s in shards if s.part_name in done),
        policy=infos[0].policy.to_dict() if infos else None,
        predicted_seconds=max(predictions) if predictions else None,
        workers=tuple(i.record() for i in infos), shards=len(shards), skipped_shards=len(committed), failed_shards=tuple(failed),
        wall_seconds=seconds, run_completion_tokens=sum(r["completion_tokens"] for r in new.values()),
        shared_tokens=sum(r.get("shared_tokens", 0) for r in done.values()),
        saved_tokens=sum(r.get("saved_tokens", 0) for r in done.values()),
    )
    write_success(folder, success_record(summary, new))
    log.info("done: %d rows (%d with errors) in %d shards, %d failed; %.1f completion tokens/s", summary.rows,
             summary.error_rows, len(done), len(failed), summary.job_tokens_per_s)
    if summary.rows and summary.error_rows == summary.rows:
        log.warning("every row failed (%d rows): each row's error says why; no row has a completion", summary.rows)
    return summary


def part_location(folder: Folder, name: str) -> Path | str:
    """A part's path (a local folder) or URI."""
    return folder.child(name) if folder.remote else Path(folder.child(name))


def success_record(s: JobSummary, new: dict) -> dict:
    """`_SUCCESS`'s content. `ok`: every shard was written; `status` says more: "complete" (every row completed),
    "row_errors" (some rows failed), "all_rows_failed" (every row failed: no completion), or "failed_shards"."""
    status = ("failed_shards" if not s.ok else "all_rows_failed" if s.rows and s.error_rows == s.rows
              else "row_errors" if s.error_rows else "complete")
    return {
        "ok": s.ok, "status": status, "rows": s.rows, "error_rows": s.error_rows, "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens, "shared_prefix": s.shared_prefix, "shards": s.shards, "skipped_shards": s.skipped_shards,
        "new_shards": len(new), "failed_shards": list(s.failed_shards),
        "tokens_per_s": s.job_tokens_per_s, "measured_seconds": s.wall_seconds,
        "generate_seconds": s.generate_seconds, "predicted_seconds": s.predicted_seconds,
        "workers": list(s.workers), "parts": [str(p).rsplit("/", 1)[-1] for p in s.parts],
    }
