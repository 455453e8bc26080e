"""`flexbatch submit`: run `flexbatch run` as a job on a Ray cluster, through the job server of its head node.

The project folder is uploaded as the job's working directory and the job's entrypoint is
`python -m jobs.run <run options>`; the rest of the job's runtime environment comes from a YAML file
(infra/runtime_env.yaml by default). Ray is imported only when the command runs, so `flexbatch --help` stays fast.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import click

from engine.errors import one_line
from jobs.common import PROJECT_ROOT, fail

JOB_FAILED_EXIT = 1
INTERRUPTED_EXIT = 130
DEFAULT_RUNTIME_ENV = PROJECT_ROOT / "infra" / "runtime_env.yaml"
# gitignore-style patterns, relative to the project root; Ray also honours the project's .gitignore.
UPLOAD_EXCLUDES = ["/.venv", "/.git", "/out", "/build", "__pycache__", "*.egg-info", ".pytest_cache",
                   ".ruff_cache", "*.tmp"]
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
PROBE_TIMEOUT_S = 10
POLL_S = 1.0

TOKEN_FIX = ("export RAY_AUTH_MODE=token and give this machine the head's token (`ray get-auth-token` on the head "
             "prints it): in ~/.ray/auth_token, or in RAY_AUTH_TOKEN, or in a file named by RAY_AUTH_TOKEN_PATH")


class SubmitError(Exception):
    """A user error of `flexbatch submit`: its message names the bad value and the fix, on one line."""


@click.command("submit", short_help="Run `flexbatch run` as a job on a Ray cluster and follow its logs.")
@click.option("--address", required=True, metavar="URL",
              help="The job server (dashboard) of the cluster's head node, e.g. http://HEAD:8265.")
@click.option("--runtime-env", "runtime_env_file", type=click.Path(path_type=Path), default=None,
              help="YAML file with the job's runtime environment (env_vars, ...); working_dir is set by this "
                   "command.  [default: infra/runtime_env.yaml in the project]")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow the job's logs until it ends (exit 0 if it succeeded, 1 if not); --no-wait returns "
                   "once the job is submitted.")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED, metavar="-- RUN_OPTIONS...")
def submit_command(address: str, runtime_env_file: Path | None, wait: bool, run_args: tuple[str, ...]) -> None:
    """Submit `flexbatch run RUN_OPTIONS` to the Ray cluster at --address and follow it.

    The project folder (without .venv, .git, out/ and caches) is uploaded as the job's working directory and
    the job runs `python -m jobs.run RUN_OPTIONS` on the head node: the driver there, one engine actor per
    worker. Relative paths in RUN_OPTIONS are read in that uploaded copy (examples/prompts.parquet works);
    --output must be where every node can write: a shared file system, or an object store URI (s3://...).
    Python packages are not installed per job: the nodes already have flexbatch's dependencies
    (infra/cluster.yaml, the image of infra/Dockerfile).

    \b
    Examples:
      flexbatch submit --address http://127.0.0.1:8265 -- \\
          --input examples/prompts.parquet --output /tmp/flexbatch-out --max-new-tokens 8
      flexbatch submit --address http://HEAD:8265 --no-wait -- \\
          --input s3://bucket/prompts/ --output s3://bucket/out/run1 --model /shared/models/llama-2-7b

    \b
    Token authentication (on in infra/cluster.yaml and scripts/local_cluster.sh):
    the cluster refuses requests without its token, so this machine needs it too:
      export RAY_AUTH_MODE=token
      mkdir -p ~/.ray && echo TOKEN > ~/.ray/auth_token
    where TOKEN is what `ray get-auth-token` prints on the head node
    (or export RAY_AUTH_TOKEN=TOKEN, or RAY_AUTH_TOKEN_PATH=FILE holding it).
    The `ray job logs / status / stop` commands printed after submitting need the same.

    Exit codes: 0 the job succeeded (or was submitted, with --no-wait), 1 it failed or was stopped,
    2 bad options or the cluster cannot be reached.
    """
    try:
        with _quiet_ray_logs():
            client, entrypoint, runtime_env = _prepare(address, runtime_env_file, run_args)
            job_id = _submit(client, address, entrypoint, runtime_env)
    except SubmitError as e:
        fail(one_line(e))
    _print_job_commands(job_id, address)
    if not wait:
        return
    try:
        with _quiet_ray_logs():
            status = _follow(client, job_id)
    except KeyboardInterrupt:
        click.echo(f"\nstopped following; job {job_id} keeps running "
                   f"(stop it with: {_ray_job_command('stop', job_id, address)})", err=True)
        sys.exit(INTERRUPTED_EXIT)
    click.echo(f"job {job_id}: {status}")
    sys.exit(0 if status == "SUCCEEDED" else JOB_FAILED_EXIT)


def _prepare(address: str, runtime_env_file: Path | None, run_args: tuple[str, ...]):
    """Check everything that can be checked here, then connect: (client, entrypoint, runtime_env)."""
    address = _check_address(address)
    _check_run_args(run_args)
    runtime_env = load_runtime_env(runtime_env_file or DEFAULT_RUNTIME_ENV)
    client = _connect(address)
    return client, entrypoint_for(run_args), runtime_env


def entrypoint_for(run_args: tuple[str, ...] | list[str]) -> str:
    """The job's shell command: `flexbatch run` as a module, with each option quoted for the shell."""
    return shlex.join(["python", "-m", "jobs.run", *run_args])


def _check_address(address: str) -> str:
    address = address.strip().rstrip("/")
    if not address.startswith(("http://", "https://")):
        raise SubmitError(f"--address {address!r} is not a job server URL; expected the head node's dashboard "
                          f"address, e.g. --address http://HEAD:8265")
    return address


def _check_run_args(run_args: tuple[str, ...]) -> None:
    """Parse the run options with `flexbatch run`'s own parser, so a typo fails here and not on the cluster."""
    if not run_args:
        raise SubmitError("no `flexbatch run` options given; put them after --, e.g. flexbatch submit --address "
                          "http://HEAD:8265 -- --input prompts.parquet --output /shared/out")
    from jobs.run_cmd import run  # here, not at the top: it imports the pipeline

    try:
        run.make_context("flexbatch run", list(run_args))
    except click.ClickException as e:
        raise SubmitError(f"the `flexbatch run` options after -- are wrong: {e.format_message()}") from e


def load_runtime_env(path: Path) -> dict:
    """The job's runtime_env: the YAML mapping at `path`, plus the project folder as working_dir (uploaded
    without UPLOAD_EXCLUDES and the file's own `excludes`)."""
    import yaml

    if not (PROJECT_ROOT / "pyproject.toml").is_file():
        raise SubmitError(f"flexbatch submit uploads the project folder, but {PROJECT_ROOT} has no pyproject.toml; "
                          f"run it from a source checkout installed with `pip install -e .`")
    try:
        env = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SubmitError(f"--runtime-env {path}: cannot read it as YAML ({' '.join(str(e).split())})") from e
    if not isinstance(env, dict):
        raise SubmitError(f"--runtime-env {path}: expected a mapping (env_vars: ..., excludes: ...), "
                          f"got a {type(env).__name__}")
    if "working_dir" in env:
        raise SubmitError(f"--runtime-env {path} sets working_dir; remove it: flexbatch submit uploads the "
                          f"project folder {PROJECT_ROOT} as the working directory")
    env["working_dir"] = str(PROJECT_ROOT)
    env["excludes"] = UPLOAD_EXCLUDES + [x for x in env.get("excludes") or [] if x not in UPLOAD_EXCLUDES]
    return env


def _connect(address: str):
    """A JobSubmissionClient for `address`, or a SubmitError naming the address and the fix."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    _probe(address)
    try:
        with _without_env("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):  # they would override --address
            return JobSubmissionClient(address)
    except AuthenticationError as e:
        raise _auth_error(address, e) from e
    except (ConnectionError, RuntimeError) as e:
        raise SubmitError(f"cannot use the Ray job server at {address} ({one_line(e)}); check that --address is "
                          f"the head node's dashboard (port 8265) and that the cluster is up (`ray status`)") from e


def _probe(address: str) -> None:
    """Fail fast, with a timeout, when nothing answers at `address` (the Ray client would wait minutes)."""
    import requests

    try:
        requests.get(f"{address}/api/version", timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as e:
        raise SubmitError(f"cannot reach the Ray job server at {address} ({type(e).__name__}); start the cluster "
                          f"(ray up infra/cluster.yaml, or scripts/local_cluster.sh up) or pass its head node's "
                          f"dashboard address, e.g. --address http://HEAD:8265 (for a remote head with the dashboard "
                          f"on 127.0.0.1, forward the port first: ray dashboard infra/cluster.yaml)") from e


def _auth_error(address: str, e: Exception) -> SubmitError:
    refused = "Authentication failed" in str(e)
    what = "refused this machine's token" if refused else "requires a token that this machine did not send"
    return SubmitError(f"the Ray cluster at {address} {what}; {TOKEN_FIX}")


def _submit(client, address: str, entrypoint: str, runtime_env: dict) -> str:
    from ray.exceptions import AuthenticationError

    try:
        return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
    except AuthenticationError as e:
        raise _auth_error(address, e) from e
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise SubmitError(f"the Ray job server at {address} refused the job ({one_line(e)})") from e


def _print_job_commands(job_id: str, address: str) -> None:
    click.echo(f"submitted job {job_id} to {address} (working directory: {PROJECT_ROOT}, uploaded)")
    click.echo(f"  logs:   {_ray_job_command('logs', job_id, address)} --follow")
    click.echo(f"  status: {_ray_job_command('status', job_id, address)}")
    click.echo(f"  stop:   {_ray_job_command('stop', job_id, address)}")


def _ray_job_command(verb: str, job_id: str, address: str) -> str:
    """A `ray job ...` command to paste; it needs the token mode too when this process ran with it."""
    prefix = "RAY_AUTH_MODE=token " if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else ""
    return f"{prefix}ray job {verb} {job_id} --address {shlex.quote(address)}"


def _follow(client, job_id: str) -> str:
    """Print the job's logs as they come until it ends; return its final status (SUCCEEDED, FAILED, STOPPED)."""
    import asyncio

    printer = _LogPrinter()
    try:
        asyncio.run(_tail(client, job_id, printer))
    except (RuntimeError, OSError) as e:  # the log stream broke: poll instead
        click.echo(f"(log stream lost: {one_line(e)}; polling the job instead)", err=True)
        return _poll(client, job_id, printer)
    return _wait_terminal(client, job_id)


class _LogPrinter:
    """Echoes log text and counts it, so that polling can go on where the stream stopped."""

    def __init__(self) -> None:
        self.chars = 0

    def write(self, text: str) -> None:
        click.echo(text, nl=False)
        self.chars += len(text)


async def _tail(client, job_id: str, printer: _LogPrinter) -> None:
    async for chunk in client.tail_job_logs(job_id):
        printer.write(chunk)


def _poll(client, job_id: str, printer: _LogPrinter) -> str:
    """Follow by polling: print what the logs gained since the last look, until the job ends."""
    while True:
        status = str(client.get_job_status(job_id).value)
        printer.write(client.get_job_logs(job_id)[printer.chars:])
        if status in TERMINAL_STATES:
            return status
        time.sleep(POLL_S)


def _wait_terminal(client, job_id: str, timeout_s: float = 30.0) -> str:
    """The job's final status; the log stream can close a moment before the status is written."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = str(client.get_job_status(job_id).value)
        if status in TERMINAL_STATES or time.monotonic() > deadline:
            return status
        time.sleep(POLL_S / 4)


@contextmanager
def _quiet_ray_logs():
    """Hide Ray's client-side INFO and WARNING lines (each file the upload skips, each directory it excludes
    by default, the log stream closing); errors still show, and this command says what it did."""
    import ray  # noqa: F401  (importing ray gives the "ray" logger its handler)

    handlers = logging.getLogger("ray").handlers
    levels = [h.level for h in handlers]
    for h in handlers:
        h.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for h, level in zip(handlers, levels):
            h.setLevel(level)


@contextmanager
def _without_env(*names: str):
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)



if __name__ == "__main__":
    submit_command(prog_name="python -m jobs.submit")
