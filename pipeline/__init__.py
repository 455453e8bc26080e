"""Parquet in, Parquet out: reading and checking inputs, running a job, committing output parts."""

from pipeline.execution.driver import run_job
from pipeline.job import JobSummary, RunConfig, prepare_job

__all__ = ["JobSummary", "RunConfig", "prepare_job", "run_job"]
