"""`ModelSpec`: the shape of a checkpoint, read from its `config.json`, validated before any weight is loaded."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.config_fields import LANGUAGE_MODELS, family_fields, language_model_config
from engine.errors import ModelNotFoundError, UnsupportedModelError, WeightFormatError
from engine.quantized.config import QuantFormat, checkpoint_quantization
from engine.rope_spec import RopeSpec

ACTIVATION_NAMES = ("relu", "silu", "gelu", "gelu_pytorch_tanh")  # engine/models/__init__.py ACTIVATIONS

OPT_TYPES = ("opt",)
# the rotary decoder families (engine/models/llama.py and the families built on it, engine/models/__init__.py)
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "granite",
               "smollm3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
SUPPORTED_TYPES = OPT_TYPES + LLAMA_TYPES
BLOCKS = ("pre", "sandwich", "post")  # where a layer's norms sit around attention and the MLP (ModelSpec.block)
QK_NORMS = (None, "head", "proj")  # RMSNorm of q and k before RoPE: none, over each head, over the projection
ROUTERS = ("softmax", "topk")  # softmax over every expert then the top k (Mixtral, Qwen), or softmax of the top k


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine and the planner need to know about a model's shape. `family` is "opt" or
    "llama" (every rotary decoder: Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3, OLMo 2, Granite, SmolLM3 share the
    Llama layer's shape; what each family changes is in the fields below, read by engine/models/llama.py).

    Per layer: `sliding_layers[i]` says whether layer i attends only to the last `sliding_window` slots, and
    `rope_layers[i]` which rotary table it uses (0: `rope`, 1: `rope_local`, -1: none, a NoPE layer)."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    max_position_embeddings: int
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    # Llama family
    rope: RopeSpec = field(default_factory=RopeSpec)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()  # () : every layer slides when sliding_window is set
    rope_local: RopeSpec | None = None  # the sliding layers' rotary settings where they differ (Gemma 3)
    rope_layers: tuple[int, ...] = ()  # () : every layer uses `rope`
    qk_norm: str | None = None
    block: str = "pre"
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): Gemma's (1 + w)
    embed_scale: float = 1.0  # the embeddings times this (Gemma: sqrt(hidden); Granite's embedding_multiplier)
    residual_scale: float = 1.0  # each block's output times this before the residual add (Granite)
    attn_scale: float | None = None  # scores = attn_scale * q.k (None: 1 / sqrt(head_dim))
    attn_softcap: float | None = None  # scores = cap * tanh(scores / cap) (Gemma 2)
    logit_divisor: float = 1.0  # the logits divided by this (Granite's logits_scaling)
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 2)
    # a mixture of experts (engine/models/experts.py): layers where `moe_layers` is set replace the MLP by
    # `num_experts` experts of width `expert_ffn_size`, `experts_per_token` of them per token, and a shared expert
    # of width `shared_expert_ffn_size` where it is not 0; its weights under `moe_prefix`
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_size: int = 0
    shared_expert_ffn_size: int = 0
    router: str = "softmax"
    norm_topk_prob: bool = False  # the top k's weights renormalized to sum to 1
    moe_layers: tuple[bool, ...] = ()  # () : every layer when num_experts
    moe_prefix: str = "mlp."
    expert_down: str = "down_proj"  # an expert's down projection (Mixtral: w2)
    router_name: str = "gate"  # the router's weight (and bias) under moe_prefix (gpt-oss: router)
    expert_bias: bool = False  # the router and every expert projection have biases (gpt-oss)
    attn_sinks: bool = False  # each layer has a sink logit per head, `self_attn.sinks` (gpt-oss)
    # gpt-oss's gate, where `gate_limit` is set: gate clamped from above and up to +-limit, then
    # (up + 1) * gate * sigmoid(gate_alpha * gate)
    gate_limit: float | None = None
    gate_alpha: float = 1.0
    # OPT
    word_embed_proj_dim: int | None = None
    do_layer_norm_before: bool = True
    final_layer_norm: bool = True
    activation: str = "silu"
    checkpoint_dtype: str = "float32"
    quantization: QuantFormat | None = None  # how the checkpoint's weights are stored where quantized (GPTQ, AWQ, FP8)
    family: str = field(init=False)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}"
            )
        object.__setattr__(self, "family", "opt" if self.model_type in OPT_TYPES else "llama")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        if self.activation not in ACTIVATION_NAMES:
            raise UnsupportedModelError(f"activation {self.activation!r} is not supported; supported: "
                                        f"{', '.join(ACTIVATION_NAMES)}")
        n = self.num_layers
        if not self.sliding_layers:
            object.__setattr__(self, "sliding_layers", (self.sliding_window is not None,) * n)
        if not self.rope_layers:
            object.__setattr__(self, "rope_layers", (0,) * n)
        if not self.moe_layers:
            object.__setattr__(self, "moe_layers", (self.num_experts > 0,) * n)
        assert self.router in ROUTERS and len(self.moe_layers) == n, (self.router, self.moe_layers)
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise UnsupportedModelError(f"num_experts_per_tok={self.experts_per_token} is not within 1..num_experts="
                                        f"{self.num_experts}")
        assert len(self.sliding_layers) == n and len(self.rope_layers) == n, (self.sliding_layers, self.rope_layers)
        assert self.block in BLOCKS and self.qk_norm in QK_NORMS, (self.block, self.qk_norm)
        if not any(self.sliding_layers):
            object.__setattr__(self, "sliding_window", None)

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer` (None: it attends to every slot)."""
        return self.sliding_window if self.sliding_layers[layer] else None

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head that rotate (an even number)."""
        return int(self.head_dim * self.rope.partial) // 2 * 2

    @property
    def params_per_layer(self) -> int:
        """Weights (and biases) of one transformer layer, in elements."""
        h, d, ffn = self.hidden_size, self.head_dim, self.ffn_size
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.family == "opt":
            return attn + (q + 2 * kv + h) + 2 * h * ffn + ffn + h + 4 * h
        mlp = 3 * h * ffn + (2 * ffn + h if self.mlp_bias else 0)
        norms = {"pre": 2, "sandwich": 4, "post": 2}[self.block] * h
        qk = {None: 0, "head": 2 * d, "proj": q + kv}[self.qk_norm]
        if self.num_experts:  # the widest layer: a mixture's (every expert, the router, the shared expert)
            fe, e = self.expert_ffn_size, self.num_experts
            biases = e * (2 * fe + h) + e if self.expert_bias else 0
            mlp = max(mlp, e * (3 * h * fe + h) + 3 * h * self.shared_expert_ffn_size
                      + (h if self.shared_expert_ffn_size else 0) + biases)
        sinks = self.num_heads if self.attn_sinks else 0
        return attn + (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0) + mlp + norms + qk + sinks

    def layer_bytes(self, bytes_per_param: float = 2.0) -> float:
        return self.params_per_layer * bytes_per_param

    def kv_bytes_per_token(self, bytes_per_elem: float = 2.0) -> float:
        """K and V of one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_elem


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelNotFoundError(f"model folder {str(path)!r} does not exist; pass --model a local checkpoint folder")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise ModelNotFoundError(f"{str(cfg)!r} is missing; a checkpoint folder needs config.json")
    try:
        return json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelNotFoundError(f"{str(cfg)!r} is not valid JSON: {e}") from e


