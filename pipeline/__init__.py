"""Parquet in, Parquet out: reading and checking inputs, running a job, committing output parts."""

from pipeline.runner import JobSummary, RunConfig, plan_job, run_job

__all__ = ["JobSummary", "RunConfig", "plan_job", "run_job"]
