"""Prompts and answers of the data-wrangling tasks: rows serialized as `attr: value. attr: value` (or values
only; jobs/wrangle/data.py `serialize_row`), a per-task prompt template, a few-shot prefix (k random train
examples for a seed, or a hand-written file), and the parsing of a completion into Yes/No or an imputed value.

A template is a `str.format` pattern. Its fields:

- entity_matching: `{A}`, `{B}`: the two rows, serialized;
- data_imputation: `{row}`: the row without the imputed column, serialized; `{target}`: that column's name;
- error_detection: `{row}`: the whole row, serialized; `{cell}`: `column: value` of the checked cell, also as
  `{column}` and `{value}`;
- for the one-row tasks, each column of the row by its name (e.g. `{city}`).
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

from jobs.wrangle.data import TASKS, Example, WrangleInputError, serialize_row

STYLES = ("attr", "values")
_PUNCTUATION = string.punctuation + " \t"
_ANSWER_LABEL = re.compile(r"^\s*(a|answer)\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class Template:
    """How one task's example becomes a prompt. `style`: "attr" serializes a row as `attr: value. attr:
    value` (the paper's), "values" as its values joined by spaces. `positive`/`negative`: the answer words
    of the positive class (a match, an error) and of the other."""

    task: str
    name: str
    prompt: str
    style: str = "attr"
    positive: str = "Yes"
    negative: str = "No"
    about: str = ""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise WrangleInputError(f"template task {self.task!r} is unknown: expected one of {', '.join(TASKS)}")
        if self.style not in STYLES:
            raise WrangleInputError(f"template {self.name!r} style {self.style!r} is invalid: expected "
                                    f"one of {', '.join(STYLES)}")
        words = (self.positive, self.negative)
        if any(not w or len(w.split()) != 1 for w in words) or self.positive.lower() == self.negative.lower():
            raise WrangleInputError(f"template {self.name!r} answers {words!r} are invalid: expected two "
                                    f"different single words")


TEMPLATES: dict[str, dict[str, Template]] = {
    "entity_matching": {
        "paper": Template("entity_matching", "paper",
                          "Product A is {A}. Product B is {B}. Are Product A and Product B the same?",
                          about="the paper's wording and serialization"),
        "demo": Template("entity_matching", "demo", "Product A: {A}. Product B: {B}. Same?", style="values",
                         about="the demo model's training format: values only, 'Same?'"),
    },
    "data_imputation": {
        "paper": Template("data_imputation", "paper", "{row}. What is the {target}?",
                          about="the paper's wording and serialization"),
        "demo": Template("data_imputation", "demo", "Q: Where is the city of {city}? A:",
                         about="a question the demo model was trained on (phrasing held out per city); "
                               "needs a city column"),
    },
    "error_detection": {
        "paper": Template("error_detection", "paper", "{row}\n\nIs there an error in {cell}?",
                          about="the paper's wording and serialization"),
        "demo": Template("error_detection", "demo", "Product A: {title}. Product B: {value}. Same?",
                         positive="No", negative="Yes",
                         about="the cell matched against the row's title in the demo model's matching format "
                               "('No' = an error); needs a title column"),
    },
}
# Measured with the demo model on the bundled test splits, 0-shot: matching 81.7 % with `demo`, 52.5 % with
# `paper` (chance 50 %); imputation 12/12 with `demo`, 6/12 with `paper` (majority 25 %). Error detection, which
# the model never saw, is at chance either way (`demo` 50.8 %; `paper` draws no Yes/No answer): `demo` it is.
DEFAULT_TEMPLATE = {"entity_matching": "demo", "data_imputation": "demo", "error_detection": "demo"}


def get_template(task: str, name: str | None) -> Template:
    choices = TEMPLATES[task]
    name = name or DEFAULT_TEMPLATE[task]
    if name not in choices:
        raise WrangleInputError(f"--template {name!r} is unknown for {task}: expected one of {', '.join(choices)}")
    return choices[name]


def _fields(example: Example, template: Template, target: str | None) -> dict[str, str]:
    if template.task == "entity_matching":
        a, b = example.rows
        return {"A": serialize_row(a, style=template.style), "B": serialize_row(b, style=template.style)}
    (row,) = example.rows
    fields = {**dict(row), "row": serialize_row(row, style=template.style)}
    if template.task == "data_imputation":
        return {**fields, "target": target or ""}
    column, value = example.cell
    return {**fields, "cell": f"{column}: {value}", "column": column, "value": value}


def render(example: Example, template: Template, target: str | None = None) -> str:
    """The prompt of one example, without a prefix."""
    fields = _fields(example, template, target)
    try:
        return template.prompt.format_map(fields)
    except KeyError as e:
        raise WrangleInputError(
            f"template {template.name!r} of {template.task} needs the field {{{e.args[0]}}}, which example "
            f"{example.id} lacks (it has {sorted(fields)}); pass another --template") from None
    except (IndexError, ValueError) as e:
        raise WrangleInputError(f"template {template.name!r} {template.prompt!r} is malformed ({e}); "
                                f"fix its {{field}} braces") from None


def answer_text(example: Example, template: Template) -> str:
    """The answer a few-shot example shows after its prompt."""
    if isinstance(example.gold, bool):
        return template.positive if example.gold else template.negative
    return example.gold


def sample_shots(train: list[Example], k: int, seed: int, template: Template, target: str | None,
                 excluded: set[str]) -> list[Example]:
    """`k` train examples drawn at random (fixed by `seed`), never one whose prompt is in `excluded` (the
    evaluated rows' prompts), so no evaluated row leaks into the prefix."""
    if k < 0:
        raise WrangleInputError(f"--k-shot {k} is invalid: expected 0 or more examples")
    pool = [e for e in train if render(e, template, target) not in excluded]
    if k > len(pool):
        raise WrangleInputError(f"--k-shot {k} exceeds the {len(pool)} train examples that differ from the "
                                f"evaluated rows; use --k-shot {len(pool)} or fewer")
    return random.Random(seed).sample(pool, k)


def shots_prefix(shots: list[Example], template: Template, target: str | None) -> str:
    """One line per shot, `prompt answer`, as the completions are expected to read."""
    return "".join(f"{render(e, template, target)} {answer_text(e, template)}\n" for e in shots)


def read_prefix(path: Path) -> str:
    """A hand-written few-shot prefix, prepended as it is (a newline is added if it lacks one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WrangleInputError(f"--prefix {path} cannot be read ({e}); pass a UTF-8 text file") from e
    if not text.strip():
        raise WrangleInputError(f"--prefix {path} is empty; write the few-shot examples in it, or use --k-shot")
    return text if text.endswith("\n") else text + "\n"


def parse_yes_no(completion: str | None, template: Template) -> bool | None:
    """True for the template's positive word, False for its negative one (first word, any case,
    punctuation ignored); None for anything else."""
    words = (completion or "").split()
    if not words:
        return None
    first = words[0].strip(_PUNCTUATION).lower()
    if first == template.positive.lower():
        return True
    if first == template.negative.lower():
        return False
    return None


def parse_value(completion: str | None) -> str | None:
    """The imputed value: the completion's first line, stripped, without a leading answer label (`A:`,
    `Answer:`); None when empty."""
    lines = (completion or "").strip().splitlines()
    value = _ANSWER_LABEL.sub("", lines[0]).strip() if lines else ""
    return value or None


def normalize(value: str | None) -> str:
    """Lowercased, surrounding punctuation and inner runs of whitespace removed: what exact match compares."""
    return " ".join((value or "").lower().split()).strip(_PUNCTUATION)


def parse_answer(completion: str | None, template: Template) -> bool | str | None:
    if template.task == "data_imputation":
        return parse_value(completion)
    return parse_yes_no(completion, template)
