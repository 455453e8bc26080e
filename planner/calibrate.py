"""The cost model's one end-to-end calibration: `cpu_run_scale`, the engine's measured time for a whole block on
the CPU over the time the cost model predicts for it from the profile's parts.

The parts (GEMM and attention rates, elementwise traffic, per-call costs) are each measured alone; a real
block also pays for what none of them isolates (cache misses between kernels, allocator, Python between
calls). One run of a calibration model and workload, chosen apart from any benchmark grid (a 12M-parameter
GQA Llama, 48-token prompts, 8 new tokens, one block of 12 rows, everything on the CPU), measures that
residue; the predicted compute time of CPU-computed layers is multiplied by it (the bytes they read from the disk
or move between devices are not: the calibration block has none). A spec written by hand has 1.0."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

import torch

from engine.policy import Policy
from engine.spec import load_model_spec
from planner.hardware import HardwareSpec
from planner.overhead_probe import block_seconds, write_probe_checkpoint
from planner.predict import predict
from planner.workload import Workload

log = logging.getLogger(__name__)

CALIBRATION_CONFIG = dict(model_type="llama", hidden_size=384, intermediate_size=1024, num_attention_heads=6,
                          num_key_value_heads=2, vocab_size=2048, max_position_embeddings=256,
                          tie_word_embeddings=True)
CALIBRATION_LAYERS = 8
PROMPT_LEN, GEN_LEN, ROWS = 48, 8, 12
SCALE_RANGE = (0.5, 3.0)  # outside it the measurement is more likely disturbed than the model that wrong


def cpu_run_scale(hw: HardwareSpec, dtype: torch.dtype, repeats: int = 3) -> float:
    """Measured / predicted seconds of the calibration block, clamped to SCALE_RANGE."""
    policy = Policy(gbs=ROWS, num_gb=1)
    work = Workload(PROMPT_LEN, GEN_LEN, ROWS, dtype=str(dtype).removeprefix("torch."))
    with tempfile.TemporaryDirectory(prefix="flexbatch-calibrate-") as tmp:
        folder = write_probe_checkpoint(Path(tmp) / "model", CALIBRATION_LAYERS, CALIBRATION_CONFIG)
        spec = load_model_spec(folder)
        measured = block_seconds(folder, dtype, policy, repeats=repeats, prompt=PROMPT_LEN, steps=GEN_LEN)
    predicted = predict(spec, dataclasses.replace(hw, cpu_run_scale=1.0), work, policy).total_s
    scale = min(max(measured / predicted, SCALE_RANGE[0]), SCALE_RANGE[1])
    log.info("calibration block: measured %.3f s, predicted %.3f s: cpu_run_scale %.2f", measured, predicted, scale)
    return scale
