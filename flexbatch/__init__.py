"""flexbatch's Python API. `flexbatch.run(...)` runs a durable, resumable job, exactly what `flexbatch run` runs;
`flexbatch.ray.Processor` is a stage for an existing Ray Data pipeline (`ds.map_batches(...)`). Every error
caused by the caller's options, input, model or output folder is a `flexbatch.FlexbatchError`."""

from engine.errors import FlexbatchError
from flexbatch.api import run, run_config

__all__ = ["FlexbatchError", "run", "run_config"]
