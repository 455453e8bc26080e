"""Scenarios: the bundled ones and files of instances, read into HELM's instance form, and HELM's choice of
evaluation instances.

A scenario file (JSONL, one object per line, or Parquet) has one instance per row with the columns

- `id`: unique string;
- `input`: the input text;
- `references`: a list of correct answers (strings), or of `{text, tags}` / HELM's `{output: {text}, tags}`,
  the right ones tagged `correct`;
- `split`: `train` (few-shot examples), `valid` or `test` (evaluated);
- `choices` (optional): the options of a multiple-choice question; the references then name the right ones.

An instance becomes HELM's `{"input": {"text"}, "references": [{"output": {"text"}, "tags"}], "split", "id"}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jobs.common import PROJECT_ROOT
from jobs.helm.errors import SpecError

SPLITS = ("train", "valid", "test")
EVAL_SPLITS = ("valid", "test")
CORRECT_TAG = "correct"
REQUIRED_COLUMNS = ("id", "input", "references", "split")
SCENARIO_DIR = PROJECT_ROOT / "examples" / "helm" / "scenarios"
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class BuiltinScenario:
    """A scenario bundled with flexbatch (made by scripts/make_helm_scenarios.py from the demo model's tasks)."""

    name: str
    description: str
    chance: float  # accuracy of a uniform guess among the possible answers

    @property
    def path(self) -> Path:
        return SCENARIO_DIR / f"{self.name}.jsonl"


BUILTIN = {s.name: s for s in (
    BuiltinScenario("addition", "Two-digit addition ('What is 55 plus 56?'), pairs held out of the demo model's "
                    "training", 1 / 179),
    BuiltinScenario("facts", "Facts of an invented table ('Where is the city of Torwyn?'), asked in a phrasing "
                    "held out of the demo model's training", 1 / 8),
    BuiltinScenario("compare", "The larger or smaller of two two-digit numbers, pairs held out of the demo "
                    "model's training; the two numbers are the choices", 1 / 2),
)}


def resolve_scenario(value, base: Path) -> str:
    """A built-in scenario's name as is, or a scenario file's absolute path (relative to `base`)."""
    if not isinstance(value, str) or not value:
        raise SpecError(f"scenario={value!r} is invalid: expected a built-in scenario name "
                        f"({', '.join(sorted(BUILTIN))}) or a .jsonl / .parquet file of instances")
    if value in BUILTIN:
        return value
    path = (base / value).expanduser()
    if path.suffix in FILE_SUFFIXES and path.is_file():
        return str(path.resolve())
    if path.suffix in FILE_SUFFIXES:
        raise SpecError(f"scenario file {path} does not exist; give a path relative to the spec file's folder")
    raise SpecError(f"unknown scenario {value!r}; built-in scenarios: {', '.join(sorted(BUILTIN))}; "
                    f"or give a file of instances ({', '.join(FILE_SUFFIXES)})")


def scenario_path(scenario: str) -> Path:
    return BUILTIN[scenario].path if scenario in BUILTIN else Path(scenario)


def load_instances(scenario: str, answers: bool = True) -> list[dict]:
    """The instances of a built-in scenario or a scenario file, checked, in file order. With `answers` false (the
    documents of language modelling), an evaluated instance needs no correct reference."""
    path = scenario_path(scenario)
    instances = [_instance(row, f"{path} {where}", answers) for where, row in _read_rows(path)]
    ids = [inst["id"] for inst in instances]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SpecError(f"{path}: instance id {dup!r} occurs more than once; ids must be unique")
    if not any(inst["split"] in EVAL_SPLITS for inst in instances):
        raise SpecError(f"{path}: no instance has split valid or test; mark the instances to evaluate as test")
    return instances


def _read_rows(path: Path) -> list[tuple[str, dict]]:
    """(where, row) of each instance: `row N` of a Parquet file (from 0), `line N` of a JSONL file (from 1)."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:
            raise SpecError(f"cannot read scenario file {path} ({type(e).__name__}: {str(e).splitlines()[0]}); "
                            "expected Parquet with one instance per row") from e
        _check_columns(path, table.column_names, "column")
        return [(f"row {i}", row) for i, row in enumerate(table.to_pylist())]
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read scenario file {path} ({type(e).__name__}); expected JSONL (one JSON object "
                        "per line) or Parquet") from e
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise SpecError(f"{path} line {n} is not JSON ({str(e).splitlines()[0]}); expected JSONL, one JSON "
                            "object per line") from e
        if not isinstance(row, dict):
            raise SpecError(f"{path} line {n} is not a JSON object; expected one instance per line")
        _check_columns(path, list(row), f"field on line {n}:")
        rows.append((f"line {n}", row))
    return rows


def _check_columns(path: Path, columns: list[str], what: str) -> None:
    for name in REQUIRED_COLUMNS:
        if name not in columns:
            raise SpecError(f"{path}: missing {what} {name!r} (it has {sorted(columns)}); every instance needs "
                            f"{', '.join(REQUIRED_COLUMNS)}")


def _instance(row: dict, where: str, answers: bool = True) -> dict:
    if not isinstance(row["id"], (str, int)) or row["id"] == "":
        raise SpecError(f"{where}: id {row['id']!r} is invalid; expected a non-empty string")
    if not isinstance(row["input"], str):
        raise SpecError(f"{where} (id {row['id']!r}): input {row['input']!r} is invalid; expected a string")
    if row["split"] not in SPLITS:
        raise SpecError(f"{where} (id {row['id']!r}): split {row['split']!r} is invalid; expected one of "
                        f"{', '.join(SPLITS)}")
    references = _references(row["references"], f"{where} (id {row['id']!r})")
    choices = row.get("choices")
    if choices is not None:
        references = _choice_references(choices, references, f"{where} (id {row['id']!r})")
    if answers and row["split"] in EVAL_SPLITS and not any(CORRECT_TAG in r["tags"] for r in references):
        raise SpecError(f"{where} (id {row['id']!r}): no reference is tagged {CORRECT_TAG!r}; an evaluated "
                        "instance needs at least one right answer")
    return {"input": {"text": row["input"]}, "references": references, "split": row["split"], "id": str(row["id"])}


def _references(value, where: str) -> list[dict]:
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{where}: references {value!r} is invalid; expected a list of answers")
    out = []
    for ref in value:
        if isinstance(ref, str):
            out.append({"output": {"text": ref}, "tags": [CORRECT_TAG]})
        elif isinstance(ref, dict) and isinstance(ref.get("output"), dict):
            out.append({"output": {"text": str(ref["output"].get("text", ""))}, "tags": list(ref.get("tags") or [])})
        elif isinstance(ref, dict) and isinstance(ref.get("text"), str):
            out.append({"output": {"text": ref["text"]}, "tags": list(ref.get("tags") or [])})
        else:
            raise SpecError(f"{where}: reference {ref!r} is invalid; expected a string or {{text, tags}}")
    return out


def _choice_references(choices, references: list[dict], where: str) -> list[dict]:
    """One reference per choice, in order, tagged correct when a correct reference names it."""
    if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices) or len(choices) < 2:
        raise SpecError(f"{where}: choices {choices!r} is invalid; expected a list of at least two strings")
    right = {r["output"]["text"] for r in references if CORRECT_TAG in r["tags"]}
    unknown = sorted(right - set(choices))
    if unknown:
        raise SpecError(f"{where}: correct answer {unknown[0]!r} is not one of the choices {list(choices)}")
    return [{"output": {"text": c}, "tags": [CORRECT_TAG] if c in right else []} for c in choices]


def downsample_eval(instances: list[dict], max_eval_instances: int | None, eval_splits: tuple[str, ...]) -> list[dict]:
    """All train instances, then at most `max_eval_instances` evaluation instances, in the order drawn: HELM's
    `downsample_eval_instances`, so that a run evaluates the instances HELM's run of the same scenario does."""
    from helm.benchmark.runner import downsample_eval_instances

    from jobs.helm.helm_objects import kept_random_state, to_instance

    train = [inst for inst in instances if inst["split"] == "train"]
    evals = [inst for inst in instances if inst["split"] in eval_splits]
    if max_eval_instances is None:
        return train + evals
    ours = train + evals
    helm = [to_instance(inst) for inst in ours]
    with kept_random_state():
        picked = downsample_eval_instances(helm, max_eval_instances, list(eval_splits))
    index = {id(h): i for i, h in enumerate(helm)}  # HELM's Instance compares by identity
    return [ours[index[id(h)]] for h in picked]
