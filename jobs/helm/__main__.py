"""`python -m jobs.helm`: the same as `flexbatch helm`."""

from jobs.helm.command import helm_command

helm_command(prog_name="python -m jobs.helm")
