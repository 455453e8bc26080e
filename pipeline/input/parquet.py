"""Parquet in: find the input files, check their schemas from the footer alone, and name the output part each
becomes (the parts themselves: pipeline/output/parts.py)."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from engine.errors import one_line
from pipeline.errors import InputError
from pipeline.input.ids import check_unique_ids
from pipeline.input.scoring import CONTINUATION_COLUMN
from pipeline.output.parts import OUTPUT_COLUMNS
from pipeline.storage import is_uri, list_parquet, open_parquet, stem

MESSAGES_COLUMN = "messages"  # a chat row's conversation: a list of {role, content} (Ray Data LLM's name)
CHAT_CHOICES = ("auto", "on", "off")
FORMAT_CHOICES = ("auto", "parquet", "openai")  # openai: OpenAI Batch JSONL (pipeline/input/openai_batch.py)
SUFFIXES = {"parquet": ".parquet", "openai": ".jsonl"}
_GLOB_CHARS = ("*", "?", "[")


@dataclass(frozen=True)
class InputFile:
    """One input file, checked, and the name of the output part it becomes."""

    path: Path | str  # a local path, or a URI of a pyarrow filesystem
    part_name: str
    num_rows: int
    columns: tuple[str, ...]
    format: str = "parquet"  # or "openai": an OpenAI Batch JSONL file, one request per non-blank line
    chat_rows: int = 0  # openai: lines that are chat requests

    @property
    def part_stem(self) -> str:
        return self.part_name.removesuffix(SUFFIXES[self.format])


def input_format(spec: str | os.PathLike, format: str) -> str:
    """"parquet" or "openai": as given, or for "auto" from the input's extension (`.jsonl` is a batch file)."""
    if format != "auto":
        return format
    return "openai" if str(spec).rstrip("/").endswith(SUFFIXES["openai"]) else "parquet"


def resolve_inputs(spec: str | os.PathLike, suffix: str = ".parquet") -> list[Path | str]:
    """The input files named by `spec`: one file, every `*<suffix>` in a folder, or a glob (local paths only);
    sorted, absolute; URIs of pyarrow filesystems (s3://...) stay URIs."""
    if is_uri(spec):
        return list_parquet(str(spec), suffix)
    text = os.path.expanduser(str(spec))
    path = Path(text)
    if path.is_file():
        return [path.resolve()]
    if path.is_dir():
        found = [p for p in path.iterdir() if p.suffix == suffix and p.is_file() and _visible(p.name)]
        if not found:
            raise InputError(f"no input files matched: folder {path} holds no *{suffix} files")
        return sorted(p.resolve() for p in found)
    if not any(c in text for c in _GLOB_CHARS):
        raise InputError(f"no input files matched: {text} does not exist; expected a Parquet file, a folder or a glob")
    found = [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file() and _visible(Path(p).name)]
    if not found:
        raise InputError(f"no input files matched the glob {text}; check the pattern (quote it in the shell)")
    return sorted(p.resolve() for p in found)


def _visible(name: str) -> bool:
    """Files starting with '.' or '_' are metadata or temporaries by convention (Spark, Hive, our own)."""
    return not name.startswith((".", "_"))


def part_names(paths: Sequence[Path], suffix: str = ".parquet") -> list[str]:
    """The output part name of each input, unique and sorting (as strings) in input order, so that a folder's
    parts read in name order give the rows in input order. `<stem><suffix>` where the stems already do so (a
    file cut into shards adds `.rows-<start>-<stop>` after its stem, which must sort in place too); else every
    name is numbered in input order, `<i>-<stem><suffix>`, `i` zero-padded to one width."""
    stems = [stem(p) for p in paths]
    if all(_sorts_before(a, b) for a, b in zip(stems, stems[1:])):
        return [f"{s}{suffix}" for s in stems]
    width = len(str(len(stems) - 1))
    return [f"{i:0{width}d}-{s}{suffix}" for i, s in enumerate(stems)]


def _sorts_before(a: str, b: str) -> bool:
    """Whether every part name of stem `a` (`a.` + anything) sorts before every one of stem `b`: true when
    `a.` < `b.` and neither is a prefix of the other (then the first differing character decides)."""
    a, b = a + ".", b + "."
    return a < b and not b.startswith(a)


def inspect_inputs(paths: Sequence[Path], prompt_column: str, score: bool = False) -> list[InputFile]:
    """Read each file's footer and check it has the prompt column (`messages` for chat rows), no output column and
    no column name twice (and, for a scoring job, that a `continuation` column holds strings); then read the `id`
    columns (no other data) and check that no two rows share an id."""
    files = []
    for path, name in zip(paths, part_names(paths)):
        schema, num_rows = read_footer(path)
        columns = tuple(schema.names)
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:
            raise InputError(f"{path}: column names {twice} appear more than once; rename or drop the copies (a "
                             "column is read by its name)")
        if prompt_column not in columns:
            fix = ("give it a messages column of {role, content} lists, or pass --chat off"
                   if prompt_column == MESSAGES_COLUMN else "pass --prompt-column with one of them")
            raise InputError(f"{path}: no prompt column {prompt_column!r}; its columns are {list(columns)}; {fix}")
        kind = schema.field(prompt_column).type
        if prompt_column != MESSAGES_COLUMN and not _holds_text(kind):
            raise InputError(f"{path}: prompt column {prompt_column!r} holds {kind}, not strings; cast it to string "
                             f"or pass --prompt-column with the column of prompts")
        if score and CONTINUATION_COLUMN in columns and not _holds_text(schema.field(CONTINUATION_COLUMN).type):
            raise InputError(f"{path}: column {CONTINUATION_COLUMN!r} holds {schema.field(CONTINUATION_COLUMN).type}, "
                             "not strings; cast it to string (null where a row scores its prompt alone)")
        clash = [c for c in OUTPUT_COLUMNS if c in columns]
        if clash:
            raise InputError(f"{path}: input columns {clash} would be overwritten by the output; rename or drop them")
        files.append(InputFile(path=path, part_name=name, num_rows=num_rows, columns=columns))
    check_unique_ids(files)
    return files


def _holds_text(kind: pa.DataType) -> bool:
    """Strings (of any width or encoding in Arrow), or a column that is null throughout (every row then fails)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind) or (
        hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind))


def uses_chat(paths: Sequence[Path], chat: str) -> bool:
    """Whether rows are conversations: `chat="on"`, or "auto" and every file has a `messages` column."""
    if chat != "auto":
        return chat == "on"
    has = [MESSAGES_COLUMN in read_footer(p)[0].names for p in paths]
    if any(has) and not all(has):
        some = [str(p) for p, h in zip(paths, has) if not h][:2]
        raise InputError(f"some input files have a {MESSAGES_COLUMN!r} column and others ({', '.join(some)}) do not; "
                         "pass --chat on or --chat off to say how every row is read")
    return bool(has) and all(has)


def read_footer(path: Path) -> tuple[pa.Schema, int]:
    """Schema and row count from the Parquet footer; any failure becomes an `InputError` naming the file."""
    try:
        with open_parquet(path) as pf:
            return pf.schema_arrow, pf.metadata.num_rows
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"{path}: not a readable Parquet file ({one_line(e)})") from e

