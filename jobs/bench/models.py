"""What the engine benchmark runs on: random-weight checkpoints of the Llama, OPT, Qwen3 and Gemma 3 families and of
the Mixtral and Qwen3-MoE mixtures of experts (built once with `transformers` + `save_pretrained`, then cached),
prompts of an exact token length, the model-FLOP count of a run, and the process memory and machine facts that go
with each figure."""

from __future__ import annotations

import json
import logging
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.cache_root import CACHE_ROOT
from engine.dtypes import cpu_info
from engine.memory.footprint import active_linear_params
from engine.spec import ModelSpec
from jobs.bench.sharded_checkpoint import checkpoint_bytes, write_sharded_random

log = logging.getLogger(__name__)
DEFAULT_CACHE_DIR = CACHE_ROOT / "bench"
UNK = "<unk>"

FLOPS_FORMULA = (
    "per row: 2 * P_lin * (P + G - 1) + 2 * V * H * G + 4 * L * H_q * A, where P_lin = L * (2*H*H_q + 2*H*H_kv "
    "+ 3*H*F) are the Linear weights of the layers (embeddings and norms excluded; in a mixture of experts's "
    "layer, 3*H*F is the router's H*E, the shared expert's 3*H*F_shared and the k chosen experts' 3*H*F_e each: "
    "the weights one token runs through), P + G - 1 the tokens run "
    "through the layers (the prompt, then one per decode step), 2 * V * H * G the LM head on the last position "
    "of each step, and A = P*(P+1)/2 + sum_{t=1..G-1} (P + t) the causal query-key pairs (QK^T and AV, 2 flops "
    "each per query dimension)")


