"""A benchmark line in a process of its own (`flexbatch bench workloads`).

Two engines in one process slow each other: CTranslate2 brings its own OpenMP runtime (a second libgomp beside
torch's), whose threads compete with torch's. Measured on W2 (64 x 64, generate 64, 2 threads, 2 cores): flexbatch
int8 alone 966-972 tokens/s, 621 with a CTranslate2 generator loaded and run in the same process; CTranslate2 int8
alone 867, 798-801 beside flexbatch. So each line loads in a spawned process (a fresh interpreter: nothing
inherited from the benchmark's), reports the memory its load and a first run (2 tokens) added, and then runs the
generations the benchmark asks for, one at a time. The benchmark still interleaves the lines round by round, and
only one line runs at any moment; the others wait on their pipe.

Every line's process has the C heap policy the engine sets for itself (`engine.memory.heap.choose_heap`): set before the
line loads, so CTranslate2's lines get it too. With glibc's default its W2 int8 run faulted 43 million pages and
made 231 tokens/s rather than 618; the whole-process lines (jobs/bench/whole_process.py) run it as users do."""

from __future__ import annotations

import multiprocessing
import traceback

from jobs.bench import models as bm
from jobs.bench.runs import timed

START_SECONDS = 600  # a line's load and first run; a generation has no limit (the parent waits for it)


def loaded(make):
    """Build a runner with `make()` and run it once (2 tokens): it and the memory that took (peak RSS growth)."""
    bm.reset_peak_rss()
    rss0 = bm.rss_bytes()
    fn = make()
    fn(2)
    return fn, bm.peak_rss_bytes() - rss0


def serve(conn, make, args: tuple, threads: int) -> None:
    """The line's process: load with make(*args), then time a generation of each gen_len received, until None."""
    import torch

    from engine.memory.heap import choose_heap
    from engine.memory.room import memory_room

    try:
        torch.set_num_threads(threads)
        choose_heap(memory_room())
        fn, added = loaded(lambda: make(*args))
        conn.send(("ready", added))
        while (gen_len := conn.recv()) is not None:
            conn.send(("ran", timed(fn, gen_len)))
    except BaseException as e:  # noqa: BLE001 - the parent shows it, with the line's name
        conn.send(("failed", "".join(traceback.format_exception(e))))


class LineProcess:
    """One line, loaded by make(*args) (a module-level function returning a runner: gen_len -> tokens) in a
    spawned process with `threads` torch threads. `run(gen_len)` is `runs.timed`'s result, measured in there."""

    def __init__(self, name: str, make, *args, threads: int):
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, make, args, threads), daemon=True)
        self.proc.start()
        child.close()
        self.added_rss_bytes = self.reply(START_SECONDS)

    def reply(self, timeout: float | None = None):
        if timeout is not None and not self.conn.poll(timeout):
            self.close()
            raise RuntimeError(f"line {self.name!r}: its process did not load within {timeout:.0f} s")
        try:
            kind, value = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"line {self.name!r}: its process died (exit code {self.proc.exitcode})") from None
        if kind == "failed":
            self.close()
            raise RuntimeError(f"line {self.name!r} failed in its process:\n{value}")
        return value

    def run(self, gen_len: int) -> dict:
        self.conn.send(gen_len)
        return self.reply()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self.conn.close()
