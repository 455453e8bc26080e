"""What each rotary decoder family's `config.json` says, as `ModelSpec` fields: the Llama layer's settings that
every family has, then each family's differences (engine/spec.py holds the fields and what they mean).

Both layouts of a config are read: transformers 4's (`rope_theta`, `rope_scaling`, Gemma 3's `rope_local_base_freq`,
no `layer_types`) and 5's (`rope_parameters`, per layer kind where layers differ, and `layer_types`)."""

from __future__ import annotations

import math

from engine.errors import UnsupportedModelError
from engine.rope_spec import RopeSpec

LAYER_KINDS = ("full_attention", "sliding_attention")
LANGUAGE_MODELS = {"gemma3": "gemma3_text"}  # a multimodal checkpoint's model_type -> its language model's
CHECKPOINT_WIDE = ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings")
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text", "smollm3")  # their config classes tie the head by default


def language_model_config(cfg: dict) -> dict:
    """The config of the model that runs: a multimodal checkpoint's `text_config` as its language model's own
    config (with the checkpoint-wide fields it lacks), any other config as it is."""
    text_type = LANGUAGE_MODELS.get(cfg.get("model_type"))
    if text_type is None or not isinstance(cfg.get("text_config"), dict):
        return cfg
    text = dict(cfg["text_config"], model_type=text_type)
    return {k: cfg[k] for k in CHECKPOINT_WIDE if k in cfg and k not in text} | text


def family_fields(cfg: dict) -> dict:
    """The fields of a rotary decoder's ModelSpec from its config."""
    model_type = cfg["model_type"]
    fields = _llama_fields(cfg)
    fields.update(_FAMILY.get(model_type, lambda c: {})(cfg))
    return fields


def _llama_fields(cfg: dict) -> dict:
    attention_bias = cfg.get("attention_bias", False)
    kinds = layer_kinds(cfg)
    return dict(
        ffn_size=cfg["intermediate_size"],
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=cfg.get("tie_word_embeddings", cfg["model_type"] in TIED_BY_DEFAULT),
        rope=rope_spec(_rope_params(cfg, "full_attention"), cfg),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=cfg.get("mlp_bias", False),
        sliding_window=cfg.get("sliding_window") if "sliding_attention" in kinds else None,
        sliding_layers=tuple(k == "sliding_attention" for k in kinds),
        activation=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
    )


def layer_kinds(cfg: dict) -> list[str]:
    """Each layer's attention kind: the config's `layer_types` where it has them, else the family's rule."""
    n, window = cfg["num_hidden_layers"], cfg.get("sliding_window")
    kinds = cfg.get("layer_types")
    if kinds is None:
        kinds = [_default_kind(cfg, i) if window else "full_attention" for i in range(n)]
    unknown = sorted(set(kinds) - set(LAYER_KINDS))
    if unknown:
        raise UnsupportedModelError(f"layers of kind {', '.join(map(repr, unknown))} ({cfg['model_type']}) are not "
                                    f"built; supported layer kinds: {', '.join(LAYER_KINDS)}")
    if len(kinds) != n:
        raise UnsupportedModelError(f"config.json lists {len(kinds)} layer_types for num_hidden_layers={n}")
    return list(kinds)


def _default_kind(cfg: dict, i: int) -> str:
    """Layer i's kind for a config without `layer_types` that has a sliding window."""
    model_type = cfg["model_type"]
    if model_type in ("qwen2", "qwen3"):
        slides = cfg.get("use_sliding_window", False) and i >= cfg.get("max_window_layers", 28)
    elif model_type == "gemma2":
        slides = (i + 1) % 2 != 0
    elif model_type == "gemma3_text":
        slides = (i + 1) % cfg.get("sliding_window_pattern", 6) != 0
    elif model_type == "smollm3":
        slides = cfg.get("use_sliding_window", False) and not _uses_rope(cfg, i)
    elif model_type == "gpt_oss":
        slides = (i + 1) % 2 != 0
    elif model_type in ("olmo2", "granite", "gemma"):
        slides = False
    else:  # Mistral, Phi-3: every layer
        slides = True
    return "sliding_attention" if slides else "full_attention"


