"""The Llama family (Llama 2/3, Mistral, Qwen2): RMSNorm, rotary positions, GQA attention, SwiGLU MLP."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from engine.checkpoint import LayerWeights, require
from engine.kernels.native import NativeKernels
from engine.kernels.rope import inv_frequencies
from engine.models import Family, StepContext, by_rows, head_weight
from engine.spec import ModelSpec


class LlamaModel(Family):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, kernels: NativeKernels):
        super().__init__(spec, dtype, kernels)
        self.inv_freq = inv_frequencies(spec.rope, spec.head_dim)

    def begin_step(self, ctx: StepContext) -> StepContext:
        return replace(ctx, rope=self.kernels.rope_tables(self.inv_freq, ctx.positions, self.dtype))

    def embed(self, gw: LayerWeights, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        # the residual stream stays float32 whatever the compute dtype: adding small updates to a large
        # residual in bf16 loses them, and that is where bf16 runs drift from float32 ones
        return F.embedding(ids, require(gw, "embed_tokens.weight", "the embeddings")).float()

    def layer(self, lw: LayerWeights, h: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        eps, kernels = self.spec.norm_eps, self.kernels
        x = kernels.rms_norm(h, require(lw, "input_layernorm.weight", f"layer {i}"), eps)
        norm = require(lw, "post_attention_layernorm.weight", f"layer {i}")
        # a new h: the layer's input may be stored elsewhere; x = the MLP's input, normed in the same pass
        h, x = kernels.add_rms_norm(h, self._attention(lw, x, ctx, i), norm, eps, in_place=False)
        return by_rows(lambda r, xr: r.add_(self._mlp(lw, xr)), h, 2 * self.spec.ffn_size, x)

    def _attention(self, lw: LayerWeights, x: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        B, S, _ = x.shape
        NH, KVH, D = self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim
        p, linear = "self_attn.", self.kernels.linear
        qkv = linear(x, lw[p + "qkv_proj.weight"], lw.get(p + "qkv_proj.bias"))  # [B, S, (NH + 2 KVH) D]
        q, k, v = self.kernels.rope_qkv(qkv, ctx.rope, NH, KVH, D)  # [B, NH | KVH, S, D], q and k rotated
        o = ctx.attend(i, q, k, v)  # [B, NH, S, D]
        o = o.transpose(1, 2).reshape(B, S, NH * D)
        return linear(o, lw[p + "o_proj.weight"], lw.get(p + "o_proj.bias"))

    def _mlp(self, lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        p, linear = "mlp.", self.kernels.linear
        gate_up = linear(x, lw[p + "gate_up_proj.weight"], lw.get(p + "gate_up_proj.bias"))  # [*, 2F]
        return linear(self._gate(gate_up), lw[p + "down_proj.weight"], lw.get(p + "down_proj.bias"))

    def _gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up [*, F]: the fused kernel for SiLU (Llama's), PyTorch for the other activations."""
        if self.spec.activation == "silu":
            return self.kernels.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act(gate).mul_(up)

    def head(self, gw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        h = self.kernels.rms_norm(h, require(gw, "norm.weight", "the final norm"), self.spec.norm_eps)
        return self.kernels.linear(h, head_weight(gw, self.spec)).float()
