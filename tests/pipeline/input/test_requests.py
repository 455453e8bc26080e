import math

import pyarrow as pa
import pytest

from engine.errors import InvalidParamsError
from engine.request import Completion, Request, SamplingParams
from pipeline.input.requests import build_requests, derive_seed, row_ids, row_params

DEFAULTS = SamplingParams(max_new_tokens=16, temperature=0.7, seed=5)


def _build(table, defaults=DEFAULTS):
    return build_requests(table, row_ids(table, "f"), "prompt", defaults)


def test_ids_are_made_from_the_part_stem_and_row_index():
    assert row_ids(pa.table({"prompt": ["a", "b"]}), "data-1") == ["data-1:0", "data-1:1"]


def test_id_column_is_cast_to_string_and_nulls_get_made_ids():
    table = pa.table({"prompt": ["a", "b", "c"], "id": pa.array([42, None, 7], pa.int64())})
    assert row_ids(table, "f") == ["42", "f:1", "7"]


def test_distinct_binary_ids_stay_distinct_and_utf8_ids_read_as_text():
    given = [b"\xff", b"\xfe", b"\\xff", b"a\\", b"a\\\\", "é".encode(), b"plain"]
    ids = row_ids(pa.table({"prompt": ["p"] * len(given), "id": pa.array(given, pa.binary())}), "f")
    assert len(set(ids)) == len(given)
    assert ids[5:] == ["é", "plain"] and ids[0] == "\\xff" and ids[2] == "\\\\xff"
    pa.array(ids, pa.string())  # every id is valid text for the output's string column


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [(None, "is null"), ("", "is empty")],
)
def test_bad_prompts_become_failed_rows(prompt, problem):
    items = _build(pa.table({"prompt": pa.array(["ok", prompt], pa.string())}))
    assert isinstance(items[0], Request)
    assert isinstance(items[1], Completion) and items[1].finish_reason == "error"
    assert problem in items[1].error and items[1].id == "f:1"


def test_non_string_prompt_becomes_a_failed_row():
    items = _build(pa.table({"prompt": [1, 2]}))
    assert all(isinstance(c, Completion) and "holds a int" in c.error for c in items)


def test_per_row_columns_override_and_null_means_the_option():
    table = pa.table({
        "prompt": ["a", "b", "c"],
        "max_new_tokens": pa.array([3, None, 5.0], pa.float64()),  # a pandas int column with nulls
        "temperature": [0.0, None, float("nan")],
        "top_k": [None, 4, None],
        "top_p": [None, None, 0.5],
        "stop": pa.array([["\n", "Q:"], None, []], pa.list_(pa.string())),
        "seed": pa.array([None, 9, None], pa.int64()),
    })
    a, b, c = (item.params for item in _build(table))
    assert (a.max_new_tokens, a.temperature, a.top_k, a.stop) == (3, 0.0, 0, ("\n", "Q:"))
    assert (b.max_new_tokens, b.temperature, b.top_k, b.stop, b.seed) == (16, 0.7, 4, (), 9)
    assert (c.max_new_tokens, c.temperature, c.top_p, c.stop) == (5, 0.7, 0.5, ())


def test_invalid_per_row_parameter_fails_only_that_row():
    table = pa.table({"prompt": ["a", "b", "c"], "temperature": [0.5, -1.0, None], "max_new_tokens": [1, 2, 2.5]})
    items = _build(table)
    assert isinstance(items[0], Request)
    assert isinstance(items[1], Completion) and "temperature=-1.0" in items[1].error
    assert isinstance(items[2], Completion) and "max_new_tokens=2.5" in items[2].error


def test_a_single_stop_string_is_accepted_and_a_non_list_is_not():
    assert row_params(DEFAULTS, {"stop": "###"}, "r").stop == ("###",)
    with pytest.raises(InvalidParamsError, match="list of strings"):
        row_params(DEFAULTS, {"stop": 3}, "r")


def test_derived_seeds_are_stable_distinct_and_follow_the_job_seed():
    seeds = [derive_seed(0, f"f:{i}") for i in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(0, "f:1") == derive_seed(0, "f:1") != derive_seed(1, "f:1")


def test_rows_without_a_seed_get_the_derived_seed():
    table = pa.table({"prompt": ["a", "b"], "seed": pa.array([None, 3], pa.int64())})
    a, b = (item.params for item in _build(table))
    assert a.seed == derive_seed(DEFAULTS.seed, "f:0") and b.seed == 3


def test_nan_is_treated_as_missing_not_as_a_value():
    assert row_params(DEFAULTS, {"top_p": math.nan}, "r").top_p == DEFAULTS.top_p
