"""Hand-written model and hardware specs for the planner's tests (no profiling, no checkpoints)."""

from __future__ import annotations

from engine.spec import spec_from_config
from planner.hardware import DeviceSpec, HardwareSpec


def llama(hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=100, context=2048, tied=True):
    return spec_from_config(dict(model_type="llama", hidden_size=hidden, intermediate_size=ffn,
                                 num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                 vocab_size=vocab, max_position_embeddings=context, tie_word_embeddings=tied))


SMALL = llama()  # head_dim 16; hand-checked figures below
LLAMA_300M = llama(hidden=1024, ffn=2816, layers=20, heads=16, kv_heads=16, vocab=32000)
LLAMA2_70B = llama(hidden=8192, ffn=28672, layers=80, heads=64, kv_heads=8, vocab=32000, context=4096, tied=False)


def flat_cpu(memory_bytes=1e9, gflops=100.0, layer_call_s=1e-4, step_call_s=2e-4) -> DeviceSpec:
    """A CPU with a flat GEMM rate, so that terms can be worked by hand."""
    return DeviceSpec(memory_bytes=memory_bytes, matmul_rows=(1,), matmul_gflop_per_s=(gflops,),
                      attention_bf16_bytes_per_s=1e9, attention_4bit_bytes_per_s=0.5e9, dequant_bytes_per_s=1e9,
                      elementwise_bytes_per_s=1e10, layer_call_s=layer_call_s, step_call_s=step_call_s)


def cpu_machine(memory_bytes=1e9, overlap=1.0, **cpu) -> HardwareSpec:
    return HardwareSpec("hand cpu", flat_cpu(memory_bytes, **cpu), disk_read_bytes_per_s=1e8,
                        disk_write_bytes_per_s=5e7, disk_bytes=1e12, page_cache_bytes_per_s=1e9,
                        cpu_background_overlap=overlap)


def server_cpu(memory_bytes=24e9) -> HardwareSpec:
    """Roughly this kind of 2-core machine (the figures of shared/DESIGN.md)."""
    cpu = DeviceSpec(memory_bytes=memory_bytes, matmul_rows=(1, 16, 256), matmul_gflop_per_s=(6, 170, 500),
                     attention_bf16_bytes_per_s=14.5e9, attention_4bit_bytes_per_s=5e9, dequant_bytes_per_s=1.6e9,
                     elementwise_bytes_per_s=22e9, layer_call_s=2e-4, step_call_s=2e-4)
    return HardwareSpec("2-core cpu", cpu, disk_read_bytes_per_s=0.9e9, disk_write_bytes_per_s=1e9,
                        disk_bytes=1e11, page_cache_bytes_per_s=5e9)
