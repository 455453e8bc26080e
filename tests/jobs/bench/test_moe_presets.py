"""The mixture-of-experts presets of `bench workloads` and `bench engine`: their configs are the families' own with
the released models' layer shapes, a checkpoint of each (at small sizes, same family and fields) loads in the engine
and names its experts as llama.cpp's converters read them, and the FLOP count and decode GEMMs count the experts a
token runs, not every expert."""

import dataclasses

import pytest
from safetensors import safe_open

from engine.engine import Engine
from engine.policy import Policy
from engine.spec import load_model_spec, spec_from_config
from jobs.bench import llama_cpp as lc
from jobs.bench import models as bm
from jobs.bench.runs import engine_runner

# converter's expert names of layer 0, expert 0 (convert_hf_to_gguf's Llama converter stacks Mixtral's
# block_sparse_moe.experts.N.w1/w2/w3; its Qwen2-MoE one Qwen3-MoE's mlp.experts.N.gate_proj/up_proj/down_proj)
EXPERT_NAMES = {"mixtral": ["block_sparse_moe.experts.0.w1", "block_sparse_moe.experts.0.w2",
                            "block_sparse_moe.experts.0.w3", "block_sparse_moe.gate"],
                "qwen3_moe": ["mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj",
                              "mlp.gate"]}


def small(name: str) -> bm.Preset:
    """The preset at test size: its family and family fields (experts, top k, ...), small dimensions."""
    return dataclasses.replace(bm.PRESETS[name], hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                               max_position_embeddings=128)


def test_the_mixtral_preset_is_mixtrals_config_with_its_layer_shapes():
    cfg = bm.PRESETS["mixtral-800m"].hf_config()
    assert type(cfg).__name__ == "MixtralConfig" and cfg.model_type == "mixtral"
    assert (cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size) == (8, 2, 3584)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads) == (8, 2, 128)
    assert not cfg.tie_word_embeddings and cfg.rope_parameters["rope_theta"] == 1e6 and cfg.eos_token_id is None
    spec = spec_from_config(cfg.to_dict())
    assert (spec.num_experts, spec.experts_per_token, spec.expert_ffn_size) == (8, 2, 3584)
    assert spec.moe_layers == (True,) * 8 and spec.sliding_window is None


def test_the_qwen3_moe_preset_is_qwen3_moes_config_with_its_layer_shapes():
    cfg = bm.PRESETS["qwen3moe-700m"].hf_config()
    assert type(cfg).__name__ == "Qwen3MoeConfig" and cfg.model_type == "qwen3_moe"
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (64, 8, 384)
    assert cfg.norm_topk_prob and cfg.mlp_only_layers == [] and cfg.decoder_sparse_step == 1
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (16, 2, 128)
    spec = spec_from_config(cfg.to_dict())
    assert (spec.num_experts, spec.experts_per_token, spec.expert_ffn_size, spec.norm_topk_prob) == (64, 8, 384, True)
    assert spec.qk_norm == "head" and spec.moe_layers == (True,) * 8 and spec.shared_expert_ffn_size == 0


@pytest.mark.parametrize("name", ["mixtral-800m", "qwen3moe-700m"])
def test_each_preset_is_a_few_times_the_weights_its_tokens_run_through(name):
    """Stored bytes (what a memory limit is set against) are several times what a token computes with."""
    spec = spec_from_config(bm.PRESETS[name].hf_config().to_dict())
    stored = spec.num_layers * spec.params_per_layer + 2 * spec.vocab_size * spec.hidden_size
    assert 0.65e9 < stored < 0.85e9 and 3 < stored / (bm.linear_params(spec) + 2 * spec.vocab_size * spec.hidden_size)


@pytest.mark.parametrize("name", ["mixtral-800m", "qwen3moe-700m"])
def test_a_preset_checkpoint_loads_and_generates_in_every_weight_format(name, tmp_path):
    preset = small(name)
    model_dir = bm.build_checkpoint(preset, tmp_path, folder=name)
    spec = load_model_spec(model_dir)
    assert spec.model_type == preset.hf_config().model_type and spec.num_experts > 1
    prompts = bm.prompt_ids(3, 8, spec.vocab_size)
    for fmt in (None, "int8", "int4"):
        policy = Policy(gbs=3, num_gb=1, compress_weight=fmt is not None, weight_format=fmt or "int4")
        run = engine_runner(Engine.load(model_dir, dtype="float32", policy=policy), prompts, 3, 1)
        assert run(4) == 12
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {f"model.layers.0.{n}.weight" for n in EXPERT_NAMES[spec.model_type]} <= names


def test_the_gguf_converter_is_handed_every_preset_family_by_class():
    """A checkpoint without `architectures` in its config still reaches the converter's class of its family."""
    types = {bm.PRESETS[p].hf_config().model_type for p in bm.PRESETS if bm.PRESETS[p].family != "opt"}
    assert types <= set(lc.ARCHITECTURES)
    assert lc.ARCHITECTURES["mixtral"] == "MixtralForCausalLM" and lc.ARCHITECTURES["qwen3_moe"] == "Qwen3MoeForCausalLM"


def test_model_flops_count_the_experts_a_token_runs_and_the_router():
    spec = spec_from_config(bm.PRESETS["mixtral-800m"].hf_config().to_dict())
    h, fe, L = 1024, 3584, 8
    attention = 2 * h * 1024 + 2 * h * 256
    assert bm.linear_params(spec) == L * (attention + 8 * h + 2 * 3 * h * fe)
    one = bm.model_flops(spec, prompt_len=4, gen_len=2, rows=1)
    assert one["linear"] == 2 * bm.linear_params(spec) * 5


def test_decode_gemms_spread_the_rows_over_the_experts():
    spec = spec_from_config(bm.PRESETS["qwen3moe-700m"].hf_config().to_dict())
    gemms = bm.layer_gemms(spec, 32)
    assert gemms[:5] == [(32, 2048, 1024, 1), (32, 256, 1024, 1), (32, 256, 1024, 1), (32, 1024, 2048, 1),
                         (32, 64, 1024, 1)]  # q, k, v, o, router
    assert gemms[5:] == [(4, 384, 1024, 64), (4, 384, 1024, 64), (4, 1024, 384, 64)]  # 32 rows x 8 / 64 each
    assert bm.layer_gemms(spec, 3)[5][0] == 1  # a share is at least one row
    dense = spec_from_config(bm.PRESETS["100m"].hf_config().to_dict())
    assert bm.layer_gemms(dense, 16) == [(16, n, k, 1) for n, k in bm.layer_gemm_shapes(dense)]
