"""The job-wide answer constraint options (--choice, --regex, --json-schema), declared once for the commands that
complete rows, and the engine `Guided` they make. A row's own `guided` column (or a Batch line's
response_format) takes precedence over them."""

from __future__ import annotations

import json
from pathlib import Path

import click

from engine.guided import Guided
from pipeline.errors import ConfigError

_HOW = ("Enforced while decoding (xgrammar): only tokens that keep the answer valid are chosen, and the row ends "
        "when the answer is complete (or at --max-new-tokens, cut short). A row's guided column overrides it.")


def guided_options(fn):
    """Add --choice, --regex and --json-schema to a click command (its function takes choice, regex, json_schema)."""
    options = [
        click.option("--choice", "choice", multiple=True, metavar="TEXT",
                     help="The answer is exactly one of these strings; repeatable, e.g. --choice ' Yes' --choice "
                          "' No' (mind the leading space most prompts want). " + _HOW),
        click.option("--regex", default=None, metavar="REGEX",
                     help="The answer matches this regular expression in full, e.g. ' [0-9]{1,4}'."),
        click.option("--json-schema", "json_schema", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     metavar="FILE", help="The answer is JSON that validates against the JSON schema in FILE "
                     "(compact: one line, ', ' and ': ' separators; a string's maxLength becomes a pattern).  "
                     "[default: no constraint; per-row column guided: {\"choice\": [...]}, {\"regex\": ...}, "
                     "{\"json_schema\": ...}, {\"json_object\": true} or {\"grammar\": ...}, as a struct or JSON "
                     "text]"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def guided_from_options(choice: tuple[str, ...], regex: str | None, json_schema: Path | None) -> Guided | None:
    """The job's constraint from the options (None without one); a ConfigError for two at once or a schema file
    that is not JSON."""
    given = [name for name, v in (("--choice", choice), ("--regex", regex), ("--json-schema", json_schema)) if v]
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
    except (OSError, ValueError) as e:
        raise ConfigError(f"--json-schema {json_schema}: not a readable JSON file ({e}); give a file holding one "
                          "JSON schema object") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"--json-schema {json_schema} holds a JSON {type(schema).__name__}; give a schema object "
                          'such as {"type": "object", "properties": {...}}')
    return Guided(json_schema=schema)