def _rope_params(cfg: dict, kind: str) -> dict:
    """The rotary settings of layers of `kind` as one dict (rope_theta, rope_type and the type's own keys)."""
    params = dict(cfg.get("rope_parameters") or {})
    if kind in params or set(params) & set(LAYER_KINDS):  # per layer kind (Gemma 3 in transformers 5)
        params = dict(params.get(kind) or {})
    if kind == "full_attention":
        params.update(cfg.get("rope_scaling") or {})
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return params


def rope_spec(params: dict, cfg: dict) -> RopeSpec:
    rope_type = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    kwargs = {k: params[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings") if params.get(k) is not None}
    if rope_type == "longrope":
        kwargs.update(_longrope(params, cfg))
    if rope_type == "yarn":
        kwargs.update(_yarn(params, cfg))
    return RopeSpec(theta=float(params["rope_theta"]), rope_type=rope_type, partial=float(partial), **kwargs)


def _longrope(params: dict, cfg: dict) -> dict:
    """LongRoPE's factors, and its cos/sin scale: sqrt(1 + ln(factor) / ln(original context)), factor being the
    context's growth (max_position_embeddings / original) unless given."""
    original = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if original is None:
        raise UnsupportedModelError("longrope needs original_max_position_embeddings in config.json")
    factor = params.get("factor") or cfg["max_position_embeddings"] / original
    scale = params.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return dict(original_max_position_embeddings=int(original), factor=float(factor), attention_factor=float(scale),
                short_factor=tuple(map(float, params["short_factor"])),
                long_factor=tuple(map(float, params["long_factor"])))


def _yarn(params: dict, cfg: dict) -> dict:
    """YaRN's factor (the context's growth unless given), its band and its cos/sin scale (0.1 ln(factor) + 1, or the
    ratio of two such scales where the config gives mscale and mscale_all_dim)."""
    original = (params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
                or cfg["max_position_embeddings"])
    factor = params.get("factor") or cfg["max_position_embeddings"] / original

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    scale = params.get("attention_factor")
    if scale is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        scale = mscale(m) / mscale(m_all) if m and m_all else mscale()
    return dict(original_max_position_embeddings=int(original), factor=float(factor), attention_factor=float(scale),
                beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                truncate=bool(params.get("truncate", True)))


def _uses_rope(cfg: dict, i: int) -> bool:
    """SmolLM3: `no_rope_layers[i]` is 1 where layer i rotates, 0 where it is a NoPE layer."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        return (i + 1) % cfg.get("no_rope_layer_interval", 4) != 0
    return bool(flags[i])


def _qwen2(cfg: dict) -> dict:
    return dict(qkv_bias=True, o_bias=False)


def _qwen3(cfg: dict) -> dict:
    return dict(qk_norm="head")


def _gemma(cfg: dict) -> dict:
    """Gemma 1: (1 + w) norms, embeddings scaled by sqrt(hidden), GELU's tanh form (also where an early config
    says "gelu": the checkpoints' own code reads it so)."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    return dict(norm_offset=1.0, embed_scale=cfg["hidden_size"] ** 0.5,
                activation="gelu_pytorch_tanh" if act == "gelu" else act)


def _gemma2(cfg: dict) -> dict:
    """Gemma 2: Gemma's, with norms before and after each block, queries scaled by query_pre_attn_scalar, and
    soft-capped scores and logits where the config caps them."""
    return _gemma(cfg) | dict(block="sandwich", attn_scale=cfg.get("query_pre_attn_scalar", 256) ** -0.5,
                              attn_softcap=cfg.get("attn_logit_softcapping"),
                              final_softcap=cfg.get("final_logit_softcapping"))


def _gemma3(cfg: dict) -> dict:
    """Gemma 3: Gemma 2's, with q/k norms and the sliding layers' own rotary base."""
    kinds = layer_kinds(cfg)
    local = _rope_params(cfg, "sliding_attention")
    if "rope_local_base_freq" in cfg:
        local["rope_theta"] = cfg["rope_local_base_freq"]
    elif not (cfg.get("rope_parameters") or {}).get("sliding_attention"):
        local["rope_theta"] = 10000.0  # the config class's default for the local base
    return _gemma2(cfg) | dict(qk_norm="head", rope_local=rope_spec(local, cfg),
                               rope_layers=tuple(1 if k == "sliding_attention" else 0 for k in kinds))


def _olmo2(cfg: dict) -> dict:
    return dict(block="post", qk_norm="proj")


def _granite(cfg: dict) -> dict:
    return dict(embed_scale=float(cfg.get("embedding_multiplier", 1.0)),
                residual_scale=float(cfg.get("residual_multiplier", 1.0)),
                attn_scale=float(cfg.get("attention_multiplier", 1.0)),
                logit_divisor=float(cfg.get("logits_scaling", 1.0)))


def _moe_layers(cfg: dict) -> tuple[bool, ...]:
    """Qwen-MoE: every `decoder_sparse_step`-th layer is a mixture, but those in `mlp_only_layers`."""
    step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or ())
    return tuple((i + 1) % step == 0 and i not in dense for i in range(cfg["num_hidden_layers"]))


