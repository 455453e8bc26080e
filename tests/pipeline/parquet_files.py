"""Small helpers that write Parquet inputs for the pipeline and CLI tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet(path: Path, **columns) -> Path:
    """Write `columns` (name -> list or pyarrow array) to `path` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def write_corrupt(path: Path) -> Path:
    """A file named *.parquet whose footer is garbage."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1" + b"\x00not parquet at all\x00" * 8)
    return path


def write_unsupported_model(folder: Path) -> Path:
    """A checkpoint folder whose config.json names an architecture flexbatch does not run."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": 64}')
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def read_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()
