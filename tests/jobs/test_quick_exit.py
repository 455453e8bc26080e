"""The `flexbatch` console script leaves without the interpreter's teardown, but only after what a normal exit does
for others: threads joined, atexit handlers run, buffered output flushed, the exit status kept."""

import subprocess
import sys

import pytest

from jobs.quick_exit import exit_status

CHILD = """
import atexit, sys, threading, time
from jobs.quick_exit import quick_exit
atexit.register(lambda: print("atexit ran", flush=False))
threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread done\\n"))).start()
sys.stdout.write("buffered, not flushed\\n")
sys.stderr.write("to stderr\\n")
quick_exit(CODE)
"""


@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (None, 0), ("'fatal: bad'", 1)])
def test_quick_exit_keeps_output_handlers_threads_and_the_status(code, status):
    res = subprocess.run([sys.executable, "-c", CHILD.replace("CODE", str(code))], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == status
    assert res.stdout.splitlines() == ["buffered, not flushed", "thread done", "atexit ran"]
    assert res.stderr.splitlines() == ["to stderr"] + (["fatal: bad"] if status == 1 else [])


def test_exit_status_reads_codes_as_system_exit_does(capsys):
    assert (exit_status(None), exit_status(0), exit_status(2)) == (0, 0, 2)
    assert exit_status("no such file") == 1 and capsys.readouterr().err == "no such file\n"


def test_the_console_script_exits_with_the_commands_status():
    res = subprocess.run([sys.executable, "-m", "jobs.cli", "no-such-command"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "No such command 'no-such-command'" in res.stderr
    res = subprocess.run([sys.executable, "-m", "jobs.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("Usage: flexbatch")


IDLE_POOL = """
from concurrent.futures import ThreadPoolExecutor
from jobs.quick_exit import quick_exit
pool = ThreadPoolExecutor(max_workers=1)
pool.submit(print, "task ran").result()
kept = [pool]  # still referenced, as a failed shard's traceback keeps an engine's prefetch pool
quick_exit(4)
"""


def test_an_idle_thread_pool_that_is_still_referenced_does_not_hold_the_exit():
    res = subprocess.run([sys.executable, "-c", IDLE_POOL], capture_output=True, text=True, timeout=60)
    assert res.returncode == 4 and res.stdout == "task ran\n"


PAST_ITS_LIMIT = """
import time
from engine.loop.compile_jobs import CompileJobs
from jobs.quick_exit import quick_exit
jobs = CompileJobs(lambda key: time.sleep(60) or "compiled", 0.1, lambda s: "too slow", wait_factor=2)
print(jobs.wait(jobs.submit(("regex", "slow"))), flush=True)
quick_exit(5)
"""


def test_a_compile_past_its_limit_does_not_hold_the_exit():
    """A constraint whose compile ran past its limit (its thread left running) ends with the process: before, the
    exit waited for the compile (218 s for a schema of 8 strings of maxLength 8192)."""
    res = subprocess.run([sys.executable, "-c", PAST_ITS_LIMIT], capture_output=True, text=True, timeout=30)
    assert res.returncode == 5 and res.stdout == "too slow\n"
