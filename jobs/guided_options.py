"""The job-wide answer constraint options (--choice, --regex, --json-schema; declared in pipeline/job.py) of the
commands that complete rows, and the engine `Guided` they make. A row's own `guided` column (or a Batch line's
response_format) takes precedence over them."""

from __future__ import annotations

import json
from pathlib import Path

from engine.guided import Guided
from jobs.engine_options import declared_options
from pipeline.errors import ConfigError
from pipeline.job import GUIDED


def guided_options(fn):
    """Add --choice, --regex and --json-schema to a click command (its function takes choice, regex, json_schema)."""
    return declared_options(*GUIDED.values())(fn)


def guided_from_options(choice: tuple[str, ...], regex: str | None, json_schema: Path | None) -> Guided | None:
    """The job's constraint from the options (None without one); a ConfigError for two at once or a schema file
    that is not JSON."""
    values = {"choice": choice, "regex": regex, "json_schema": json_schema}
    given = [GUIDED[name].flag.name for name, v in values.items() if v]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} both constrain the answer; give one of them")
    if choice:
        return Guided(choice=tuple(choice))
    if regex is not None:
        return Guided(regex=regex)
    if json_schema is None:
        return None
    try:
        schema = json.loads(Path(json_schema).read_text())
    except (OSError, ValueError) as e:  # a folder too
        raise ConfigError(f"--json-schema {json_schema}: not a readable JSON file ({e}); give a file holding one "
                          "JSON schema object") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"--json-schema {json_schema} holds a JSON {type(schema).__name__}; give a schema object "
                          'such as {"type": "object", "properties": {...}}')
    return Guided(json_schema=schema)
