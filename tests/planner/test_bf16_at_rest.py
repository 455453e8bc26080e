"""The planner offers bfloat16 weights at rest (engine/compression/bf16.py) wherever it loses nothing, a checkpoint
stored in bfloat16 computing in float32, without --allow-compression: under a memory limit that sends the weights
to disk it halves what each pass reads and is chosen; where the model fits it is not; a float32 checkpoint, a
bfloat16 run or a pinned format never gets it. On the avx2 machine class it is the uncompressed form itself (a
fixed rule); the other tests here run as another class."""

from dataclasses import replace

import pytest

from engine.spec import spec_from_config
from planner.search import search, weight_forms
from planner.workload import Workload
from tests.planner.specs import server_cpu

GIB = 2**30
CONFIG = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
              tie_word_embeddings=False)
BF16_7B = spec_from_config(CONFIG | {"torch_dtype": "bfloat16"})
FP32_7B = spec_from_config(CONFIG | {"torch_dtype": "float32"})
DECODE_HEAVY = Workload(16, 64, 256, dtype="float32")


@pytest.fixture(autouse=True)
def machine_class(monkeypatch):
    """The machine class the rule reads: avx512 unless a test sets another."""
    def pin(name: str):
        monkeypatch.setattr("engine.compression.bf16.kernel_class", lambda: name)

    pin("avx512")
    return pin


def test_a_disk_bound_float32_run_of_a_bf16_checkpoint_keeps_its_weights_in_bf16():
    plan = search(BF16_7B, server_cpu(), DECODE_HEAVY, budgets={"cpu": 6 * GIB})
    assert plan.policy.weight_cpu < 1  # the weights do not fit: a disk tier
    assert plan.policy.compress_weight and plan.policy.weight_format == "bf16", plan.policy
    unpinned_fp32 = search(FP32_7B, server_cpu(), DECODE_HEAVY, budgets={"cpu": 6 * GIB})
    assert not unpinned_fp32.policy.compress_weight
    # half the weight bytes read per pass (compute and the KV cache unchanged): 0.73x predicted
    assert plan.prediction.total_s < 0.8 * unpinned_fp32.prediction.total_s


def test_where_the_model_fits_the_widening_is_not_paid():
    small = spec_from_config(CONFIG | {"torch_dtype": "bfloat16", "hidden_size": 1024, "intermediate_size": 2816,
                                       "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4})
    plan = search(small, server_cpu(), DECODE_HEAVY, budgets={"cpu": 20 * GIB})
    assert plan.policy.weight_cpu == 1 and not plan.policy.compress_weight


def test_only_lossless_cases_get_it_unasked():
    assert (True, "bf16") in weight_forms(BF16_7B, {}, False, 4)
    assert (True, "bf16") not in weight_forms(FP32_7B, {}, False, 4)
    assert (True, "bf16") not in weight_forms(BF16_7B, {}, False, 2)  # a bfloat16 run
    assert weight_forms(BF16_7B, {"compress_weight": False}, False, 4) == [(False, "int4")]
    assert weight_forms(BF16_7B, {"weight_format": "int8"}, True, 4) == [(False, "int8"), (True, "int8")]
    assert weight_forms(BF16_7B, {}, True, 4) == [(False, "int4"), (True, "int4"), (True, "int8"), (True, "bf16")]
    assert search(BF16_7B, server_cpu(), replace(DECODE_HEAVY, dtype="bfloat16"),
                  budgets={"cpu": 6 * GIB}).policy.weight_format != "bf16"


def test_on_the_avx2_class_a_bf16_checkpoint_in_float32_keeps_its_weights_in_bf16_unasked(machine_class):
    machine_class("avx2")
    assert weight_forms(BF16_7B, {}, False, 4) == [(True, "bf16")]
    assert weight_forms(BF16_7B, {}, True, 4) == [(True, "bf16"), (True, "int4"), (True, "int8")]
    assert weight_forms(BF16_7B, {"compress_weight": False}, False, 4) == [(False, "int4")]  # pinned: float32
    assert weight_forms(BF16_7B, {"weight_format": "int8"}, True, 4) == [(False, "int8"), (True, "int8")]
    assert weight_forms(FP32_7B, {}, False, 4) == [(False, "int4")]
    assert weight_forms(BF16_7B, {}, False, 2) == [(False, "int4")]  # a bfloat16 run
    small = spec_from_config(CONFIG | {"torch_dtype": "bfloat16", "hidden_size": 1024, "intermediate_size": 2816,
                                       "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4})
    plan = search(small, server_cpu(), DECODE_HEAVY, budgets={"cpu": 20 * GIB})
    assert plan.policy.weight_cpu == 1 and plan.policy.compress_weight and plan.policy.weight_format == "bf16"
