"""User-facing errors of the engine. Each message names the bad value, what was expected, and the fix."""


class FlexbatchError(Exception):
    """Base class for errors caused by user input (bad model folder, bad parameters, bad data)."""


class ModelNotFoundError(FlexbatchError):
    """The model folder or one of its required files does not exist."""


class UnsupportedModelError(FlexbatchError):
    """The checkpoint's architecture or one of its settings is not supported."""


class WeightFormatError(FlexbatchError):
    """Weights are missing, not in safetensors format, or do not match config.json."""


class InvalidParamsError(FlexbatchError, ValueError):
    """A generation parameter has a bad value."""


class ConfigError(FlexbatchError, ValueError):
    """A job option has a bad value."""

