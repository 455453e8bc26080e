"""A quantized checkpoint's weight forms: GPTQ and AWQ keep their own 4-bit form unasked (widening would hold the
whole model dense for no accuracy), a pinned form is still obeyed; FP8 is never offered bfloat16 at rest (its
dequantized values are not bfloat16's: the rounding would not be lossless)."""

from engine.spec import spec_from_config
from planner.search import search, weight_forms
from planner.workload import Workload
from tests.planner.specs import server_cpu

CONFIG = dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
              max_position_embeddings=40960, torch_dtype="bfloat16")
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def test_int4_checkpoints_plan_in_their_own_form():
    for qc in (GPTQ, AWQ):
        spec = spec_from_config(CONFIG | {"quantization_config": qc})
        assert spec.quantization.method == qc["quant_method"]
        assert weight_forms(spec, {}, False, 4) == [(True, "int4")]
        assert weight_forms(spec, {"compress_weight": False}, False, 4) == [(False, "int4")]  # pinned: dense
        plan = search(spec, server_cpu(), Workload(16, 64, 32, dtype="bfloat16"))
        assert plan.policy.compress_weight and plan.policy.weight_format == "int4", plan.policy


def test_fp8_is_not_offered_bf16_at_rest():
    spec = spec_from_config(CONFIG | {"quantization_config": FP8})
    assert (True, "bf16") not in weight_forms(spec, {}, True, 4)
    assert (True, "bf16") in weight_forms(spec_from_config(CONFIG), {}, True, 4)
