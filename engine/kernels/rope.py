"""Rotary position embeddings with the `default`, `linear`, `llama3` and `longrope` frequency rules, over all of
each head's dimensions or its first `rotary_dim` (partial rotary: the rest pass through)."""

from __future__ import annotations

import math

import torch

from engine.rope_spec import RopeSpec


def inv_frequencies(rope: RopeSpec, head_dim: int, long: bool = False) -> torch.Tensor:
    """[rotary_dim / 2] float32 angular frequencies, after the scaling rule of `rope.rope_type` (longrope: its
    short factors, or with `long` its long ones). rotary_dim is head_dim times `rope.partial`."""
    dim = int(head_dim * rope.partial) // 2 * 2
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if rope.rope_type == "longrope":
        factors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
        return 1.0 / (factors * rope.theta**exponents)
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope)
    if rope.rope_type == "yarn":
        return _yarn_scale(rope.theta**exponents, rope, dim)
    return inv_freq


def _yarn_scale(powers: torch.Tensor, rope: RopeSpec, dim: int) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than `beta_slow` times over the original context are divided by `factor`,
    those that turn more than `beta_fast` times are kept, and the band between is blended linearly by dimension.
    `powers` are theta^(2i / dim), the inverse of the plain frequencies."""
    def dim_of(turns: float) -> float:  # the dimension whose frequency turns `turns` times over the original context
        return dim * math.log(rope.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low if high != low else 0.001)).clamp(0, 1)
    kept = 1 - ramp
    return 1.0 / (rope.factor * powers) * (1 - kept) + 1.0 / powers * kept


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    """Long wavelengths are divided by `factor`, short ones kept, and the band between blended linearly in
    (original context / wavelength)."""
    old_ctx = rope.original_max_position_embeddings
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    """positions [B, S] -> cos, sin [B, 1, S, R] in `dtype` (computed in float32, times `scale`), R = 2 x the
    frequencies."""
    freqs = positions.float().unsqueeze(-1) * inv_freq.view(1, 1, -1)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def longrope_cos_sin(rope: RopeSpec, short: torch.Tensor, long: torch.Tensor, positions: torch.Tensor,
                     dtype: torch.dtype):
    """LongRoPE's tables, scaled by `rope.attention_factor`: a row whose sequence so far (its last position + 1)
    is longer than the original context rotates this step's positions by the long factors, the others by the short
    ones (the rule of the checkpoints' own code; keys stored at earlier steps keep the rotation they had)."""
    tables = cos_sin(short, positions, dtype, rope.attention_factor)
    beyond = positions.amax(-1) + 1 > rope.original_max_position_embeddings  # [B]
    if not bool(beyond.any()):
        return tables
    far = cos_sin(long, positions, dtype, rope.attention_factor)
    pick = beyond.view(-1, 1, 1, 1)
    return tuple(torch.where(pick, f, t) for f, t in zip(far, tables))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D] rotated by position: with halves (x1, x2) of its first R dims (R = cos's last dim; the
    others pass through) and c, s the first half of cos, sin, out = (x1 c - x2 s, x2 c + x1 s), i.e.
    x * cos + rotate_half(x) * sin, without building rotate_half(x)."""
    rot = cos.shape[-1]
    half = rot // 2
    x1, x2 = x[..., :half], x[..., half:rot]
    c, s = cos[..., :half], sin[..., :half]
    out = torch.empty_like(x)
    if rot < x.shape[-1]:
        out[..., rot:] = x[..., rot:]
    o1, o2 = out[..., :half], out[..., half:rot]
    torch.mul(x1, c, out=o1)
    o1.sub_(x2 * s)
    torch.mul(x2, c, out=o2)
    o2.add_(x1 * s)
    return out