@dataclass(frozen=True)
class Preset:
    """A model shape of every benchmark: `family` names its `transformers` config class (FAMILY_CONFIGS), then the
    config's sizes, and `config_fields` the family's own fields as (name, value) pairs (head_dim, sliding_window,
    ...). Llama embeddings are tied (as in most ~300M Llama-family models): untied 32000-word embeddings plus head
    would alone be 20 % of the weights, more than the CPU budget of the disk line leaves once two layers are
    staged."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    family: str = "llama"
    config_fields: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        if self.family not in FAMILY_CONFIGS:
            raise ValueError(f"family {self.family!r}: expected one of {', '.join(FAMILY_CONFIGS)}")

    def hf_config(self):
        """The `transformers` config. No EOS: every row generates exactly max_new_tokens, as HF's
        min_new_tokens makes its rows do."""
        import transformers

        config_class = getattr(transformers, FAMILY_CONFIGS[self.family])
        common = dict(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                      num_attention_heads=self.num_attention_heads, vocab_size=self.vocab_size,
                      max_position_embeddings=self.max_position_embeddings, bos_token_id=None, eos_token_id=None,
                      pad_token_id=0, **dict(self.config_fields))
        if self.family == "opt":
            return config_class(ffn_dim=self.intermediate_size, word_embed_proj_dim=self.hidden_size,
                                do_layer_norm_before=True, **common)
        return config_class(intermediate_size=self.intermediate_size, num_key_value_heads=self.num_key_value_heads,
                            tie_word_embeddings=self.tie_word_embeddings, **common)

    def record(self) -> dict:
        """The preset as its checkpoint's complete.json records it; `config_fields` only where it has some, so the
        presets without them keep the record (and the cached checkpoints) they had before the field."""
        out = asdict(self) | {"config_fields": dict(self.config_fields)}
        if not self.config_fields:
            del out["config_fields"]
        return out


FAMILY_CONFIGS = {"llama": "LlamaConfig", "opt": "OPTConfig", "qwen3": "Qwen3Config", "gemma3": "Gemma3TextConfig",
                  "mixtral": "MixtralConfig", "qwen3_moe": "Qwen3MoeConfig"}


# tiny has 10 layers because weights 4x the CPU budget must still leave room for two staged layers and the
# embeddings (that needs layers >= 8 + 3 * embedding bytes / layer bytes).
PRESETS = {
    "tiny": Preset(128, 352, 10, 4, 4, 512, max_position_embeddings=512),
    "300m": Preset(1024, 2816, 20, 16, 16, 32000),
    "tiny1k": Preset(128, 352, 10, 4, 4, 512, max_position_embeddings=1024),  # W4 (jobs/bench/early_stop.py)
    "110m": Preset(768, 2048, 12, 12, 12, 32000),  # the shape of the workloads W1-W3 (jobs/bench/workloads.py)
    "100m": Preset(1024, 2816, 8, 16, 4, 32000),  # GQA: the shape vLLM's CPU build was measured on (bench workloads)
    "550m": Preset(1280, 3584, 24, 20, 20, 32000),  # ~1.1 GB in bf16: the memory-limit line (memory_limit.py)
    # real sizes, written shard by shard (jobs/bench/sharded_checkpoint.py): Llama-3-8B's layers with a 32k
    # vocabulary (~14.5 GB in bf16), and Llama-2-13B's shape (~26 GB)
    "7b": Preset(4096, 14336, 32, 32, 8, 32000, tie_word_embeddings=False),
    "13b": Preset(5120, 13824, 40, 40, 40, 32000, tie_word_embeddings=False),
    # today's families at the 100m preset's scale, their layers shaped as the smallest released models' are (bench
    # workloads --llama-cpp): Qwen3-0.6B's (q/k norms, head_dim 128 with 16 heads over hidden 1024, 8 KV heads,
    # FFN 3072, RoPE base 1e6, tied head) in 8 layers; Gemma 3 1B's (head_dim 256, 4 heads over 1 KV head, sliding
    # window 512 in 5 of every 6 layers, queries scaled by query_pre_attn_scalar 256, GELU-tanh, tied head) at
    # hidden 1024 with FFN 4096 in 6 layers: one 5:1 local/global pattern
    "qwen3-100m": Preset(1024, 3072, 8, 16, 8, 32000, family="qwen3",
                         config_fields=(("head_dim", 128), ("rope_theta", 1e6))),
    "gemma3-100m": Preset(1024, 4096, 6, 4, 1, 32000, family="gemma3",
                          config_fields=(("head_dim", 256), ("sliding_window", 512), ("query_pre_attn_scalar", 256))),
    # mixtures of experts at the same hidden size and depth, their layers shaped as the released models' are, untied
    # head as theirs (bench workloads --llama-cpp; a few times a memory limit in bench engine --memory-limit):
    # Mixtral 8x7B's (8 experts of FFN 3.5 x hidden, top 2 by a softmax over the top 2 logits, head_dim 128 with 4
    # query heads per KV head, RoPE base 1e6): 0.79 G weights (1.58 GB in bf16), 0.20 G run per token; Qwen3-30B-A3B's
    # (64 experts here of its 128, FFN 0.375 x hidden each, top 8 renormalized, 16 query heads of head_dim 128 over 2
    # KV heads, q/k norms; the dense FFN of 3 x hidden is never used: every layer is a mixture): 0.71 G weights (1.42
    # GB), 0.18 G run per token
    "mixtral-800m": Preset(1024, 3584, 8, 8, 2, 32000, tie_word_embeddings=False, family="mixtral",
                           config_fields=(("num_local_experts", 8), ("num_experts_per_tok", 2), ("rope_theta", 1e6))),
    "qwen3moe-700m": Preset(1024, 3072, 8, 16, 2, 32000, tie_word_embeddings=False, family="qwen3_moe",
                            config_fields=(("head_dim", 128), ("num_experts", 64), ("num_experts_per_tok", 8),
                                           ("moe_intermediate_size", 384), ("norm_topk_prob", True),
                                           ("rope_theta", 1e6))),
}
STREAM_ABOVE_BYTES = 4 << 30  # a checkpoint larger than this is written a shard at a time, not built in memory


def build_checkpoint(preset: str | Preset, cache_dir: str | Path | None = None, folder: str | None = None) -> Path:
    """The folder (cache_dir/`folder`, default the preset's name) of a preset's bf16 random-weight checkpoint
    with a word-level tokenizer, built on first use."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    out = Path(cache_dir or DEFAULT_CACHE_DIR) / (folder or str(preset))
    done = out / "complete.json"
    if done.is_file() and json.loads(done.read_text()) == p.record():
        return out
    out.mkdir(parents=True, exist_ok=True)
    log.info("building the %s checkpoint in %s", folder or preset, out)
    make_word_tokenizer(out, p.vocab_size)
    if p.family == "llama" and checkpoint_bytes(p.hf_config(), torch.bfloat16) > STREAM_ABOVE_BYTES:
        write_sharded_random(out, p.hf_config(), torch.bfloat16)
    else:
        save_random_model(out, p.hf_config(), torch.bfloat16)
    done.write_text(json.dumps(p.record()))
    return out


def save_random_model(out: Path, cfg, dtype: torch.dtype, seed: int = 0, adjust=None) -> Path:
    """Seeded random weights of a `transformers` config, `adjust(model)` applied, saved with `save_pretrained`
    (safetensors) into `out`; the generation config stops on the config's EOS (none: never). The one writer
    of the benchmarks' and the tests' random checkpoints."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.eos_token_id = cfg.eos_token_id
    if adjust is not None:
        adjust(model)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_word_tokenizer(out: Path, vocab_size: int):
    """A word-level tokenizer of `<unk>` and the words w1 .. w{vocab_size-1}, split on spaces: the text
    `prompt_text(ids)` tokenizes to exactly `ids`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {UNK: 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, pad_token=UNK)
    fast.save_pretrained(out)
    return fast


def prompt_ids(rows: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """`rows` prompts of `length` random word ids (never `<unk>`)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (rows, length), generator=g).tolist()


def prompt_text(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def linear_params(spec: ModelSpec) -> int:
    """Weights of the Linear layers of all transformer layers that one token runs through (what its GEMMs read): in
    a mixture's layer the router, the shared expert and `experts_per_token` experts, not every expert."""
    h, f = spec.hidden_size, spec.ffn_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    attention = 2 * h * q + 2 * h * kv
    mixture = active_linear_params(spec) - attention if spec.num_experts else 0
    return sum(attention + (mixture if moe else 3 * h * f) for moe in spec.moe_layers)


def model_flops(spec: ModelSpec, prompt_len: int, gen_len: int, rows: int) -> dict[str, float]:
    """Model FLOPs of generating `gen_len` tokens for `rows` prompts of `prompt_len` tokens (FLOPS_FORMULA)."""
    P, G = prompt_len, gen_len
    pairs = P * (P + 1) / 2 + sum(P + t for t in range(1, G))
    linear = 2 * linear_params(spec) * (P + G - 1)
    head = 2 * spec.vocab_size * spec.hidden_size * G
    attention = 4 * spec.num_layers * spec.num_heads * spec.head_dim * pairs
    return {"linear": rows * linear, "head": rows * head, "attention": rows * attention,
            "total": rows * (linear + head + attention)}


def layer_gemm_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """The (out, in) shapes of one layer's Linear weights: q, k, v, o, gate, up, down (of one expert in a mixture)."""
    h, f = spec.hidden_size, spec.expert_ffn_size if spec.num_experts else spec.ffn_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f)]


