"""flexbatch's Python API. `flexbatch.run(...)` runs a durable, resumable job, exactly what `flexbatch run` runs;
`flexbatch.ray.Processor` is a stage for an existing Ray Data pipeline (`ds.map_batches(...)`)."""

from flexbatch.api import run, run_config

__all__ = ["run", "run_config"]
