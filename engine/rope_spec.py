"""`RopeSpec`: a model's rotary position settings, as its config.json gives them (engine/config_fields.py reads
them; engine/kernels/rope.py computes with them)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import UnsupportedModelError

ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding settings (`rope_type` default / linear / llama3 / longrope / yarn). `partial` is the share of
    each head's dimensions that rotate (the rest pass through); longrope's `short_factor` / `long_factor` divide
    the frequencies below / from `original_max_position_embeddings`; yarn blends interpolated (/ factor) and kept
    frequencies over the dimensions between `beta_fast` and `beta_slow` rotations (bounds rounded out where
    `truncate`); `attention_factor` scales cos and sin."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial: float = 1.0
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_scaling type {self.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )
        if not 0 < self.partial <= 1:
            raise UnsupportedModelError(f"partial_rotary_factor {self.partial} is not in (0, 1]")
