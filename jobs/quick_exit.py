"""Leaving the process without the interpreter's teardown.

When `flexbatch` is done, a normal exit tears the interpreter down: every module and object is finalized and
the libraries' own destructors run. With torch loaded that alone is a noticeable share of a small job's whole
process (docs/BENCHMARKS.md, start-up). `quick_exit` does what matters to anything outside the process and then
ends it: it shuts threads down as a normal exit does (the threading module's exit hooks first, which tell idle
`concurrent.futures` workers to leave, then a join of every non-daemon thread; joining first would wait forever
on an idle pool worker that something still references, e.g. a failed shard's traceback), runs the `atexit`
handlers but the wait for constraint compiles that ran past their limit (engine/loop/compile_jobs.py: `os._exit`
ends their threads where they are) (logging's flush, Ray's shutdown, multiprocessing's and temporary folders' clean-up), flushes stdout and
stderr, and calls `os._exit`.
Every file the commands write is closed where it is written (`with` blocks, atomic renames), so nothing is left
for the finalizers to flush."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

from engine.loop.compile_jobs import leave_compiles_behind


def exit_status(code) -> int:
    """SystemExit's meaning of `code`: None is 0, an int is itself, anything else is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def quick_exit(code=0) -> NoReturn:
    """End the process with `code` (as SystemExit reads it), skipping only the interpreter's teardown."""
    status = exit_status(code)
    leave_compiles_behind()  # a compile past its limit ends with the process, not before it
    _shutdown_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader went away
            pass
    os._exit(status)


def _shutdown_threads() -> None:
    """What the interpreter does at exit before the atexit handlers: `threading._shutdown` (its exit hooks, then
    a join of the non-daemon threads); by hand where a Python lacks it."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
        return
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
