"""Work units of a job: a shard is one input file's row range, made of whole row groups where the file's row
groups are small enough, else of row slices. The driver cuts shards from Parquet footers alone; each worker
reads only its shard's row groups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pyarrow as pa

from pipeline.errors import InputError
from pipeline.input.parquet import SUFFIXES, InputFile
from pipeline.storage import open_parquet


@dataclass(frozen=True)
class Shard:
    """Rows [row_start, row_stop) of one input file, written as the output part `part_name`."""

    index: int
    path: str
    part_stem: str  # the file's stem for made ids (`<stem>:<row>`, row counted from the file's start)
    row_start: int
    row_stop: int
    part_name: str

    @property
    def num_rows(self) -> int:
        return self.row_stop - self.row_start

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Shard:
        return cls(**{k: d[k] for k in ("index", "path", "part_stem", "row_start", "row_stop", "part_name")})


def row_group_bounds(path) -> list[int]:
    """Cumulative row counts at each row-group boundary of `path`: [0, n0, n0+n1, ..., num_rows]."""
    with open_parquet(path) as pf:
        bounds = [0]
        for g in range(pf.metadata.num_row_groups):
            bounds.append(bounds[-1] + pf.metadata.row_group(g).num_rows)
    return bounds


def cut_points(bounds: Sequence[int], shard_rows: int) -> list[int]:
    """Shard boundaries for a file with row-group boundaries `bounds`: whole row groups are gathered until a
    shard holds at least `shard_rows`; a row group that alone holds more than `shard_rows` is cut into slices
    of `shard_rows` (the last one may be shorter)."""
    cuts = [0]
    for group_start, stop in zip(bounds, bounds[1:]):
        if stop - group_start > shard_rows:
            if group_start > cuts[-1]:
                cuts.append(group_start)
            cuts += list(range(group_start + shard_rows, stop, shard_rows))
            cuts.append(stop)
        elif stop - cuts[-1] >= shard_rows:
            cuts.append(stop)
    if cuts[-1] != bounds[-1]:
        cuts.append(bounds[-1])
    return cuts


def make_shards(files: Sequence[InputFile], shard_rows: int) -> list[Shard]:
    """Every row of every file in exactly one shard, in file order. A file that is one shard keeps its part
    name `<stem>.parquet`; otherwise parts are `<stem>.rows-<start>-<stop>.parquet`."""
    if shard_rows < 1:
        raise InputError(f"--shard-rows {shard_rows} is invalid: expected a positive number of rows")
    shards: list[Shard] = []
    for f in files:
        bounds = row_group_bounds(f.path) if f.format == "parquet" else [0, f.num_rows]  # a JSONL file: lines
        cuts = cut_points(bounds, shard_rows) if f.num_rows else [0, 0]
        for start, stop in zip(cuts, cuts[1:]):
            whole = start == 0 and stop == f.num_rows
            name = f.part_name if whole else f"{f.part_stem}.rows-{start:09d}-{stop:09d}{SUFFIXES[f.format]}"
            shards.append(Shard(len(shards), str(f.path), f.part_stem, start, stop, name))
    names = [s.part_name for s in shards]
    if len(set(names)) != len(names):
        clash = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"input file names give clashing output parts {clash[:3]}; rename the input files")
    return shards


def read_shard(shard: Shard) -> pa.Table:
    """The shard's rows: only the row groups that overlap it are read, then sliced to its range."""
    try:
        with open_parquet(shard.path) as pf:
            meta = pf.metadata
            groups, first_row, row = [], None, 0
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                if row < shard.row_stop and row + n > shard.row_start:
                    groups.append(g)
                    first_row = row if first_row is None else first_row
                row += n
            if not groups:
                return pf.schema_arrow.empty_table()
            table = pf.read_row_groups(groups)
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"{shard.path}: cannot read rows {shard.row_start}-{shard.row_stop} ({e})") from e
    return table.slice(shard.row_start - first_row, shard.num_rows)
