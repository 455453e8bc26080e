"""Few-shot prompts as fm_data_tasks builds them (`data_utils.read_data`, `prompt_utils`, `run_inference`).

- The train split is class-balanced on request (each class cut to the smallest class's count, each class drawn
  with pandas' `sample(random_state=42)`), then always shuffled with `sample(frac=1, random_state=42)`.
- `random`: k train rows drawn as pandas' `train.sample(k)` draws them after `np.random.seed(seed + trial)`
  (numpy's legacy generator: `permutation(n)[:k]`), joined as `text + answer` stripped, blank-line separated.
- `manual`: the paper's hand-written prefix of the dataset (PREFIXES in its constants.py), for some datasets
  chosen by a column of the row (Hospital by the checked column's name).
- The query is `(prefix + "\\n" + text).strip()`; `--add-task-instruction` puts the dataset's instruction and a
  space before it.

The paper's code draws the random prefix once and reuses it in every trial; here trial t draws with seed + t,
so trial 0 is the paper's prompt and `--num-trials` gives different draws.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np

from jobs.wrangle.data import WrangleInputError
from jobs.wrangle.datasets import Dataset
from jobs.wrangle.paper_rows import PaperRow

SAMPLE_METHODS = ("random", "manual", "validation_clusters")
_SHUFFLE_STATE = 42  # read_data's fixed random_state


def _draw(n: int, k: int, state: int) -> list[int]:
    """The positions pandas' `sample(k)` picks from n rows with numpy's legacy generator seeded `state`."""
    return [int(i) for i in np.random.RandomState(state).permutation(n)[:k]]


def prepare_train(train: list[PaperRow], dataset: Dataset, class_balanced: bool) -> list[PaperRow]:
    """The train rows in the order the paper samples from (read_data)."""
    if class_balanced and dataset.class_column is not None:
        classes: dict[object, list[PaperRow]] = {}
        for row in train:
            if str(row.label) != "nan":  # groupby drops missing labels
                classes.setdefault(row.label, []).append(row)
        smallest = min(len(rows) for rows in classes.values())
        train = [rows[i] for _, rows in sorted(classes.items(), key=lambda kv: kv[0])
                 for i in _draw(len(rows), smallest, _SHUFFLE_STATE)]
    return [train[i] for i in _draw(len(train), len(train), _SHUFFLE_STATE)]


def random_prefix(train: list[PaperRow], k: int, seed: int) -> str:
    if k > len(train):
        raise WrangleInputError(f"--k {k} exceeds the {len(train)} train rows to draw from (after "
                                f"--class-balanced, if given); pass --k {len(train)} or fewer")
    shots = [train[i] for i in _draw(len(train), k, seed)]
    return "\n\n".join((r.text + r.label_str).strip() for r in shots) + "\n"


def load_manual_prompts(path: Path) -> dict[str, str | dict[str, str]]:
    """The paper's manual prefixes by dataset name: from its `fm_data_tasks/utils/constants.py` (the PREFIXES
    literal is parsed, never run) or from a JSON file {dataset: prefix or {key: prefix}}."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WrangleInputError(f"--manual-prompts {path} cannot be read ({e}); pass fm_data_tasks' "
                                f"fm_data_tasks/utils/constants.py or a JSON file") from None
    if path.suffix == ".json":
        try:
            prompts = json.loads(text)
        except ValueError as e:
            raise WrangleInputError(f"--manual-prompts {path} is not valid JSON ({e}); fix the file") from None
        if not isinstance(prompts, dict):
            raise WrangleInputError(f"--manual-prompts {path} holds a JSON {type(prompts).__name__}; expected an "
                                    f"object {{dataset: prompt or {{key: prompt}}}}")
        return prompts
    return _prefixes_from_python(text, path)


def _prefixes_from_python(text: str, path: Path) -> dict[str, str | dict[str, str]]:
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise WrangleInputError(f"--manual-prompts {path} is not Python ({e}); pass the paper's constants.py") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PREFIXES" for t in node.targets):
            if not isinstance(node.value, ast.Dict):
                break
            return {_dataset_key(k, path): _literal(v, path) for k, v in zip(node.value.keys, node.value.values)}
    raise WrangleInputError(f"--manual-prompts {path} has no PREFIXES = {{...}} literal; pass fm_data_tasks' "
                            f"fm_data_tasks/utils/constants.py")


def _literal(node: ast.expr, path: Path):
    """A PREFIXES value as written: a string or a dict of strings. One that is computed (`"..." * 2`, a name, a
    call) is refused, since the file is read, never run."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        shown = " ".join(ast.unparse(node).split())
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise WrangleInputError(f"--manual-prompts {path} line {node.lineno}: the PREFIXES value {shown} is computed, "
                                f"not a literal (the file is read, never run); write it as a string or a dict of "
                                f"strings, or pass a JSON file {{dataset: prompt or {{key: prompt}}}}") from None


def _dataset_key(node: ast.expr, path: Path) -> str:
    """f"{DATASET_PATH}/entity_matching/structured/Beer" -> "Beer"."""
    if isinstance(node, ast.JoinedStr):
        tail = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    elif isinstance(node, ast.Constant):
        tail = str(node.value)
    else:
        raise WrangleInputError(f"--manual-prompts {path}: a PREFIXES key is not a path string; pass the "
                                f"paper's constants.py")
    return tail.rstrip("/").rsplit("/", 1)[-1]


def manual_prefix(prompts: dict, dataset: Dataset, row: PaperRow) -> str:
    """The paper's manual prefix for a row (get_manual_prompt)."""
    if dataset.name not in prompts:
        raise WrangleInputError(f"--manual-prompts has no prompt for {dataset.name}; pass the paper's constants.py")
    entry = prompts[dataset.name]
    if dataset.manual_key is None:
        if not isinstance(entry, str):
            raise WrangleInputError(f"--manual-prompts: {dataset.name}'s prompt is not one string; fix the file")
        return entry
    if not isinstance(entry, dict) or row.key not in entry:
        raise WrangleInputError(f"--manual-prompts has no {dataset.name} prompt for {dataset.manual_key} = "
                                f"{row.key!r} (the paper's prompts are chosen by that column); add one")
    return entry[row.key]


def query(prefix: str, row: PaperRow, instruction: str | None) -> str:
    """What the model receives for one row."""
    text = (prefix + "\n" + row.text).strip()
    return f"{instruction} {text}" if instruction is not None else text
