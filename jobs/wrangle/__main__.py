"""`python -m jobs.wrangle`: the same as `flexbatch wrangle`."""

from jobs.wrangle.command import wrangle_command

wrangle_command(prog_name="python -m jobs.wrangle")