def _mixtral(cfg: dict) -> dict:
    """Mixtral: top-k of a softmax over every expert, renormalized; experts w1 (gate), w3 (up), w2 (down)."""
    return dict(num_experts=cfg["num_local_experts"], experts_per_token=cfg["num_experts_per_tok"],
                expert_ffn_size=cfg["intermediate_size"], norm_topk_prob=True, moe_prefix="block_sparse_moe.",
                expert_down="w2")


def _qwen_moe(cfg: dict) -> dict:
    """Qwen2-MoE / Qwen3-MoE: top-k of a softmax, renormalized where `norm_topk_prob`; Qwen2-MoE's shared expert
    (its output gated by a sigmoid) beside the routed ones; dense layers where `mlp_only_layers` says."""
    experts = cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]  # transformers 4 | 5
    return dict(num_experts=experts, experts_per_token=cfg["num_experts_per_tok"],
                expert_ffn_size=cfg["moe_intermediate_size"], norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                shared_expert_ffn_size=cfg.get("shared_expert_intermediate_size") or 0, moe_layers=_moe_layers(cfg))


def _gpt_oss(cfg: dict) -> dict:
    """gpt-oss: a softmax over the top k of a biased router; biased experts with a clamped SwiGLU; attention biases
    and per-head sinks (read from the weights); alternating sliding / full layers; YaRN."""
    return dict(num_experts=cfg["num_local_experts"], experts_per_token=cfg["num_experts_per_tok"],
                expert_ffn_size=cfg["intermediate_size"], router="topk", router_name="router", expert_bias=True,
                attn_sinks=True,
                gate_limit=float(cfg.get("swiglu_limit", 7.0)), gate_alpha=float(cfg.get("swiglu_alpha", 1.702)))


def _smollm3(cfg: dict) -> dict:
    return dict(rope_layers=tuple(0 if _uses_rope(cfg, i) else -1 for i in range(cfg["num_hidden_layers"])))


_FAMILY = {"qwen2": _qwen2, "qwen3": _qwen3, "mixtral": _mixtral, "qwen2_moe": lambda c: _qwen2(c) | _qwen_moe(c),
           "qwen3_moe": lambda c: _qwen3(c) | _qwen_moe(c), "gpt_oss": _gpt_oss, "gemma": _gemma, "gemma2": _gemma2, "gemma3_text": _gemma3,
           "olmo2": _olmo2, "granite": _granite, "smollm3": _smollm3}
