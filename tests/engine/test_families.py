"""Today's dense families (Qwen3, Gemma 1/2/3, Phi-3, OLMo 2, Granite, SmolLM3): greedy float32 tokens equal
transformers' `generate`, token for token, batched with left padding and one row at a time, with weights on disk
and a prefix shared by every row; a 4-bit cache stays within its tolerance; configs of both transformers layouts
read the same; what is not built is refused in one line naming it."""

import json

import pytest
import torch

from engine.engine import Engine
from engine.errors import UnsupportedModelError
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec, spec_from_config
from tests.checkpoints import FAMILY_VARIANTS, MOE_VARIANTS
from tests.engine.loop.test_shared_prefix import ROWS
from tests.engine.reference import PROMPTS, hf_greedy, hf_logits, hf_model
from tests.engine.teacher_forcing import continuation_logprobs

MAX_NEW = 12


def _reqs(prompts, max_new=MAX_NEW):
    return [Request(str(i), p, SamplingParams(max_new_tokens=max_new)) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("variant", FAMILY_VARIANTS + MOE_VARIANTS)
def test_greedy_fp32_matches_transformers(checkpoint, variant):
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32")
    ref = hf_model(model_dir)
    expected = [hf_greedy(ref, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in PROMPTS]
    for batch_size in (len(PROMPTS), 1):
        got = engine.generate(_reqs(PROMPTS), batch_size=batch_size)
        assert [c.token_ids for c in got] == expected, f"batch_size={batch_size}"
    assert any(len(e) == MAX_NEW for e in expected), "reference stopped early everywhere: test too weak"


@pytest.mark.parametrize("variant", FAMILY_VARIANTS + MOE_VARIANTS)
def test_teacher_forced_logprobs_match_the_reference_forward(checkpoint, variant):
    """Log-probabilities through prefill and every decode step within 1e-4 of transformers' forward: sensitive to
    what tokens are not (a random model's argmax can survive a wrong score cap or a wrong norm)."""
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32")
    text = ROWS[3]
    ids = engine.tokenizer(text)["input_ids"]
    n = 32  # prompt tokens: past Phi-3's original context (30), where LongRoPE's rule is one for the whole row
    got = continuation_logprobs(engine, [text], prefix_tokens=n)[0]
    logits = hf_logits(hf_model(model_dir), engine.tokenizer, engine.tokenizer.decode(ids[:n]), ids[n:])
    expected = logits.log_softmax(-1).gather(-1, torch.tensor(ids[n:]).view(-1, 1)).view(-1)
    assert len(ids) > n + 8 and torch.allclose(torch.tensor(got), expected, atol=1e-4), (got, expected.tolist())


@pytest.mark.parametrize("variant", FAMILY_VARIANTS + MOE_VARIANTS)
def test_weights_on_disk_and_a_shared_prefix_keep_transformers_tokens(checkpoint, variant, tmp_path):
    """Layers read from disk at every step, blocks of 3 x 2 rows that share a ~60-token prefix (computed once where
    no sliding window is shorter than the rows: a row would stop seeing the prefix's first tokens)."""
    model_dir = checkpoint(variant)
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(gbs=3, num_gb=2, weight_cpu=0.0),
                         offload_dir=tmp_path)
    ref = hf_model(model_dir)
    expected = [hf_greedy(ref, engine.tokenizer, p, 8, engine.eos_ids) for p in ROWS]
    assert [c.token_ids for c in engine.generate(_reqs(ROWS, 8))] == expected
    assert "disk" in engine.weights.placement
    shared = engine.schedule_counts["shared_tokens"]
    assert shared > 0 if engine.spec.sliding_window is None else shared == 0, engine.schedule_counts
    engine.weights.close()


def _cache_error(checkpoint, variant: str) -> float:
    """Mean |log-probability difference| per teacher-forced token between the 4-bit cache and the float one."""
    model_dir = checkpoint(variant)
    texts = [p for p in ROWS if len(p) > 70]
    plain = continuation_logprobs(Engine.load(model_dir, dtype="float32"), texts)
    packed = continuation_logprobs(Engine.load(model_dir, dtype="float32", policy=Policy(compress_cache=True)), texts)
    diffs = [abs(a - b) for row_a, row_b in zip(plain, packed) for a, b in zip(row_a, row_b)]
    return sum(diffs) / len(diffs)


@pytest.mark.parametrize("variant", FAMILY_VARIANTS)
def test_a_4bit_cache_stays_within_its_tolerance(checkpoint, variant):
    """The tolerance docs/MODELS.md gives: over the same texts, a family's mean log-probability change under the
    4-bit cache is at most 1.5x the Llama family's (random weights with large activations: ~0.26 nats a token;
    a trained model's perplexity moves by under 1 %, docs/BENCHMARKS.md)."""
    baseline = _cache_error(checkpoint, "llama_gqa_llama3")
    error = _cache_error(checkpoint, variant)
    assert 0 < error <= 1.5 * baseline, (error, baseline)


def test_both_config_layouts_give_the_same_spec():
    """A Gemma 3 config as transformers 4 wrote it (rope_theta, rope_local_base_freq, rope_scaling, a sliding
    pattern, no layer_types) and as transformers 5 writes it (rope_parameters per layer kind, layer_types)."""
    from transformers import Gemma3TextConfig

    old = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=1, head_dim=32, vocab_size=100, max_position_embeddings=128,
               sliding_window=8, sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=32, bos_token_id=2,
               eos_token_id=1, pad_token_id=0)  # and no hidden_activation: GELU's tanh form by default
    new = json.loads(Gemma3TextConfig(**{k: v for k, v in old.items() if k != "model_type"}).to_json_string())
    a, b = spec_from_config(old), spec_from_config(new)
    assert a == b
    assert a.sliding_layers == (True, False, True, False) and a.rope_layers == (1, 0, 1, 0)
    assert (a.rope.theta, a.rope.rope_type, a.rope.factor, a.rope_local.theta) == (1e6, "linear", 8.0, 1e4)
    assert a.attn_scale == 32**-0.5 and a.norm_offset == 1.0 and a.block == "sandwich"
    assert a.activation == "gelu_pytorch_tanh" and a.tie_word_embeddings


@pytest.mark.parametrize("config, message", [
    (dict(model_type="qwen3_next", layer_types=["linear_attention", "full_attention"]), "linear_attention"),
    (dict(model_type="deepseek_v3", n_routed_experts=8), "mixture of experts"),
    (dict(model_type="llava", text_config={}), "text-only checkpoint"),
    (dict(model_type="bloom"), "supported: opt, llama"),
])
def test_what_is_not_built_is_refused_naming_it(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=message) as e:
        load_model_spec(tmp_path)
    assert repr(config["model_type"]) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_frequencies_and_scale_are_transformers(truncate):
    """YaRN as Qwen3's long-context configs and gpt-oss set it: the same frequencies, bit for bit, and cos/sin
    scale as transformers' own rule."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.kernels.rope import inv_frequencies

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6,
            "truncate": truncate}
    cfg = Qwen3Config(head_dim=128, max_position_embeddings=131072, rope_parameters=rope)
    want, scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    spec = spec_from_config(json.loads(cfg.to_json_string()))
    assert torch.equal(inv_frequencies(spec.rope, spec.head_dim), want)
    assert spec.rope.attention_factor == scale
