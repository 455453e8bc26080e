"""The spec and scenario files: what a good spec reads as, and the one-line errors of bad ones, before any model
is loaded."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.helm.errors import SpecError
from jobs.helm.run_entries import AdapterSpec, load_spec, with_overrides
from jobs.helm.scenarios import load_instances
from tests.jobs.helm.files import assert_user_error, invoke, write_jsonl, write_spec

REPO = Path(__file__).resolve().parents[3]
DEMO_SPEC = REPO / "examples" / "helm" / "demo.yaml"


def _rows(n_test=3, n_train=2, **extra):
    rows = [{"id": f"t{i}", "input": f"What is {i} plus {i}?", "references": [str(2 * i)], "split": "train"}
            for i in range(n_train)]
    rows += [{"id": f"e{i}", "input": f"What is {i} plus 1?", "references": [str(i + 1)], "split": "test"}
             for i in range(n_test)]
    return [{**r, **extra} for r in rows]


def test_demo_spec_reads_as_three_runs_with_helm_names():
    spec = load_spec(DEMO_SPEC)
    assert [e.run_name for e in spec.entries] == \
        ["addition:model=demo-model", "facts:model=demo-model", "compare:model=demo-model"]
    entry = spec.entries[0]
    assert entry.model == REPO / "examples" / "demo-model"
    assert entry.adapter.stop_sequences == ("\n",) and entry.adapter.output_suffix == "\n"
    assert entry.adapter.temperature == 0 and entry.adapter.num_outputs == 1 and entry.adapter.max_train_instances == 5
    assert entry.metrics[0] == "exact_match"


def test_overrides_apply_to_every_entry_and_name_compression():
    spec = with_overrides(load_spec(DEMO_SPEC), max_eval_instances=7, compress_weight=True, compress_cache=True)
    assert all(e.adapter.max_eval_instances == 7 and e.compress_weight and e.compress_cache for e in spec.entries)
    assert spec.entries[0].run_name == "addition:model=demo-model,compress=weight+cache"


def test_entry_adapter_keys_win_over_defaults(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", [{"scenario": "addition", "adapter": {"max_tokens": 3}}],
                                defaults={"adapter": {"max_tokens": 9, "temperature": 0}}))
    assert spec.entries[0].adapter.max_tokens == 3 and spec.entries[0].adapter.temperature == 0


def test_helm_defaults():
    a = AdapterSpec()
    assert (a.input_prefix, a.output_prefix, a.instance_prefix, a.max_train_instances, a.num_outputs,
            a.temperature, a.max_tokens) == ("Input: ", "Output: ", "\n", 5, 5, 1.0, 100)


@pytest.mark.parametrize("entry, fragments", [
    ({"scenario": "nope"}, ["entries[0]", "unknown scenario 'nope'", "addition, compare, facts"]),
    ({"scenario": "missing.jsonl"}, ["entries[0]", "missing.jsonl does not exist"]),
    ({"scenario": "addition", "metrics": ["exact_match", "bleu_4"]}, ["entries[0]", "unknown metric 'bleu_4'"]),
    ({"scenario": "addition", "adapter": {"max_token": 4}}, ["adapter: unknown field 'max_token'"]),
    ({"scenario": "addition", "adapter": {"max_tokens": 0}}, ["adapter.max_tokens=0 is invalid"]),
    ({"scenario": "addition", "adapter": {"method": "ranking"}}, ["adapter.method='ranking'", "generation"]),
    ({"scenario": "addition", "adapter": {"stop_sequences": "\n"}}, ["adapter.stop_sequences"]),
    ({"scenario": "addition", "adapter": {"eval_splits": ["train"]}}, ["adapter.eval_splits"]),
    ({"scenario": "addition", "scenaro": "x"}, ["unknown field 'scenaro'"]),
    ({"metrics": ["exact_match"]}, ["exactly one of scenario"]),
    ({"scenario": "addition", "model": "no/such/model"}, ["model folder", "no config.json"]),
])
def test_bad_spec_names_the_field(tmp_path, entry, fragments):
    path = write_spec(tmp_path / "s.yaml", [entry])
    with pytest.raises(SpecError) as e:
        load_spec(path)
    for fragment in fragments:
        assert fragment in str(e.value)


def test_two_runs_with_one_name_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"entries\[0\] and entries\[1\] are both run 'addition:model=demo-model'"):
        load_spec(write_spec(tmp_path / "s.yaml", [{"scenario": "addition"}, {"scenario": "addition"}]))


def test_not_yaml(tmp_path):
    (tmp_path / "s.yaml").write_text("entries: [\n")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_spec(tmp_path / "s.yaml")


def test_scenario_files_jsonl_and_parquet_read_alike(tmp_path):
    rows = _rows()
    write_jsonl(tmp_path / "a.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    a, b = load_instances(str(tmp_path / "a.jsonl")), load_instances(str(tmp_path / "a.parquet"))
    assert a == b
    assert a[2] == {"input": {"text": "What is 0 plus 1?"}, "references": [{"output": {"text": "1"},
                    "tags": ["correct"]}], "split": "test", "id": "e0"}


def test_choices_become_references_tagged_correct(tmp_path):
    rows = [{"id": "q", "input": "Which is larger, 3 or 9?", "references": ["9"], "split": "test", "choices": ["3", "9"]}]
    inst = load_instances(str(write_jsonl(tmp_path / "c.jsonl", rows)))[0]
    assert inst["references"] == [{"output": {"text": "3"}, "tags": []}, {"output": {"text": "9"}, "tags": ["correct"]}]


@pytest.mark.parametrize("rows, fragments", [
    ([{k: v for k, v in r.items() if k != "split"} for r in _rows()], ["missing field", "'split'"]),
    ([{k: v for k, v in r.items() if k != "references"} for r in _rows()], ["missing field", "'references'"]),
    (_rows(n_test=0), ["no instance has split valid or test"]),
    ([{**r, "split": "dev"} for r in _rows()], ["split 'dev' is invalid", "train, valid, test"]),
    ([{**r, "references": [{"text": "1", "tags": []}]} for r in _rows()], ["no reference is tagged 'correct'"]),
    ([{**r, "id": "same"} for r in _rows()], ["id 'same' occurs more than once"]),
    ([{**r, "choices": ["7", "8"]} for r in _rows()], ["is not one of the choices"]),
])
def test_bad_scenario_file(tmp_path, rows, fragments):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SpecError) as e:
        load_instances(str(path))
    for fragment in [str(path), *fragments]:
        assert fragment in str(e.value)


def test_parquet_without_a_column(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "input"} for r in _rows()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(SpecError, match="missing column 'input'"):
        load_instances(str(tmp_path / "bad.parquet"))


def test_cli_bad_spec_is_one_line_and_exit_2(tmp_path, no_model_load):
    spec = write_spec(tmp_path / "s.yaml", [{"scenario": "addition", "metrics": ["rouge"]}])
    assert_user_error(invoke("--spec", spec, "--suite", "s", "--output", tmp_path / "out", "--no-ray"),
                      "entries[0]", "unknown metric 'rouge'", "exact_match")


def test_cli_missing_column_fails_before_any_run(tmp_path, no_model_load):
    write_jsonl(tmp_path / "bad.jsonl", [{k: v for k, v in r.items() if k != "split"} for r in _rows()])
    spec = write_spec(tmp_path / "s.yaml", [{"scenario": "addition"}, {"scenario": "bad.jsonl"}])
    result = invoke("--spec", spec, "--suite", "s", "--output", tmp_path / "out", "--no-ray")
    assert_user_error(result, "run bad:model=demo-model", "missing field", "'split'")
    assert not (tmp_path / "out" / "runs" / "s" / "addition:model=demo-model").exists()


def test_cli_no_train_split_for_few_shot(tmp_path, no_model_load):
    write_jsonl(tmp_path / "only_test.jsonl", _rows(n_train=0))
    spec = write_spec(tmp_path / "s.yaml", [{"scenario": "only_test.jsonl"}])
    assert_user_error(invoke("--spec", spec, "--suite", "s", "--output", tmp_path / "out", "--no-ray"),
                      "max_train_instances=5", "no instance of split train", "max_train_instances: 0")


@pytest.mark.parametrize("args, fragment", [
    (["--suite", "a/b"], "--suite 'a/b' is invalid"),
    (["--suite", "s", "--spec", "nope.yaml"], "--spec nope.yaml: no such file"),
    (["--suite", "s"], "give --spec FILE"),
    (["--suite", "s", "--scenario-state", "nope.json"], "--scenario-state nope.json: no such file"),
])
def test_cli_bad_options(tmp_path, no_model_load, args, fragment):
    if "--spec" not in args and "give --spec FILE" not in fragment and "--scenario-state" not in args:
        args = [*args, "--spec", str(DEMO_SPEC)]
    assert_user_error(invoke(*args, "--output", tmp_path / "out", "--no-ray"), fragment)


@pytest.mark.parametrize("second, fragment", [
    ("{not json", "line 2 is not JSON"),
    ("[1, 2]", "line 2 is not a JSON object"),
    (json.dumps({**_rows()[0], "split": "dev"}), "line 2 (id 't0'): split 'dev' is invalid"),
])
def test_a_bad_line_of_a_scenario_file_is_named_by_its_line(tmp_path, second, fragment):
    good = [json.dumps(r) for r in _rows()]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([good[1], second, *good[2:]]) + "\n")
    with pytest.raises(SpecError) as e:
        load_instances(str(path))
    assert f"{path} {fragment}" in str(e.value)
    path.write_text("\n".join([good[1], "", second, *good[2:]]) + "\n")  # a blank line still counts
    with pytest.raises(SpecError) as e:
        load_instances(str(path))
    assert f"{path} {fragment.replace('line 2', 'line 3')}" in str(e.value)
