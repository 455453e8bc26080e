"""`ModelSpec`: the shape of a checkpoint, read from its `config.json`, validated before any weight is loaded."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelNotFoundError, UnsupportedModelError, WeightFormatError

OPT_TYPES = ("opt",)
LLAMA_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_TYPES = OPT_TYPES + LLAMA_TYPES
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding settings (`rope_type` default / linear / llama3)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_scaling type {self.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine and the planner need to know about a model's shape. `family` is "opt" or
    "llama" (Llama, Mistral, Qwen2 share one code path)."""

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
    # OPT
    word_embed_proj_dim: int | None = None
    do_layer_norm_before: bool = True
    final_layer_norm: bool = True
    activation: str = "silu"
    checkpoint_dtype: str = "float32"
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
        if self.activation not in ("relu", "silu", "gelu"):
            raise UnsupportedModelError(f"activation {self.activation!r} is not supported; use relu/silu/gelu")

    @property
    def params_per_layer(self) -> int:
        """Weights (and biases) of one transformer layer, in elements."""
        h, d, ffn = self.hidden_size, self.head_dim, self.ffn_size
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.family == "opt":
            return attn + (q + 2 * kv + h) + 2 * h * ffn + ffn + h + 4 * h
        mlp = 3 * h * ffn + (2 * ffn + h if self.mlp_bias else 0)
        return attn + (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0) + mlp + 2 * h

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
    """Read and validate `config.json`; check that safetensors weights exist. Loads no weights."""
    cfg = read_config(model_dir)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} in {str(Path(model_dir) / 'config.json')!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_TYPES)}"
        )
    check_safetensors(model_dir)
    return spec_from_config(cfg)


def spec_from_config(cfg: dict) -> ModelSpec:
    try:
        common = _common_fields(cfg)
        extra = _opt_fields(cfg) if cfg["model_type"] in OPT_TYPES else _llama_fields(cfg)
    except KeyError as e:
        raise UnsupportedModelError(f"config.json lacks the field {e.args[0]!r} needed for {cfg.get('model_type')}") from e
    return ModelSpec(**common, **extra)


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


def _llama_fields(cfg: dict) -> dict:
    model_type = cfg["model_type"]
    attention_bias = cfg.get("attention_bias", False)
    window = cfg.get("sliding_window")
    if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
        window = None
    return dict(
        ffn_size=cfg["intermediate_size"],
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        rope=_rope_spec(cfg),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=cfg.get("mlp_bias", False),
        sliding_window=window,
        activation=cfg.get("hidden_act", "silu"),
    )


def _rope_spec(cfg: dict) -> RopeSpec:
    """Accept both layouts: `rope_theta` + `rope_scaling` (transformers 4) and `rope_parameters` (5)."""
    params = dict(cfg.get("rope_parameters") or {})
    params.update(cfg.get("rope_scaling") or {})
    theta = params.get("rope_theta") or cfg.get("rope_theta") or 10000.0
    rope_type = params.get("rope_type", params.get("type", "default"))
    kwargs = {k: params[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings") if params.get(k) is not None}
    return RopeSpec(theta=float(theta), rope_type=rope_type, **kwargs)
