"""Text that is not UTF-8, found value by value so that it fails its own row and no other. Arrow's string type
promises UTF-8 but a Parquet reader does not check it, so a file may hold other bytes (Latin-1, cut multi-byte
characters); reading such a column into Python raises for the whole column, which would fail every row of its
shard. A batch file's line is decoded alone for the same reason. Nothing is ever replaced silently: a value that
is not UTF-8 comes back as `NotUtf8`, which its row turns into an error naming the column or line."""

from __future__ import annotations

import codecs
from dataclasses import dataclass

import pyarrow as pa

BOM = codecs.BOM_UTF8


@dataclass(frozen=True)
class NotUtf8:
    """A value whose bytes are not UTF-8: the bytes of a string value (None inside a nested value), and where
    decoding stopped."""

    raw: bytes | None
    reason: str

    def problem(self, where: str) -> str:
        """`where` (e.g. "prompt column 'prompt'") holds bytes that are not UTF-8: the row's error."""
        return f"{where} holds bytes that are not UTF-8 in this row ({self.reason}); write the text as UTF-8"


def decode(raw: bytes) -> str | NotUtf8:
    """`raw` as text, or NotUtf8 where it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return NotUtf8(raw, _reason(e))


def column_values(table: pa.Table, name: str) -> list:
    """The column's values as Python objects, a `NotUtf8` in each row whose strings are not UTF-8."""
    column = table.column(name)
    try:
        return column.to_pylist()
    except UnicodeDecodeError:  # only then row by row: the whole column at once is much faster
        return [_value(scalar) for chunk in column.chunks for scalar in chunk]


def _value(scalar: pa.Scalar):
    try:
        return scalar.as_py()
    except UnicodeDecodeError as e:
        return NotUtf8(_raw(scalar), _reason(e))


def _raw(scalar: pa.Scalar) -> bytes | None:
    """The bytes of a string scalar; None for a nested value (the bad bytes are somewhere inside)."""
    try:
        return scalar.as_buffer().to_pybytes() if pa.types.is_string(scalar.type) or pa.types.is_large_string(
            scalar.type) else None
    except (AttributeError, pa.ArrowException):
        return None


def _reason(e: UnicodeDecodeError) -> str:
    return f"{e.reason}: byte 0x{e.object[e.start]:02x} at offset {e.start}"
