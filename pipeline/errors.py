"""User-facing errors of the pipeline. Each message names the bad value, what was expected, and the fix."""

from engine.errors import ConfigError, FlexbatchError

__all__ = ["ConfigError", "InputError", "OutputFolderError", "OutputWriteError"]


class InputError(FlexbatchError):
    """An input path matches no Parquet file, a file cannot be read, or its schema lacks what the job needs."""


class OutputFolderError(FlexbatchError):
    """The output folder holds files of another job or files that flexbatch did not write."""


class OutputWriteError(OutputFolderError):
    """The output's filesystem is full or read-only: no shard can be written there until that is fixed."""
