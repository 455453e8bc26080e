"""Parquet in, Parquet out: reading and checking inputs, running a job, committing output parts."""

from pipeline.driver import run_job
from pipeline.runner import JobSummary, RunConfig, prepare_job

__all__ = ["JobSummary", "RunConfig", "prepare_job", "run_job"]
