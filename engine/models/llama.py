"""The rotary decoder: RMSNorm, rotary positions, GQA attention, a gated MLP. Llama 2/3, Mistral and Qwen2 are it as
it is; the other families are its settings in the spec (engine/config_fields.py says which each one sets):

    block           where the norms sit: "pre" (before attention and the MLP), "sandwich" (before and after
                    each, Gemma 2/3), "post" (after each, OLMo 2)
    norm_offset     RMSNorm scales by (1 + w) (Gemma)
    qk_norm         q and k RMSNormed before RoPE, over each head (Qwen3, Gemma 3) or the projection (OLMo 2)
    rope_layers     which rotary table each layer uses: the global one, the sliding layers' own (Gemma 3), or
                    none (SmolLM3's NoPE layers); partial rotary and LongRoPE (Phi-3/4) are in the tables
    sliding_layers  which layers attend through the sliding window (Mistral: all; Gemma 2/3: alternating)
    moe_layers      which layers have a mixture of experts in place of the MLP (Mixtral, Qwen-MoE:
                    engine/models/experts.py)
    embed_scale, residual_scale, attn_scale, logit_divisor, final_softcap
                    Gemma's sqrt(hidden) embeddings and query scale, Granite's four multipliers, Gemma 2's logit cap

Phi-3's fused qkv_proj / gate_up_proj are this layer's own fused weights (engine/kernels/fuse.py)."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from engine.checkpoint import LayerWeights, require
from engine.kernels.attention import ScoreRule, window_mask
from engine.kernels.layer_ops import split_heads
from engine.kernels.native import NativeKernels
from engine.kernels.rope import cos_sin, inv_frequencies, longrope_cos_sin
from engine.models import Family, StepContext, by_rows, head_weight
from engine.models.experts import moe_block
from engine.rope_spec import RopeSpec
from engine.spec import ModelSpec


class LlamaModel(Family):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, kernels: NativeKernels):
        super().__init__(spec, dtype, kernels)
        self.ropes = [r for r in (spec.rope, spec.rope_local) if r is not None]  # index: spec.rope_layers[i]
        self.inv_freqs = [(inv_frequencies(r, spec.head_dim), inv_frequencies(r, spec.head_dim, long=True)
                           if r.rope_type == "longrope" else None) for r in self.ropes]
        self.mlp_width = 2 * spec.ffn_size

    def begin_step(self, ctx: StepContext) -> StepContext:
        tables = tuple(self._tables(r, freqs, ctx.positions) for r, freqs in zip(self.ropes, self.inv_freqs))
        window = self.spec.sliding_window
        return replace(ctx, rope=tables, window_mask=None if window is None else window_mask(ctx.mask, window))

    def _tables(self, rope: RopeSpec, freqs, positions: torch.Tensor):
        """One rotary table for the step: the backend's where the rule is plain, else cos/sin made here (LongRoPE's
        per-position factors, a scale on cos and sin, partial rotary)."""
        short, long = freqs
        if long is not None:
            return longrope_cos_sin(rope, short, long, positions, self.dtype)
        if rope.attention_factor != 1.0 or rope.partial != 1.0:
            return cos_sin(short, positions, self.dtype, rope.attention_factor)
        return self.kernels.rope_tables(short, positions, self.dtype)

    def embed(self, gw: LayerWeights, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        # the residual stream stays float32 whatever the compute dtype: adding small updates to a large
        # residual in bf16 loses them, and that is where bf16 runs drift from float32 ones
        x = F.embedding(ids, require(gw, "embed_tokens.weight", "the embeddings"))
        if self.spec.embed_scale != 1.0:  # scaled in the weights' dtype, as the checkpoints' own code does
            x = x * torch.tensor(self.spec.embed_scale, dtype=x.dtype)
        return x.float()

    def _norm_weight(self, w: LayerWeights, name: str, where: str) -> torch.Tensor:
        weight = require(w, name, where)
        if self.spec.norm_offset:
            return (weight.float() + self.spec.norm_offset).to(weight.dtype)
        return weight

    def _norm(self, x: torch.Tensor, w: LayerWeights, name: str, where: str) -> torch.Tensor:
        """RMSNorm of x [*, W] (any dtype, any strides) by weight `name` of `w`, in the weight's dtype."""
        return self.kernels.rms_norm(x.float().contiguous(), self._norm_weight(w, name, where), self.spec.norm_eps)

    def layer(self, lw: LayerWeights, h: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        block = self.spec.block
        if block == "sandwich":
            return self._sandwich_block(lw, h, ctx, i)
        if block == "post":
            return self._post_block(lw, h, ctx, i)
        eps, kernels, scale = self.spec.norm_eps, self.kernels, self.spec.residual_scale
        x = kernels.rms_norm(h, self._norm_weight(lw, "input_layernorm.weight", f"layer {i}"), eps)
        a = self._attention(lw, x, ctx, i)
        norm = self._norm_weight(lw, "post_attention_layernorm.weight", f"layer {i}")
        # a new h: the layer's input may be stored elsewhere; x = the MLP's input, normed in the same pass
        h, x = kernels.add_rms_norm(h, a if scale == 1.0 else a.mul_(scale), norm, eps, in_place=False)
        if scale == 1.0:
            return by_rows(lambda r, xr: r.add_(self._ffn(lw, xr, i)), h, self.mlp_width, x)
        return by_rows(lambda r, xr: r.add_(self._ffn(lw, xr, i).mul_(scale)), h, self.mlp_width, x)

    def _sandwich_block(self, lw: LayerWeights, h: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        """Gemma 2/3: each block's input and output normed, its normed output added to the residual."""
        where, eps = f"layer {i}", self.spec.norm_eps
        x = self.kernels.rms_norm(h, self._norm_weight(lw, "input_layernorm.weight", where), eps)
        a = self._norm(self._attention(lw, x, ctx, i), lw, "post_attention_layernorm.weight", where)
        norm = self._norm_weight(lw, "pre_feedforward_layernorm.weight", where)
        h, x = self.kernels.add_rms_norm(h, a, norm, eps, in_place=False)
        post = "post_feedforward_layernorm.weight"
        return by_rows(lambda r, xr: r.add_(self._norm(self._ffn(lw, xr, i), lw, post, where)), h, self.mlp_width, x)

    def _post_block(self, lw: LayerWeights, h: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        """OLMo 2: each block reads the residual as it is; its normed output is added."""
        where = f"layer {i}"
        h = h + self._norm(self._attention(lw, h.to(self.dtype), ctx, i), lw, "post_attention_layernorm.weight", where)
        post = "post_feedforward_layernorm.weight"
        return by_rows(lambda r: r.add_(self._norm(self._ffn(lw, r.to(self.dtype), i), lw, post, where)), h,
                       self.mlp_width)

    def _attention(self, lw: LayerWeights, x: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        B, S, _ = x.shape
        NH, D = self.spec.num_heads, self.spec.head_dim
        p, linear = "self_attn.", self.kernels.linear
        qkv = linear(x, lw[p + "qkv_proj.weight"], lw.get(p + "qkv_proj.bias"))  # [B, S, (NH + 2 KVH) D]
        q, k, v = self._heads(lw, qkv, ctx, i)  # [B, NH | KVH, S, D], q and k normed and rotated where the model does
        o = ctx.attend(i, q, k, v, self.spec.attn_scale, self.spec.sliding_layers[i], self._rule(lw))
        o = o.transpose(1, 2).reshape(B, S, NH * D)
        return linear(o, lw[p + "o_proj.weight"], lw.get(p + "o_proj.bias"))

    def _rule(self, lw: LayerWeights) -> ScoreRule | None:
        """The layer's score rule: Gemma 2's cap, gpt-oss's sinks; None for a model with neither."""
        sinks = lw.get("self_attn.sinks")
        if sinks is None and self.spec.attn_softcap is None:
            return None
        return ScoreRule(self.spec.attn_softcap, sinks)

    def _heads(self, lw: LayerWeights, qkv: torch.Tensor, ctx: StepContext, i: int):
        """qkv [B, S, (NH + 2 KVH) D] -> q [B, NH, S, D], k, v [B, KVH, S, D]: q and k normed in place in qkv where
        the model norms them, then rotated (in place where the fused kernel takes them) unless a NoPE layer."""
        B, S, _ = qkv.shape
        NH, KVH, D = self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim
        if self.spec.qk_norm is not None:
            per_head = self.spec.qk_norm == "head"
            for name, lo, heads in (("q_norm", 0, NH), ("k_norm", NH * D, KVH)):
                part = qkv[..., lo : lo + heads * D]
                part = part.view(B, S, heads, D) if per_head else part
                part.copy_(self._norm(part, lw, f"self_attn.{name}.weight", f"layer {i}"))
        kind = self.spec.rope_layers[i]
        if kind < 0:
            return split_heads(qkv, NH, KVH, D)
        return self.kernels.rope_qkv(qkv, ctx.rope[kind], NH, KVH, D)

    def _ffn(self, lw: LayerWeights, x: torch.Tensor, i: int) -> torch.Tensor:
        """Layer i's feed-forward part: its MLP, or its mixture of experts (engine/models/experts.py)."""
        return moe_block(self, lw, x) if self.spec.moe_layers[i] else self._mlp(lw, x)

    def _mlp(self, lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        p, linear = "mlp.", self.kernels.linear
        gate_up = linear(x, lw[p + "gate_up_proj.weight"], lw.get(p + "gate_up_proj.bias"))  # [*, 2F]
        return linear(self._gate(gate_up), lw[p + "down_proj.weight"], lw.get(p + "down_proj.bias"))

    def _gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up [*, F]: the fused kernel for SiLU (Llama's), PyTorch for the other activations and for
        gpt-oss's clamped form."""
        if self.spec.gate_limit is not None:
            return clamped_swiglu(gate_up, self.spec.gate_limit, self.spec.gate_alpha)
        if self.spec.activation == "silu":
            return self.kernels.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act(gate).mul_(up)

    def head(self, gw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        h = self.kernels.rms_norm(h, self._norm_weight(gw, "norm.weight", "the final norm"), self.spec.norm_eps)
        logits = self.kernels.linear(h, head_weight(gw, self.spec)).float()
        if self.spec.logit_divisor != 1.0:
            logits = logits / self.spec.logit_divisor
        cap = self.spec.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def clamped_swiglu(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """gpt-oss's gate: gate_up [*, 2F] (gate, then up) -> (up + 1) * gate * sigmoid(alpha * gate) [*, F], the gate
    clamped from above and up to [-limit, limit]."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))
