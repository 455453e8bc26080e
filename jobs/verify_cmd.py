"""`flexbatch verify --output DIR`: check a finished job's output folder against its own records and its input
(`_job.json` describes the input files, its shards cover their rows once; every shard committed, every part's
size and SHA-256 as the manifest records them, every id exactly once; no file a reader would take for a part
that no shard owns). Exit code 0 when all holds, 1 with one line per problem otherwise, 2 when DIR is no job's
output folder."""

from __future__ import annotations

import sys

import click

from engine.errors import FlexbatchError
from jobs.common import FAILED_SHARDS_EXIT, fail


@click.command("verify", short_help="Check a job's output folder: every input row in exactly one part, once.")
@click.option("--output", required=True, metavar="DIR", help="The --output folder (or URI) of a flexbatch run.")
def verify_command(output: str) -> None:
    """Check a finished job's output against its _job.json, _manifest.jsonl and input files: _job.json's shards
    cover every row of every input file once (row counts read from the files while they are unchanged), each
    shard committed, each part with the size and SHA-256 recorded at its commit and one row per input row, each
    id exactly once (equal to the input's ids where the input files are unchanged), and no other file that a
    reader of the folder would read. Prints the problems and exits 1 if any."""
    from pipeline.output.verify import verify_output

    try:
        report = verify_output(output)
    except FlexbatchError as e:
        fail(e)
    for note in report.notes:
        click.echo(f"note: {note}")
    for problem in report.problems:
        click.echo(f"problem: {problem}")
    verdict = "ok" if report.ok else f"{len(report.problems)} problems"
    click.echo(f"{report.folder}: {report.shards} shards, {report.rows} rows: {verdict}")
    if not report.ok:
        sys.exit(FAILED_SHARDS_EXIT)
