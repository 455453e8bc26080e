"""Serialization, prompts, few-shot prefixes and answer parsing of the data-wrangling tasks (no model)."""

from __future__ import annotations

import pytest

from jobs.wrangle.data import Example, WrangleInputError, serialize_row
from jobs.wrangle.tasks import (
    Template,
    get_template,
    normalize,
    parse_answer,
    parse_value,
    parse_yes_no,
    read_prefix,
    render,
    sample_shots,
    shots_prefix,
)

LAMP = (("title", "Zorsa Kelcor ZO-679 Desk Lamp Red"),)
LISTING = (("title", "zorsa kelcor zo-679 desk"),)
CITY = (("name", "Kelcor Grill"), ("city", "Torwyn"))
PRODUCT = (("title", "Zorsa Kelcor ZO-679 Desk Lamp Red"), ("brand", "Zorsa"), ("code", "ZO-123"))


def match(i: int, a=LAMP, b=LISTING, gold=True) -> Example:
    return Example(f"train:{i}", (a, b), gold)


def test_serialize_attr_and_values():
    assert serialize_row(CITY) == "name: Kelcor Grill. city: Torwyn"
    assert serialize_row(CITY, style="values") == "Kelcor Grill Torwyn"
    assert serialize_row((("a", "nan"),)) == "a: nan"


def test_entity_matching_prompts():
    example = match(0)
    assert render(example, get_template("entity_matching", "paper")) == (
        "Product A is title: Zorsa Kelcor ZO-679 Desk Lamp Red. Product B is title: zorsa kelcor zo-679 desk. "
        "Are Product A and Product B the same?")
    assert render(example, get_template("entity_matching", "demo")) == (
        "Product A: Zorsa Kelcor ZO-679 Desk Lamp Red. Product B: zorsa kelcor zo-679 desk. Same?")


def test_imputation_prompts():
    example = Example("test:0", (CITY,), "Yarish")
    assert render(example, get_template("data_imputation", "paper"), "country") == (
        "name: Kelcor Grill. city: Torwyn. What is the country?")
    assert render(example, get_template("data_imputation", "demo"), "country") == (
        "Q: Where is the city of Torwyn? A:")


def test_error_detection_prompts():
    example = Example("test:0", (PRODUCT,), True, cell=("code", "ZO-123"))
    assert render(example, get_template("error_detection", "paper")) == (
        "title: Zorsa Kelcor ZO-679 Desk Lamp Red. brand: Zorsa. code: ZO-123\n\nIs there an error in code: ZO-123?")
    assert render(example, get_template("error_detection", "demo")) == (
        "Product A: Zorsa Kelcor ZO-679 Desk Lamp Red. Product B: ZO-123. Same?")


def test_template_naming_a_missing_column_is_a_clear_error():
    example = Example("test:3", ((("name", "Kelcor Grill"),),), "Yarish")
    with pytest.raises(WrangleInputError, match=r"needs the field \{city\}, which example test:3 lacks.*--template"):
        render(example, get_template("data_imputation", "demo"), "country")


def test_unknown_template_and_bad_answers():
    with pytest.raises(WrangleInputError, match="--template 'fancy' is unknown for entity_matching: expected one "
                                                "of paper, demo"):
        get_template("entity_matching", "fancy")
    with pytest.raises(WrangleInputError, match="two different single words"):
        Template("entity_matching", "x", "{A} {B}", positive="yes", negative="Yes")


@pytest.mark.parametrize(("completion", "expected"), [
    (" Yes", True), (" no.", False), ("YES!", True), (" No, they differ", False), (" Noas Portab", None),
    (" Maybe", None), ("", None), (None, None),
])
def test_parse_yes_no(completion, expected):
    assert parse_yes_no(completion, get_template("entity_matching", "paper")) is expected


def test_parse_yes_no_with_a_template_whose_positive_word_is_no():
    demo = get_template("error_detection", "demo")  # "Same? No" = the cell disagrees with its row: an error
    assert parse_yes_no(" No", demo) is True and parse_yes_no(" Yes", demo) is False


@pytest.mark.parametrize(("completion", "expected"), [
    (" Yarish", "Yarish"), (" A: Yarish", "Yarish"), ("Answer: New York.", "New York."), ("", None), (" \n", None),
    (" A:", None), (None, None),
])
def test_parse_value(completion, expected):
    assert parse_value(completion) == expected
    assert parse_answer(completion, get_template("data_imputation", "paper")) == expected


def test_normalize():
    assert normalize("  New   York. ") == "new york"
    assert normalize('"Yarish"') == "yarish"
    assert normalize(None) == ""


def test_shots_prefix_is_one_line_per_shot_with_its_answer():
    demo = get_template("entity_matching", "demo")
    prefix = shots_prefix([match(0), match(1, gold=False)], demo, None)
    line = "Product A: Zorsa Kelcor ZO-679 Desk Lamp Red. Product B: zorsa kelcor zo-679 desk. Same?"
    assert prefix == f"{line} Yes\n{line} No\n"


def _train(n: int) -> list[Example]:
    return [match(i, b=((("title", f"listing {i}"),)), gold=i % 2 == 0) for i in range(n)]


def test_few_shot_sampling_is_deterministic_for_a_seed():
    demo = get_template("entity_matching", "demo")
    train = _train(20)
    first = sample_shots(train, 4, 7, demo, None, set())
    assert [e.id for e in first] == [e.id for e in sample_shots(train, 4, 7, demo, None, set())]
    assert len({e.id for e in first}) == 4
    others = {tuple(e.id for e in sample_shots(train, 4, seed, demo, None, set())) for seed in range(5)}
    assert len(others) > 1


def test_few_shot_never_takes_an_evaluated_row():
    demo = get_template("entity_matching", "demo")
    train = _train(6)
    excluded = {render(train[1], demo), render(train[4], demo)}  # rows of the evaluated split
    for seed in range(20):
        shots = sample_shots(train, 4, seed, demo, None, excluded)
        assert {e.id for e in shots} == {"train:0", "train:2", "train:3", "train:5"}
    with pytest.raises(WrangleInputError, match="--k-shot 5 exceeds the 4 train examples.*--k-shot 4 or fewer"):
        sample_shots(train, 5, 0, demo, None, excluded)


def test_read_prefix(tmp_path):
    (tmp_path / "p.txt").write_text("Q: Where is the city of Torwyn? A: Yarish")
    assert read_prefix(tmp_path / "p.txt") == "Q: Where is the city of Torwyn? A: Yarish\n"
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(WrangleInputError, match="empty"):
        read_prefix(tmp_path / "empty.txt")
    with pytest.raises(WrangleInputError, match="cannot be read"):
        read_prefix(tmp_path / "missing.txt")