def check_safetensors(model_dir: str | Path) -> list[Path]:
    """Return the safetensors files of a checkpoint; refuse pickle-only checkpoints."""
    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors"))
    if files:
        for f in files:
            _check_header(f)
        return files
    pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    if pickles:
        raise WeightFormatError(
            f"{str(path)!r} has only pickle weights ({', '.join(pickles[:3])}); flexbatch loads safetensors only, "
            "never pickle. Convert once with transformers: "
            "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)"
        )
    raise WeightFormatError(f"{str(path)!r} has no *.safetensors weight files")


def _check_header(path: Path) -> None:
    """A safetensors file starts with the 8-byte little-endian length of a JSON header: checked here, before
    any weight is read, so that another format under that name is refused in one line."""
    header = None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            n = int.from_bytes(f.read(8), "little")
            if size >= 8 and 2 <= n <= min(size - 8, _MAX_HEADER):
                header = json.loads(f.read(n))
    except OSError as e:
        raise WeightFormatError(f"{str(path)!r} cannot be read ({e.strerror}); check the file's permissions") from e
    except ValueError:  # not UTF-8 or not JSON
        pass
    if not isinstance(header, dict):
        raise WeightFormatError(f"{str(path)!r} is not a safetensors file (no safetensors header); replace it with "
                                "the checkpoint's safetensors weights")


