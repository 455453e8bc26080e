"""The profiler ranges the engine marks its own work with, for `flexbatch bench ops` or anyone running
torch.profiler over a generation: each step by phase ("prefill", "decode"), every Linear call ("linear"), the
KV cache's attention ("attention"), the choice of the next tokens ("sampling"), and each call of the compiled
kernels ("flexbatch::" and the kernel). Outside profiling a range costs one flag read."""

from __future__ import annotations

from contextlib import nullcontext

import torch

LINEAR, ATTENTION, SAMPLING = "linear", "attention", "sampling"
KERNEL = "flexbatch::"  # the compiled kernels' ranges start with this


def scope(name: str):
    """A profiler range named `name` while torch's profiler runs, else nothing."""
    return torch.profiler.record_function(name) if torch.autograd.profiler._is_profiler_enabled else nullcontext()
