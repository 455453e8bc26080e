"""OPT: learned positions (offset 2), LayerNorm before (or, for 350m, after) each block, ReLU MLP with biases,
optional project_in/project_out when word_embed_proj_dim != hidden_size, head tied to the embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.checkpoint import LayerWeights, require
from engine.kernels.native import NativeKernels
from engine.models import Family, StepContext, by_rows, head_weight
from engine.spec import ModelSpec

POSITION_OFFSET = 2


class OPTModel(Family):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype, kernels: NativeKernels):
        super().__init__(spec, dtype, kernels)
        self.scaling = spec.head_dim**-0.5

    def begin_step(self, ctx: StepContext) -> StepContext:
        return ctx  # learned positions: no per-step tables

    def _ln(self, x: torch.Tensor, w: LayerWeights, name: str) -> torch.Tensor:
        """LayerNorm in float32; the result is cast to the compute dtype."""
        weight, bias = w[name + ".weight"], w[name + ".bias"]
        out = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), self.spec.norm_eps)
        return out.to(weight.dtype)

    def embed(self, gw: LayerWeights, ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = F.embedding(ids, require(gw, "embed_tokens.weight", "the embeddings"))
        if "project_in.weight" in gw:
            x = self.kernels.linear(x, gw["project_in.weight"])
        pos = F.embedding(ctx.positions + POSITION_OFFSET, require(gw, "embed_positions.weight", "the positions"))
        return x.float() + pos.float()  # the residual stream stays float32 (see llama.py)

    def layer(self, lw: LayerWeights, h: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        pre, dt = self.spec.do_layer_norm_before, self.dtype
        x = self._ln(h, lw, "self_attn_layer_norm") if pre else h.to(dt)
        h = h + self._attention(lw, x, ctx, i)
        if not pre:
            h = self._ln(h, lw, "self_attn_layer_norm").float()
        if pre:
            return by_rows(lambda r: r.add_(self._mlp(lw, self._ln(r, lw, "final_layer_norm"))), h, self.spec.ffn_size)
        h = h + self._mlp(lw, h.to(dt))
        return self._ln(h, lw, "final_layer_norm").float()

    def _mlp(self, lw: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        linear = self.kernels.linear
        return linear(self.act(linear(x, lw["fc1.weight"], lw["fc1.bias"])), lw["fc2.weight"], lw["fc2.bias"])

    def _attention(self, lw: LayerWeights, x: torch.Tensor, ctx: StepContext, i: int) -> torch.Tensor:
        B, S, _ = x.shape
        NH, D = self.spec.num_heads, self.spec.head_dim
        p, linear = "self_attn.", self.kernels.linear
        q, k, v = linear(x, lw[p + "qkv_proj.weight"], lw[p + "qkv_proj.bias"]).split(NH * D, dim=-1)
        q = (q * self.scaling).view(B, S, NH, D).transpose(1, 2)
        k, v = (t.view(B, S, NH, D).transpose(1, 2) for t in (k, v))
        o = ctx.attend(i, q, k, v, scale=1.0)  # [B, NH, S, D]
        o = o.transpose(1, 2).reshape(B, S, NH * D)
        return linear(o, lw[p + "out_proj.weight"], lw[p + "out_proj.bias"])

    def head(self, gw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        h = self._ln(h, gw, "final_layer_norm") if self.spec.final_layer_norm else h.to(self.dtype)
        if "project_out.weight" in gw:
            h = self.kernels.linear(h, gw["project_out.weight"])
        return self.kernels.linear(h, head_weight(gw, self.spec)).float()