def layer_gemms(spec: ModelSpec, rows: int) -> list[tuple[int, int, int, int]]:
    """The GEMMs of one layer for `rows` tokens as (rows, out, in, how many distinct weights): q, k, v, o and the
    MLP's gate, up and down over every row; in a mixture, the router and shared expert over every row and each
    expert's gate, up and down over its share of the rows, rows * experts_per_token / num_experts rounded up (as
    random routing spreads them), for every expert."""
    h = spec.hidden_size
    shapes = layer_gemm_shapes(spec)
    if not spec.num_experts:
        return [(rows, n, k, 1) for n, k in shapes]
    e, fs = spec.num_experts, spec.shared_expert_ffn_size
    per_expert = -(-rows * spec.experts_per_token // e)
    shared = [(rows, fs, h, 1), (rows, fs, h, 1), (rows, h, fs, 1), (rows, 1, h, 1)] if fs else []
    return ([(rows, n, k, 1) for n, k in shapes[:4]] + [(rows, e, h, 1)] + shared
            + [(per_expert, n, k, e) for n, k in shapes[4:]])


def _status_kib(field: str) -> int:
    m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM) since start or since the last `reset_peak_rss`."""
    return _status_kib("VmHWM") * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def machine_info() -> dict:
    import transformers

    cpu = cpu_info("model name") or "unknown"
    try:
        import accelerate

        acc = accelerate.__version__
    except ImportError:
        acc = None
    return {"cpu_model": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "accelerate": acc,
            "python": platform.python_version(), "platform": platform.platform()}
