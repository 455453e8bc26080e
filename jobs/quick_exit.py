"""Leaving the process without the interpreter's teardown.

When `flexbatch` is done, a normal exit tears the interpreter down: every module and object is finalized and
the libraries' own destructors run. With torch loaded that alone takes 0.35 s (a process that only imports
torch, measured on 2 cores), and 0.5-0.8 s after a `flexbatch run` of 128 rows (110M Llama, int8 weights): a
tenth of such a job's whole process. `quick_exit` does what matters to anything outside the process and then
ends it: it waits for the threads a normal exit waits for, runs the `atexit` handlers (logging's flush, Ray's
shutdown, multiprocessing's and temporary folders' clean-up), flushes stdout and stderr, and calls `os._exit`.
Every file the commands write is closed where it is written (`with` blocks, atomic renames), so nothing is left
for the finalizers to flush."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


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
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader went away
            pass
    os._exit(status)
