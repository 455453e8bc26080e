"""Parquet in and out: find the input files, check their schemas from the footer alone, read them, and write one
output part per input file atomically (temporary name in the same folder, fsync, rename)."""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from engine.request import Completion
from pipeline.errors import InputError
from pipeline.input.ids import ID_COLUMN, check_unique_ids
from pipeline.input.scoring import CONTINUATION_COLUMN, SCORE_COLUMNS
from pipeline.storage import Folder, is_uri, list_parquet, open_parquet, stem

log = logging.getLogger(__name__)

MESSAGES_COLUMN = "messages"  # a chat row's conversation: a list of {role, content} (Ray Data LLM's name)
CHAT_CHOICES = ("auto", "on", "off")
FORMAT_CHOICES = ("auto", "parquet", "openai")  # openai: OpenAI Batch JSONL (pipeline/input/openai_batch.py)
SUFFIXES = {"parquet": ".parquet", "openai": ".jsonl"}
# Columns the job appends; an input that already has one of them would be silently clobbered.
OUTPUT_COLUMNS = ("completion", "prompt_tokens", "completion_tokens", "finish_reason", "error", "logprobs",
                  "token_ids", *SCORE_COLUMNS)
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
        raise InputError(f"{path}: not a readable Parquet file ({_one_line(e)})") from e


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def output_table(table: pa.Table, completions: Sequence[Completion], ids: Sequence[str], logprobs: bool,
                 scores: dict[str, pa.Array] | None = None) -> pa.Table:
    """The input table plus the completion columns, row for row, and `scores` (a scoring job's columns,
    pipeline/input/scoring.py) after them. The `id` column holds `ids` as strings: it replaces an input `id`
    column in place (filling its nulls with made ids) or becomes the first column."""
    if not len(completions) == len(ids) == table.num_rows:
        raise RuntimeError(f"{len(completions)} completions and {len(ids)} ids for {table.num_rows} input rows")
    id_array = pa.array(ids, pa.string())
    if ID_COLUMN in table.column_names:
        out = table.set_column(table.column_names.index(ID_COLUMN), ID_COLUMN, id_array)
    else:
        out = table.add_column(0, ID_COLUMN, id_array)
    columns = {
        "completion": pa.array([c.text for c in completions], pa.string()),
        "prompt_tokens": pa.array([c.prompt_tokens for c in completions], pa.int32()),
        "completion_tokens": pa.array([c.completion_tokens for c in completions], pa.int32()),
        "finish_reason": pa.array([c.finish_reason for c in completions], pa.string()),
        "error": pa.array([c.error for c in completions], pa.string()),
    }
    if logprobs:  # the ids let a reader name each scored token (HELM's `tokens`)
        columns["logprobs"] = pa.array([c.logprobs for c in completions], pa.list_(pa.float32()))
        columns["token_ids"] = pa.array([c.token_ids if c.logprobs is not None else None for c in completions],
                                        pa.list_(pa.int32()))
    columns.update(scores or {})
    for name, values in columns.items():
        out = out.append_column(name, values)
    return out


def write_part_atomic(table: pa.Table, folder: Folder, name: str) -> tuple[int, str]:
    """Write `folder/name` so that readers see either the old file or the whole new one, never a partial one;
    returns the part's size in bytes and its SHA-256."""
    size, sha256 = folder.write_table(name, table)
    log.info("wrote %s (%d rows)", folder.child(name), table.num_rows)
    return size, sha256
