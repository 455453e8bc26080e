"""Tiny random-weight checkpoints quantized as GPTQ, AWQ and FP8 checkpoints are published, packed here following
each format exactly (GPTQModel/transformers' GPTQ loader and AutoAWQ need a CUDA build of torch, so neither packs
on these machines): GPTQ as AutoGPTQ's `QuantLinear.pack` (int32 words along `in`, zeros stored minus one,
g_idx per input column), AWQ as AutoAWQ's `WQLinear_GEMM.from_linear` (int32 words along `out` in the order
0 2 4 6 1 3 5 7), FP8 as DeepSeek-V3's block-wise e4m3 with float32 `weight_scale_inv`. Beside each a reference
checkpoint holds the same weights dequantized from the packer's own codes, zeros and scales (never from the
packed bytes), in float32, for transformers' forward."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.checkpoints import make_tokenizer

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _pack_rows(nibbles: torch.Tensor) -> torch.Tensor:
    """[8 m, n] values in [0, 15] -> int32 [m, n], row 8 i + j in bits 4j.. of word row i (GPTQ's qweight)."""
    v = nibbles.to(torch.int64).view(-1, 8, nibbles.shape[1])
    return _to_int32(sum(v[:, j] << (4 * j) for j in range(8)))


def _pack_cols(nibbles: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """[m, 8 n] -> int32 [m, n], column 8 c + order[i] in bits 4i.. of word column c."""
    v = nibbles.to(torch.int64).view(nibbles.shape[0], -1, 8)
    return _to_int32(sum(v[..., order[i]] << (4 * i) for i in range(8)))


def gptq_quantize(w: torch.Tensor, group: int, sym: bool, act_order: bool, gen: torch.Generator, v2: bool = False):
    """w [out, in] -> (stored parts, dense reference [out, in] float32): GPTQ's min-max grid per group (its
    Quantizer: the range widened to hold 0; sym: zero 8), round to nearest (no Hessian: the format is what is
    tested); zeros stored minus one (checkpoint_format gptq) or as they are (`v2`: gptq_v2)."""
    out, cols = w.shape
    g_idx = torch.arange(cols) // group
    if act_order:  # columns quantized in a shuffled order, groups formed along that order
        perm = torch.randperm(cols, generator=gen)
        g_idx = torch.empty_like(g_idx)
        g_idx[perm] = torch.arange(cols) // group
    ng = math.ceil(cols / group)
    scales, zeros = torch.empty(ng, out), torch.empty(ng, out, dtype=torch.int64)
    for g in range(ng):
        x = w[:, g_idx == g]
        lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)
        if sym:
            hi = torch.maximum(-lo, hi)
            lo = -hi
        s = ((hi - lo) / 15).half().float()
        scales[g] = s
        zeros[g] = 8 if sym else torch.round(-lo / s).clamp(1, 15).long()  # >= 1: the gptq format stores z - 1
    s_k, z_k = scales[g_idx].T, zeros[g_idx].T  # [out, in]
    q = (torch.round(w / s_k) + z_k).clamp(0, 15).long()
    parts = {"qweight": _pack_rows(q.T), "qzeros": _pack_cols(zeros if v2 else zeros - 1), "scales": scales.half(),
             "g_idx": g_idx.to(torch.int32)}
    return parts, (q - z_k) * s_k


def awq_quantize(w: torch.Tensor, group: int):
    """w [out, in] -> (stored parts, dense reference): AutoAWQ's asymmetric min-max per group (zero_point=True)."""
    out, cols = w.shape
    x = w.reshape(out, cols // group, group)
    lo, hi = x.amin(-1), x.amax(-1)
    s = ((hi - lo).clamp(min=1e-5) / 15).half().float()  # [out, ng]
    z = (-torch.round(lo / s)).clamp(0, 15).long()
    q = (torch.round(x / s[..., None]) + z[..., None]).clamp(0, 15).long()
    ref = ((q - z[..., None]) * s[..., None]).reshape(out, cols)
    parts = {"qweight": _pack_cols(q.reshape(out, cols).T, AWQ_ORDER), "qzeros": _pack_cols(z.T, AWQ_ORDER),
             "scales": s.T.contiguous().half()}
    return parts, ref


def fp8_quantize(w: torch.Tensor, block: tuple[int, int]):
    """w [out, in] -> (stored parts, dense reference): e4m3 values with one float32 scale per block (amax / 448)."""
    out, cols = w.shape
    br, bc = block
    x = w.reshape(out // br, br, cols // bc, bc)
    scale = x.abs().amax(dim=(1, 3)) / 448.0  # [out / br, in / bc]
    q = (x / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    ref = (q.float() * scale[:, None, :, None]).reshape(out, cols)
    return {"weight": q.reshape(out, cols), "weight_scale_inv": scale}, ref


def make_quantized(root: Path, method: str, family: str = "llama", **kw) -> tuple[Path, Path]:
    """(quantized checkpoint, reference checkpoint of the same weights dequantized), tiny random `family` models
    (hidden 128, 2 layers) quantized by `method` ("gptq", "awq", "fp8") with the packer's options `kw`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cls = Qwen2Config if family == "qwen2" else LlamaConfig
    config = cls(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=320, max_position_embeddings=128, initializer_range=0.2,
                 bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    plain = root / "plain"
    AutoModelForCausalLM.from_config(config).save_pretrained(plain)
    make_tokenizer(plain)
    quant, ref = root / f"{method}", root / f"{method}-reference"
    shutil.copytree(plain, quant)
    shutil.copytree(plain, ref)
    stored, dense = _quantize_state(load_file(plain / "model.safetensors"), method, kw)
    save_file(stored, quant / "model.safetensors", metadata={"format": "pt"})
    save_file(dense, ref / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((quant / "config.json").read_text())
    cfg["quantization_config"] = _quant_config(method, kw)
    (quant / "config.json").write_text(json.dumps(cfg, indent=2))
    return quant, ref


def _quantize_state(state: dict, method: str, kw: dict) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(1)
    stored, dense = {}, {}
    for name, t in state.items():
        base = name.removesuffix(".weight")
        if not (".layers." in name and base.rsplit(".", 1)[-1] in LINEARS and name.endswith(".weight")):
            stored[name] = dense[name] = t
            continue
        if method == "gptq":
            parts, w = gptq_quantize(t.float(), kw["group_size"], kw["sym"], kw["desc_act"], gen)
        elif method == "awq":
            parts, w = awq_quantize(t.float(), kw["group_size"])
        else:
            parts, w = fp8_quantize(t.float(), tuple(kw["weight_block_size"]))
        stored |= {f"{base}.{p}": v.contiguous() for p, v in parts.items()}
        dense[name] = w.contiguous()
    return stored, dense


def _quant_config(method: str, kw: dict) -> dict:
    if method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": kw["group_size"], "desc_act": kw["desc_act"],
                "sym": kw["sym"], "checkpoint_format": "gptq", "pack_dtype": "int32", "lm_head": False}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": kw["group_size"], "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(kw["weight_block_size"])}


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stacked weight [E, in, out] as gpt-oss publishes it in MXFP4: blocks [E, out, in / 32, 16] uint8 (two e2m1
    codes a byte, the low nibble first) and e8m0 scales [E, out, in / 32] uint8, each block's scale the power of
    two that brings its largest magnitude to at most 6, each value rounded to the nearest e2m1 value."""
    t = w.float().transpose(1, 2)  # [E, out, in]
    groups = t.reshape(*t.shape[:2], -1, 32)
    top = groups.abs().amax(-1).clamp(min=2.0**-120)
    exponent = torch.ceil(torch.log2(top / 6.0))
    scaled = groups / torch.ldexp(torch.ones_like(exponent), exponent.int())[..., None]
    codes = (scaled.abs()[..., None] - E2M1).abs().argmin(-1) + 8 * (scaled < 0)  # sign in the nibble's top bit
    codes = codes.to(torch.uint8).reshape(*groups.shape[:3], 16, 2)
    return codes[..., 0] | (codes[..., 1] << 4), (exponent + 127).to(torch.uint8)


def make_mxfp4_gpt_oss(root: Path) -> Path:
    """A tiny random gpt-oss checkpoint with its experts in MXFP4 (every other tensor as saved, float32) and the
    `quantization_config` gpt-oss publishes."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    config = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=128,
                          num_local_experts=4, num_experts_per_tok=2, sliding_window=6, swiglu_limit=1.5,
                          initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    out = root / "mxfp4"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    make_tokenizer(out)
    state = load_file(out / "model.safetensors")
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        state[name + "_blocks"], state[name + "_scales"] = mxfp4_quantize(state.pop(name))
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                       "model.layers.*.mlp.router",
                                                                                       "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