_MAX_HEADER = 100_000_000  # the safetensors format's own limit on the header


def load_model_spec(model_dir: str | Path) -> ModelSpec:
    """Read and validate `config.json` (a multimodal checkpoint's language model's); check that safetensors weights
    exist. Loads no weights."""
    cfg = language_model_config(read_config(model_dir))
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} in {str(Path(model_dir) / 'config.json')!r} is not supported"
            f"{unsupported_reason(cfg)}; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    check_safetensors(model_dir)
    return spec_from_config(cfg, Path(model_dir) / "config.json")


def spec_from_config(cfg: dict, where: str | Path = "config.json") -> ModelSpec:
    cfg = language_model_config(cfg)
    try:
        common = _common_fields(cfg)
        extra = _opt_fields(cfg) if cfg["model_type"] in OPT_TYPES else family_fields(cfg)
    except KeyError as e:
        raise UnsupportedModelError(f"config.json lacks the field {e.args[0]!r} needed for {cfg.get('model_type')}") from e
    return ModelSpec(**common, **extra, quantization=checkpoint_quantization(cfg, where))


def unsupported_reason(cfg: dict) -> str:
    """Why a model_type that is not supported is refused, where it is one of a kind: its layers of a kind not
    built (linear attention), or its experts; "" otherwise."""
    kinds = sorted(set(cfg.get("layer_types") or ()) - {"full_attention", "sliding_attention"})
    if kinds:
        return f" (its layers of kind {', '.join(kinds)} are not built)"
    if any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        return " (a mixture of experts of a kind not built; built: mixtral, qwen2_moe, qwen3_moe, gpt_oss)"
    if "text_config" in cfg:
        return (" (a multimodal checkpoint: its language model is read for "
                f"{', '.join(LANGUAGE_MODELS)} only; pass a text-only checkpoint of the language model)")
    return ""


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def _common_fields(cfg: dict) -> dict:
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    return dict(
        model_type=cfg["model_type"],
        num_layers=cfg["num_hidden_layers"],
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        eos_token_ids=_ids(cfg.get("eos_token_id")),
        bos_token_id=cfg.get("bos_token_id"),
        pad_token_id=cfg.get("pad_token_id"),
        checkpoint_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
    )


def _opt_fields(cfg: dict) -> dict:
    if not cfg.get("layer_norm_elementwise_affine", True):
        raise UnsupportedModelError("OPT with layer_norm_elementwise_affine=false is not supported")
    if not cfg.get("enable_bias", True):
        raise UnsupportedModelError("OPT with enable_bias=false is not supported")
    pre_ln = cfg.get("do_layer_norm_before", True)
    return dict(
        ffn_size=cfg["ffn_dim"],
        norm_eps=1e-5,
        tie_word_embeddings=cfg.get("tie_word_embeddings", True),
        word_embed_proj_dim=cfg.get("word_embed_proj_dim") or cfg["hidden_size"],
        do_layer_norm_before=pre_ln,
        final_layer_norm=pre_ln and not cfg.get("_remove_final_layer_norm", False),
        activation=cfg.get("activation_function", "relu"),
    )
