"""Writes the bundled HELM-style scenarios under examples/helm/scenarios/, from the demo model's task generator.

    python scripts/make_helm_scenarios.py [--out examples/helm/scenarios]

Each scenario is a JSONL file of instances: `id`, `input` (the question, without the `Q: ` / ` A:` that the
adapter's prefixes add), `references` (`text` and `tags`, the right answer tagged `correct`), `split`
(`train` or `test`) and, for `compare`, `choices`. The test instances are the demo model's held-out instances
(`build_tasks(0)`, the seed the model was trained with), so none occurs in its training text; the train
instances (for few-shot prompts) are drawn from the training distribution, and never equal a test instance:

- `addition`: the 100 held-out two-digit sums; 20 train sums of other pairs.
- `compare`: the 100 held-out larger/smaller questions; 20 train questions of other pairs.
- `facts`: 4 facts per relation are train instances, asked in one of their training phrasings; the other 132
  facts are test instances, asked in their held-out phrasing (no test fact is stated in a few-shot example).

The output is deterministic: rerunning the script rewrites the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402

MODEL_SEED = 0  # the seed examples/demo-model was trained with: its held-out instances are the test split
TRAIN_SEED = 1000
TRAIN_PER_TASK = 20
FACTS_TRAIN_PER_RELATION = 4
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "examples" / "helm" / "scenarios"


def question(prompt: str) -> str:
    """'Q: What is 55 plus 56? A:' -> 'What is 55 plus 56?' (the adapter adds the prefixes back)."""
    assert prompt.startswith("Q: ") and prompt.endswith(" A:"), prompt
    return prompt[len("Q: "):-len(" A:")]


def instance(task: str, split: str, index: int, prompt: str, answer: str, instance_id: str | None = None) -> dict:
    return {"id": instance_id or f"{task}-{split}-{index:04d}", "input": question(prompt),
            "references": [{"text": answer, "tags": ["correct"]}], "split": split}


def numbers_task(tasks: demo_corpus.Tasks, task: str, rng: random.Random) -> list[dict]:
    """The held-out test instances of `task` and TRAIN_PER_TASK distinct training ones."""
    test = [instance(task, "test", 0, row["input"], row["references"][0], row["id"]) for row in tasks.held_out[task]]
    seen = {row["input"] for row in test}
    train = []
    while len(train) < TRAIN_PER_TASK:
        prompt, answer = tasks.example(rng, task)
        if question(prompt) not in seen:
            seen.add(question(prompt))
            train.append(instance(task, "train", len(train), prompt, answer))
    return train + test


def with_choices(row: dict) -> dict:
    """A compare question lists its two numbers as the choices (for method: multiple_choice_joint)."""
    numbers = row["input"].rstrip("?").split(", ")[1].split(" or ")
    return {**row, "choices": numbers}


def facts_task(tasks: demo_corpus.Tasks, rng: random.Random) -> list[dict]:
    """Train: FACTS_TRAIN_PER_RELATION facts per relation in a training phrasing; test: every other fact in its
    held-out phrasing, with the id it has in examples/demo-data/facts.jsonl."""
    held_out = iter(tasks.held_out["facts"])
    train, test = [], []
    for rel in tasks.relations:
        chosen = set(rng.sample(range(len(rel.facts)), FACTS_TRAIN_PER_RELATION))
        for i, (entity, value) in enumerate(rel.facts):
            row = next(held_out)
            if i in chosen:
                template = rng.choice([t for k, t in enumerate(rel.questions) if k != rel.held_out[i]])
                train.append(instance("facts", "train", len(train), template.format(e=entity), value))
            else:
                test.append(instance("facts", "test", 0, row["input"], row["references"][0], row["id"]))
    return train + test


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    tasks = demo_corpus.build_tasks(MODEL_SEED)
    rng = random.Random(TRAIN_SEED)
    scenarios = {
        "addition": numbers_task(tasks, "addition", rng),
        "compare": [with_choices(row) for row in numbers_task(tasks, "compare", rng)],
        "facts": facts_task(tasks, rng),
    }
    for name, rows in scenarios.items():
        write_jsonl(args.out / f"{name}.jsonl", rows)
        splits = {s: sum(r["split"] == s for r in rows) for s in ("train", "test")}
        print(f"{args.out / (name + '.jsonl')}: {splits['train']} train, {splits['test']} test")


if __name__ == "__main__":
    main()
