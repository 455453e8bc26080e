"""The one table printer of the benchmarks: columns of padded cells under a header, or a Markdown table, with free
lines above, below and between the rows (the benchmark's set-up, its verdicts, a note under a group of rows).
Cells arrive as text: each benchmark says how its figures read; `num` and `pct` are the common readings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """A column: its title, the width its cells are padded to (0: as they are), alignment ('<' left, '>' right),
    and the spaces before it (the first column has none)."""

    title: str
    width: int = 0
    align: str = ">"
    gap: int = 1

    def __post_init__(self):
        if self.align not in ("<", ">"):
            raise ValueError(f"Column {self.title!r}: align={self.align!r}; use '<' (left) or '>' (right)")
        if self.width < 0 or self.gap < 0:
            raise ValueError(f"Column {self.title!r}: width={self.width}, gap={self.gap}; both must be >= 0")

    def cell(self, text: str, first: bool) -> str:
        return ("" if first else " " * self.gap) + f"{text:{self.align}{self.width}}"


def _line(columns: Sequence[Column], cells: Sequence[str]) -> str:
    return "".join(c.cell(str(t), i == 0) for i, (c, t) in enumerate(zip(columns, cells))).rstrip()


def format_table(columns: Sequence[Column], rows: Iterable[Sequence[str] | str], *, markdown: bool = False,
                 above: Iterable[str] = (), below: Iterable[str] = ()) -> str:
    """The lines above, the header, one line per row, the lines below. A row is its cells (a short row leaves the
    last columns out) or a str, printed as it is (a note between rows). Markdown: `| a | b |` under a `|---|`
    rule, cells unpadded."""
    out = list(above)
    if markdown:
        out += ["| " + " | ".join(c.title for c in columns) + " |", "|" + "---|" * len(columns)]
        out += [r if isinstance(r, str) else "| " + " | ".join(map(str, r)) + " |" for r in rows]
    else:
        out.append(_line(columns, [c.title for c in columns]))
        out += [r if isinstance(r, str) else _line(columns, r) for r in rows]
    return "\n".join(out + list(below))


def num(x: float | None, spec: str = ".3f") -> str:
    """x in `spec`; '-' where there is no figure."""
    return "-" if x is None else format(x, spec)


def pct(x: float | None) -> str:
    """A change as a signed percentage (0.05 -> '+5.0%'); '-' where there is no figure."""
    return "-" if x is None else f"{100 * x:+.1f}%"
