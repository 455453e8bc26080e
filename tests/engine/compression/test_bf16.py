"""bfloat16 weights at rest (`--compress-weight bf16`): for a bf16 checkpoint computing in float32, every policy's
tokens and log-probabilities equal the uncompressed float32 run's exactly, the layers hold half the bytes, and the
planner counts what the engine holds."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from engine.engine import Engine
from engine.policy import Policy
from engine.request import Request, SamplingParams
from jobs.bench import models as bm

POLICIES = {
    "cpu": Policy(gbs=2, num_gb=2),
    "weights-disk": Policy(gbs=2, num_gb=2, weight_cpu=0.0),
    "weights-split-gpu": Policy(gbs=2, num_gb=2, weight_gpu=0.5, weight_cpu=0.2, prefill_device="gpu",
                                decode_device="gpu"),
}


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    return bm.build_checkpoint("tiny", tmp_path_factory.mktemp("bf16-cache"))  # saved in bfloat16


def _run(model_dir, policy, offload_dir):
    eng = Engine.load(model_dir, dtype="float32", policy=policy, offload_dir=offload_dir, simulate_gpu=True)
    prompts = bm.prompt_ids(4, 9, 512, seed=3)
    reqs = [Request(str(i), "", SamplingParams(max_new_tokens=6, logprobs=True, prompt_logprobs=True), prompt_ids=tuple(p))
            for i, p in enumerate(prompts)]
    out = [(c.token_ids, c.logprobs, c.prompt_logprobs) for c in eng.generate(reqs)]
    assert all(len(lp) == 6 and len(plp) == 8 for _, lp, plp in out)
    return eng, out


@pytest.mark.parametrize("name", list(POLICIES))
def test_bf16_at_rest_equals_the_float32_run_exactly(bf16_checkpoint, tmp_path, name):
    from dataclasses import replace

    policy = POLICIES[name]
    plain_eng, plain = _run(bf16_checkpoint, policy, tmp_path / "plain")
    bf16_eng, bf16 = _run(bf16_checkpoint, replace(policy, compress_weight=True, weight_format="bf16"),
                          tmp_path / "bf16")
    assert bf16 == plain
    ratio = sum(bf16_eng.weights.layer_bytes) / sum(plain_eng.weights.layer_bytes)
    assert 0.5 <= ratio < 0.51  # the Linear weights in half the bytes; the norms stay float32


def test_widened_weights_take_onednn_where_the_float32_run_reorders_them(bf16_checkpoint, tmp_path, monkeypatch):
    """Where the float32 run keeps a weight reordered for oneDNN, the widened bf16 weight goes through oneDNN too
    (over the plain weight, which gives the same values): still the float32 run's bytes exactly."""
    from dataclasses import replace

    from engine.kernels import gemm_choice, onednn_dense

    if not gemm_choice.reorders(torch.float32):
        pytest.skip("oneDNN does not reorder float32 weights on this CPU")
    monkeypatch.setattr(gemm_choice, "MIN_PACK_PARAMS", 0)  # every weight of the tiny model
    policy = POLICIES["cpu"]
    plain_eng, plain = _run(bf16_checkpoint, policy, tmp_path / "plain")
    bf16_eng, bf16 = _run(bf16_checkpoint, replace(policy, compress_weight=True, weight_format="bf16"),
                          tmp_path / "bf16")
    with torch.inference_mode():  # its buffers were made in the run's inference mode
        linear = [w for w in bf16_eng.weights.get(0, "cpu").values() if not isinstance(w, torch.Tensor)]
    assert linear and all(w.gemm is onednn_dense.linear_plain for w in linear)
    assert bf16 == plain


def test_the_stored_weights_are_bfloat16_and_widen_to_float32(bf16_checkpoint, tmp_path):
    eng = Engine.load(bf16_checkpoint, dtype="float32", offload_dir=tmp_path,
                      policy=Policy(gbs=1, num_gb=1, weight_cpu=0.0, compress_weight=True, weight_format="bf16"))
    w = eng.weights.get(0, "cpu")
    linear = [v for v in w.values() if not isinstance(v, torch.Tensor)]
    assert linear and all(q.weight.stored.values.dtype == torch.bfloat16 for q in linear)
    assert all(q.dense().dtype == torch.float32 for q in linear)


def test_compress_weight_takes_bf16_on_the_command_line():
    from jobs.cli import main

    result = CliRunner().invoke(main, ["run", "--help"])
    assert "bf16 (kept and read in bfloat16" in result.output
