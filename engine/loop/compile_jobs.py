"""Compiling constraints on background threads, each within a time limit.

xgrammar releases the GIL while it compiles, so a compile runs beside the rows being decoded; but it cannot be
interrupted. So each constraint compiles on a daemon thread (at most WORKERS at a time), its limit counted in the
CPU time of that thread from when it takes the constraint (xgrammar compiles on the calling thread): another
process busy on the same cores slows the compile but does not use up its limit, and a compile that gets no CPU
(a machine loaded far past its cores) is cut off by the clock at `wait_factor` times the limit, so nothing
waits without end. A row that waits past the limit fails naming it, its thread is left to finish alone (its
result dropped) and a fresh thread takes its place, and the constraint is remembered as too slow, so that later
calls of this process fail it at once instead of compiling it again.

A compile left running never holds the `flexbatch` command's exit: the command ends without Python's teardown
(jobs/quick_exit.py, `os._exit`), which ends the compile's thread where it is, so it calls `leave_compiles_behind`
first. Only a process that ends through Python's teardown (a program calling `flexbatch.run`) waits for them at
exit: a thread that returns from xgrammar's C++ while Python finalizes aborts the process."""

from __future__ import annotations

import atexit
import hashlib
import logging
import threading
import time
from collections import deque

log = logging.getLogger(__name__)

WORKERS = 2
POLL_S = 0.05  # how often a waiting row reads the compile's CPU time
_RUNNING: set[threading.Thread] = set()  # compile threads inside a compile now
_TOO_SLOW: set[str] = set()  # digests of constraints that ran past their limit in this process
_TOO_SLOW_KEPT = 4096


class Job:
    """One constraint's compile: its result once done (a compiled grammar or the row's error)."""

    def __init__(self, key: tuple[str, str]):
        self.key = key
        self.digest = hashlib.sha256("\x00".join(key).encode()).hexdigest()
        self.started: float | None = None
        self.cpu_clock: int | None = None  # the compiling thread's CPU-time clock, None where there is none
        self.cpu_started = 0.0
        self.abandoned = False
        self.result = None
        self.done = threading.Event()


class CompileJobs:
    """The compiles of one engine call: `submit` queues a constraint, `wait` returns its result (or
    `too_slow(seconds)`'s result past the limit). `compile_one(key)` never raises: it returns the error."""

    def __init__(self, compile_one, seconds: float, too_slow, wait_factor: float = 4.0):
        self.compile_one, self.seconds, self.too_slow = compile_one, seconds, too_slow
        self.wait_factor = wait_factor
        self.jobs: dict[tuple[str, str], Job] = {}
        self._todo: deque[Job] = deque()
        self._alive = 0
        self._lock = threading.Lock()

    def submit(self, key: tuple[str, str]) -> Job:
        if key in self.jobs:
            return self.jobs[key]
        job = self.jobs[key] = Job(key)
        if job.digest in _TOO_SLOW:
            job.result = self.too_slow(self.seconds)
            job.done.set()
            return job
        with self._lock:
            self._todo.append(job)
            spawn = self._alive < WORKERS
            self._alive += spawn
        if spawn:
            _thread(self._work)
        return job

    def wait(self, job: Job, seconds: float | None = None):
        """The job's result; waits at most `seconds` (None: until its limit), then returns None if not done."""
        give_up = None if seconds is None else time.monotonic() + seconds
        while not job.done.is_set():
            now = time.monotonic()
            if give_up is not None and now >= give_up:
                return None
            with self._lock:
                started = job.started
            if started is not None and self._past_limit(job, now - started):
                self._abandon(job)
                break
            left = [give_up - now] if give_up is not None else []
            job.done.wait(min([POLL_S, *left]))
        return job.result

    def _past_limit(self, job: Job, waited: float) -> bool:
        """Whether the running job has had its limit: `seconds` of its thread's CPU time (of the clock where the
        thread has no CPU clock), or `wait_factor` times that by the clock."""
        return waited >= self.seconds * self.wait_factor or cpu_seconds(job, waited) >= self.seconds

    def _abandon(self, job: Job) -> None:
        with self._lock:
            if job.done.is_set():
                return
            job.abandoned, job.result = True, self.too_slow(self.seconds)
            if len(_TOO_SLOW) >= _TOO_SLOW_KEPT:
                _TOO_SLOW.clear()
            _TOO_SLOW.add(job.digest)
            job.done.set()
            spawn = bool(self._todo)  # the stuck thread no longer counts: a fresh one takes the queue
            self._alive += spawn - 1
        if spawn:
            _thread(self._work)

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._todo:
                    self._alive -= 1
                    return
                job = self._todo.popleft()
                job.started = time.monotonic()
                job.cpu_clock, job.cpu_started = _own_cpu_clock(), time.thread_time()
            _RUNNING.add(threading.current_thread())
            try:
                result = self.compile_one(job.key)
            finally:
                _RUNNING.discard(threading.current_thread())
            with self._lock:
                if job.abandoned:  # past its limit: the waiter moved on, and another thread took this one's place
                    return
                job.result = result
                job.done.set()


def cpu_seconds(job: Job, waited: float) -> float:
    """The CPU time the job's thread has spent on it (`waited`, the time by the clock, where it has no clock)."""
    if job.cpu_clock is None:
        return waited
    try:
        return time.clock_gettime(job.cpu_clock) - job.cpu_started
    except OSError:  # the thread has ended: the job is done, or about to be marked so
        return 0.0


def _own_cpu_clock() -> int | None:
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):  # not on this platform
        return None


def _thread(target) -> None:
    threading.Thread(target=target, daemon=True, name="grammar-compile").start()


def leave_compiles_behind() -> None:
    """Let this process exit without waiting for the compiles still running: for a process about to end with
    `os._exit` (no teardown under them)."""
    atexit.unregister(_wait_for_compiles)
    if _RUNNING:
        log.info("leaving %d constraint compile(s) that ran past their limit unfinished", len(_RUNNING))


@atexit.register
def _wait_for_compiles() -> None:
    """Let compiles that are still running end before Python finalizes (each is bounded in size, so in time)."""
    running = list(_RUNNING)
    if running:
        log.warning("waiting for %d constraint compile(s) that ran past their limit before exiting", len(running))
    for t in running:
        t.join()
