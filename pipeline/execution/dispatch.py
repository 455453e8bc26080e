"""Running shards on workers: `RayDispatcher` (one actor per engine, dead actors replaced) and `InlineDispatcher`
(one worker in this process, for `--no-ray`). Both hand back `Outcome`s; the driver decides what to commit,
retry or give up on."""

from __future__ import annotations

import logging
import math
import traceback
from dataclasses import dataclass

from engine.errors import FlexbatchError, one_line_with_type
from pipeline.errors import OutputWriteError
from pipeline.execution.worker import ShardResult, ShardWorker, WorkerSetup
from pipeline.input.shards import Shard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    worker: int
    shard: Shard
    result: ShardResult | None = None
    error: str | None = None
    worker_lost: bool = False  # the worker process died (killed, out of memory, node lost)
    retry: bool = True  # False: another try cannot succeed (the output's filesystem is full or read-only)
    out_of_memory: bool = False  # the worker was killed for memory (the kernel's OOM killer, Ray's monitor)


class InlineDispatcher:
    """One `ShardWorker` in this process; a shard runs when `wait` is called."""

    def __init__(self, job, threads: int | None = None):
        self._worker = ShardWorker(job, 0, threads=threads)
        self._pending: Shard | None = None

    def start(self) -> list[WorkerSetup]:
        return [self._worker.info()]

    def take_job(self, job, total_rows: int) -> list[WorkerSetup]:
        """Hand the worker the next job (it plans it, keeping its engine where it can); its set-up info."""
        self._worker.take_job(job)
        return self.start()

    def idle(self) -> list[int]:
        return [] if self._pending else [0]

    def busy(self) -> int:
        return int(self._pending is not None)

    def submit(self, worker: int, shard: Shard) -> None:
        self._pending = shard

    def wait(self, timeout: float) -> list[Outcome]:
        shard, self._pending = self._pending, None
        if shard is None:
            return []
        try:
            return [Outcome(0, shard, result=self._worker.run_shard(shard))]
        except Exception as e:  # a failing shard is retried or reported; it never ends the job
            log.debug("shard %d failed:\n%s", shard.index, traceback.format_exc())
            return [Outcome(0, shard, error=one_line_with_type(e), retry=not isinstance(e, OutputWriteError))]

    def close(self) -> None:
        self._worker = None


class RayDispatcher:
    """One `ShardWorker` actor per `ActorSpec`, at most one shard in flight on each."""

    def __init__(self, job, specs, planned_rows: int, leave_ray: bool = False):
        from pipeline.execution.ray_runtime import start_actor

        self._job, self._specs, self._rows, self._leave_ray = job, list(specs), planned_rows, leave_ray
        self._actors = [start_actor(s, job, i, s.num_cpus, planned_rows, s.node_engines)
                        for i, s in enumerate(self._specs)]
        self._inflight: dict = {}  # object ref -> (worker, shard)
        from engine.memory.room import oom_kills
        from pipeline.execution.ray_runtime import NodeOomKills

        self._oom_kills, self._node_kills = oom_kills(), NodeOomKills()
        self.replaced = 0

    def start(self) -> list[WorkerSetup]:
        """Wait for every actor's setup (model loaded, policy planned); an actor that fails it fails the job."""
        import ray

        infos = []
        for i, actor in enumerate(self._actors):
            try:
                infos.append(ray.get(actor.info.remote()))
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, FlexbatchError):  # the user's to fix: one line, exit 2
                    raise e.cause from None
                raise RuntimeError(f"worker {i} on {self._specs[i].node_ip} failed to start: {_cause(e)}") from e
            except ray.exceptions.RayError as e:
                raise RuntimeError(f"worker {i} on {self._specs[i].node_ip} failed to start: {_cause(e)}") from e
        for info in infos:
            self._node_kills.note(info.node, info.oom_kills)
        return infos

    def take_job(self, job, total_rows: int) -> list[WorkerSetup]:
        """Hand every actor the next job, each planning for its share of `total_rows` (and keeping its engine where
        it can); their set-up infos, as `start` gives them."""
        import ray

        self._job, self._rows = job, math.ceil(total_rows / len(self._actors))
        ray.get([actor.take_job.remote(job, self._rows) for actor in self._actors])
        return self.start()

    def idle(self) -> list[int]:
        busy = {w for w, _ in self._inflight.values()}
        return [i for i in range(len(self._actors)) if i not in busy]

    def busy(self) -> int:
        return len(self._inflight)

    def submit(self, worker: int, shard: Shard) -> None:
        self._inflight[self._actors[worker].run_shard.remote(shard)] = (worker, shard)

    def wait(self, timeout: float) -> list[Outcome]:
        import ray

        if not self._inflight:
            return []
        ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=timeout)
        outcomes = []
        for ref in ready:
            worker, shard = self._inflight.pop(ref)
            try:
                outcomes.append(Outcome(worker, shard, result=ray.get(ref)))
            except ray.exceptions.RayTaskError as e:
                retry = not isinstance(e.cause, OutputWriteError)
                outcomes.append(Outcome(worker, shard, error=_cause(e), retry=retry))
            except ray.exceptions.RayError as e:  # actor died, node lost, object lost
                memory = self._killed_for_memory(e, self._specs[worker])
                error = (f"worker {worker} was killed for memory ({memory}); lower --cpu-mem or --shard-rows "
                         f"(now {shard.num_rows} rows)" if memory else _cause(e))
                outcomes.append(Outcome(worker, shard, error=error, worker_lost=True, out_of_memory=bool(memory)))
                self._replace(worker)
        return outcomes

    def _killed_for_memory(self, e: BaseException, spec) -> str | None:
        """Why a lost worker was killed for memory, or None: Ray's memory monitor says so itself; the kernel's
        OOM killer is seen in the oom_kill count of this process's memory cgroup, which a local Ray's workers
        share, or else in that of the worker's node (`NodeOomKills`)."""
        import ray

        from engine.memory.room import oom_kills

        if isinstance(e, ray.exceptions.OutOfMemoryError) or "low on memory" in str(e):
            return "Ray's memory monitor"
        seen, kills = self._oom_kills, oom_kills()
        self._oom_kills = kills
        if kills is not None and seen is not None and kills > seen:
            return "the kernel's OOM killer, at this memory cgroup's limit"
        return self._node_kills.killed(spec.node_id, spec.node_ip)

    def _replace(self, worker: int) -> None:
        """A new actor in the dead one's slot, on the same node if it is still there, else anywhere."""
        import ray

        from pipeline.execution.ray_runtime import start_actor

        ray.kill(self._actors[worker], no_restart=True)
        spec = self._specs[worker]
        log.warning("worker %d died; starting a replacement", worker)
        self._actors[worker] = start_actor(spec, self._job, worker, spec.num_cpus, self._rows, spec.node_engines,
                                          soft=True)
        self.replaced += 1

    def close(self) -> None:
        import ray

        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self._leave_ray:
            ray.shutdown()


def _cause(e: BaseException) -> str:
    """The error a Ray exception wraps, in one line."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(e)):
        return one_line_with_type(cause)
    text = str(e).strip().splitlines()
    return " ".join(text[-1:]) if text else type(e).__name__

