"""The one table printer of the benchmarks: padded columns under their titles, notes between rows, Markdown."""

import pytest

from jobs.bench.table import Column, format_table, num, pct

COLUMNS = (Column("name", 6, "<"), Column("s", 6), Column("note", gap=2))


def test_cells_are_padded_under_their_titles_and_notes_print_as_they_are():
    text = format_table(COLUMNS, [("a", num(1.5), "x"), "  a note", ("bb", num(None))], above=["set-up"],
                        below=["verdict"])
    assert text.splitlines() == ["set-up", "name        s  note", "a       1.500  x", "  a note", "bb          -",
                                 "verdict"]


def test_markdown_table_has_a_rule_under_the_titles():
    text = format_table(COLUMNS, [("a", "1", "x")], markdown=True)
    assert text.splitlines() == ["| name | s | note |", "|---|---|---|", "| a | 1 | x |"]


def test_readings_of_missing_figures_and_changes():
    assert pct(0.05) == "+5.0%" and pct(-0.5) == "-50.0%" and pct(None) == "-"
    assert num(2.0, ".1f") == "2.0"


def test_a_bad_alignment_names_the_column_and_the_fix():
    with pytest.raises(ValueError, match=r"Column 'x': align='\^'; use '<'"):
        Column("x", align="^")
