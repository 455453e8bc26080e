"""multiple_choice_joint requests answer one of their letters, enforced while decoding (on by default): the
demo model, which never saw the lettered format, then names a choice in every row."""

import json
from pathlib import Path

from jobs.helm.adapter import adapt
from jobs.helm.execute import read_completions, request_rows, run_requests
from jobs.helm.run_entries import AdapterSpec
from pipeline.plan.settings import EngineSettings

REPO = Path(__file__).resolve().parents[3]
MC = AdapterSpec(method="multiple_choice_joint", input_prefix="", output_prefix="Answer: ", max_train_instances=1,
                 num_outputs=1, temperature=0, max_tokens=2, stop_sequences=("\n",))


def _inst(i, text, answer, split, choices):
    refs = [{"output": {"text": c}, "tags": ["correct"] if c == answer else []} for c in choices]
    return {"input": {"text": text}, "references": refs, "split": split, "id": f"{split}{i}"}


def _states():
    train = _inst(0, "Which is larger, 3 or 9?", "9", "train", ["3", "9"])
    tests = [_inst(i, f"Which is larger, {a} or {b}?", str(max(a, b)), "test", [str(a), str(b), "7"])
             for i, (a, b) in enumerate([(8, 2), (15, 40), (61, 60)])]
    return adapt(MC, [train, *tests], "demo")


def test_multiple_choice_rows_carry_their_letters_and_others_none():
    rows = request_rows(_states())
    assert all(json.loads(r["guided"]) == {"choice": [" A", " B", " C", "A", "B", "C"]} for r in rows)
    assert all(r["guided"] is None for r in request_rows(_states(), constrain=False))
    free = adapt(AdapterSpec(max_train_instances=0, max_tokens=2), [_inst(0, "x", "1", "test", ["1"])], "demo")
    assert request_rows(free)[0]["guided"] is None


def test_constrained_answers_are_letters(tmp_path):
    states = _states()
    engine = EngineSettings(dtype="float32", use_ray=False)
    summary = run_requests(tmp_path, states, REPO / "examples" / "demo-model", engine)
    texts = [row["completion"] for row in read_completions(summary).values()]
    assert len(texts) == 3 and all(t.strip() in ("A", "B", "C") for t in texts), texts
