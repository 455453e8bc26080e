"""Tiny random-weight checkpoints of real architectures, saved with `save_pretrained` (safetensors), plus a
small byte-level BPE tokenizer, for tests that must run offline."""

from __future__ import annotations

from pathlib import Path

import torch

_TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "Q: What is 12 plus 30? A: 42\nProduct A: red kettle 2L. Product B: kettle red 2 l. Same? Yes\n"
    "def add(a, b):\n    return a + b\n"
) * 4

EOS = "<|endoftext|>"


def make_tokenizer(out: Path, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([_TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(out)
    return fast


def _common(vocab: int) -> dict:
    return dict(vocab_size=vocab, max_position_embeddings=128, initializer_range=0.2)


def llama_config(vocab: int, variant: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, bos_token_id=0, eos_token_id=0, **_common(vocab))
    if variant == "llama_gqa_llama3":
        base.update(num_key_value_heads=2, rope_theta=500000.0, max_position_embeddings=256,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
        return LlamaConfig(**base)
    if variant == "llama_linear":
        base.update(rope_scaling={"rope_type": "linear", "factor": 2.0})
        return LlamaConfig(**base)
    if variant == "llama_tied":
        return LlamaConfig(tie_word_embeddings=True, **base)
    if variant == "mistral":
        base.update(num_key_value_heads=2, sliding_window=None)
        return MistralConfig(**base)
    if variant == "mistral_window":
        base.update(num_key_value_heads=2, sliding_window=6)
        return MistralConfig(**base)
    if variant == "llama_deep":  # five layers: splits at 1..4 and staging that wraps around an odd depth
        base.update(num_hidden_layers=5, num_key_value_heads=2)
        return LlamaConfig(**base)
    if variant == "qwen2":
        base.update(num_key_value_heads=2, tie_word_embeddings=False)
        return Qwen2Config(**base)
    raise ValueError(variant)


def family_config(vocab: int, variant: str):
    """Today's dense families beyond Llama, each with what sets it apart: head_dim not hidden / heads, GQA, tied and
    untied heads, sliding windows shorter than the prompts, and each family's own settings."""
    import transformers as tf

    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, bos_token_id=0, eos_token_id=0, pad_token_id=0, **_common(vocab))
    if variant == "qwen3":
        return tf.Qwen3Config(head_dim=24, tie_word_embeddings=False, **base)
    if variant == "qwen3_window":  # layer 1 slides (max_window_layers=1), tied head, one KV head
        base.update(num_key_value_heads=1)
        return tf.Qwen3Config(head_dim=16, use_sliding_window=True, sliding_window=5, max_window_layers=1,
                              tie_word_embeddings=True, **base)
    if variant == "gemma3":  # sliding / full / sliding, the full layers' own base and linear scaling, logit cap
        base.update(num_hidden_layers=3, num_key_value_heads=1)
        return tf.Gemma3TextConfig(head_dim=32, sliding_window=6, query_pre_attn_scalar=24,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                                    "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                       "rope_theta": 10000.0}},
                                   final_logit_softcapping=3.0, **base)
    if variant == "gemma3_vision":  # a multimodal checkpoint (a vision tower beside it): its language model runs
        base.update(num_key_value_heads=1, eos_token_id=0, bos_token_id=0)
        text = dict(head_dim=32, sliding_window=6, layer_types=["sliding_attention", "full_attention"], **base)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                      patch_size=4)
        cfg = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                              image_token_index=vocab - 1, boi_token_index=vocab - 2, eoi_token_index=vocab - 3)
        cfg.eos_token_id = 0  # what the generation config stops on (the language model's own)
        return cfg
    if variant == "gemma2":  # alternating sliding / full layers, capped scores and logits (caps that bind here)
        return tf.Gemma2Config(head_dim=16, sliding_window=5, query_pre_attn_scalar=32, attn_logit_softcapping=0.5,
                               final_logit_softcapping=5.0, **base)
    if variant == "gemma":
        return tf.GemmaConfig(head_dim=16, **base)
    if variant == "phi3":  # half of each head rotates; LongRoPE: the longest prompt is past the original context
        half = 4  # rotary dimensions / 2: head_dim 16 x 0.5 / 2
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.5 * i for i in range(half)],
                "long_factor": [2.0 + i for i in range(half)]}
        base.update(max_position_embeddings=128)
        return tf.Phi3Config(partial_rotary_factor=0.5, rope_parameters=rope, original_max_position_embeddings=30,
                             sliding_window=None, **base)
    if variant == "olmo2":
        return tf.Olmo2Config(**base)
    if variant == "granite":
        return tf.GraniteConfig(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                                logits_scaling=2.5, **base)
    if variant == "mixtral":  # 4 experts, top 2, a sliding window shorter than the prompts
        return tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, sliding_window=6, **base)
    if variant == "qwen3_moe":  # 16 experts, top 4 renormalized, head_dim not hidden / heads
        return tf.Qwen3MoeConfig(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True,
                                 head_dim=24, **base)
    if variant == "qwen2_moe":  # 8 experts, top 1 not renormalized, a shared expert; layer 1 a dense MLP
        return tf.Qwen2MoeConfig(num_experts=8, num_experts_per_tok=1, moe_intermediate_size=48, norm_topk_prob=False,
                                 shared_expert_intermediate_size=80, mlp_only_layers=[1], **base)
    if variant == "gpt_oss":  # 8 experts, top 3 of a biased router, sinks, sliding / full layers, YaRN
        return tf.GptOssConfig(num_local_experts=8, num_experts_per_tok=3, head_dim=16, sliding_window=5,
                               swiglu_limit=1.5, **base)
    if variant == "smollm3":  # layer 1 is a NoPE layer
        return tf.SmolLM3Config(no_rope_layer_interval=2, **base)
    raise ValueError(variant)


def opt_config(vocab: int, variant: str):
    from transformers import OPTConfig

    base = dict(hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                bos_token_id=0, eos_token_id=0, pad_token_id=0, **_common(vocab))
    if variant == "opt350m":
        return OPTConfig(word_embed_proj_dim=32, do_layer_norm_before=False, **base)
    return OPTConfig(word_embed_proj_dim=64, do_layer_norm_before=True, **base)


FAMILY_VARIANTS = ("qwen3", "qwen3_window", "gemma3", "gemma3_vision", "gemma2", "gemma", "phi3", "olmo2", "granite", "smollm3")
MOE_VARIANTS = ("mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss")
VARIANTS = ("opt", "opt350m", "llama_gqa_llama3", "llama_linear", "llama_tied", "mistral", "mistral_window", "qwen2")


def make_checkpoint(out: Path, variant: str, seed: int = 0) -> Path:
    """Write a random-weight checkpoint of `variant` to `out` and return it."""
    from jobs.bench.models import save_random_model

    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out)
    vocab = len(tok)
    if variant.startswith("opt"):
        cfg = opt_config(vocab, variant)
    else:
        cfg = (family_config(vocab, variant) if variant in FAMILY_VARIANTS + MOE_VARIANTS
               else llama_config(vocab, variant))
    return save_random_model(out, cfg, torch.float32, seed, adjust=lambda model: perturb_norms(model, seed))


def perturb_norms(model, seed: int) -> None:
    """Norm weights, biases and attention sinks start at 1 and 0; random values make a wrong path visible."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith((".bias", "_bias", ".sinks")):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
