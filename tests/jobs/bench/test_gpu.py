"""`flexbatch bench gpu` end to end on a tiny model with the GPU simulated on the CPU, and its refusal without CUDA."""

import json
from pathlib import Path

from click.testing import CliRunner

from jobs import cli

REPO = Path(__file__).resolve().parents[3]
H100 = REPO / "infra" / "hardware" / "h100-80gb-sapphirerapids.json"
# split@6/split@6: the split where the 2 layers that fit the budget (300 KiB: beside the embeddings and head,
# 65 KiB, and the activations) run on the GPU
POLICIES = ["offload gpu/gpu", "cpu/cpu", "gpu/cpu", "gpu/split@2", "gpu/split@4", "gpu/split@6", "split@4/split@4",
            "split@6/split@6", "planner"]


def test_simulated_run_prints_every_policy_at_every_batch_size(tmp_path):
    out = tmp_path / "gpu.json"
    args = ["bench", "gpu", "--simulate-gpu", "--preset", "tiny-opt", "--prompt-len", "8", "--gen-len", "3",
            "--batch-sizes", "1,2", "--repeats", "1", "--gpu-mem", "300KiB", "--hardware", str(H100),
            "--cache-dir", str(tmp_path / "cache"),
            "--json", str(out)]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("bench gpu:") and "simulated on the CPU" in lines[0]
    assert lines[1].split()[:3] == ["batch", "policy", "(prefill/decode)"]
    for batch in (1, 2):
        rows = [line for line in lines if line.split()[:1] == [str(batch)]]
        assert [r[7:36].strip().removesuffix(" (baseline)") for r in rows] == POLICIES
        assert not any("error" in r for r in rows)
    assert sum(line.strip().startswith("planner chose") for line in lines) == 2
    assert sum(line.strip().startswith("best ") for line in lines) == 2
    assert any(line.startswith("headline: latency vs FlexGen-like offloading") for line in lines)

    report = json.loads(out.read_text())
    assert [b["batch"] for b in report["batches"]] == [1, 2]
    for b in report["batches"]:
        assert [r["name"] for r in b["rows"]] == POLICIES
        for r in b["rows"]:
            assert r["error"] is None and r["tokens"] == 3 * b["batch"] and r["tokens_per_s"] > 0, r
            assert r["prefill_s"] > 0 and r["decode_s"] > 0 and r["predicted_s"] > 0
        h = b["headline"]
        assert h["best"] in POLICIES and h["best_vs_offload"] <= 0 and h["planner_vs_best"] is not None
    assert report["gpu_budget_bytes"] == 300 * 1024
    offload = report["batches"][0]["rows"][0]["policy"]
    assert offload["prefill_device"] == offload["decode_device"] == "gpu" and offload["weight_cpu"] > 0
    fitting = report["batches"][0]["rows"][POLICIES.index("split@6/split@6")]["policy"]
    assert fitting["weight_gpu"] == 0.25  # the split's two GPU layers resident there
    assert report["summary"]["planner_compared"] == 2


def test_without_cuda_it_names_the_fix_before_building_anything(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cache = tmp_path / "cache"
    result = CliRunner().invoke(cli.main, ["bench", "gpu", "--preset", "tiny-opt", "--cache-dir", str(cache)])
    assert result.exit_code == 2
    assert result.stdout == ""
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert message.startswith("flexbatch: error: no CUDA device") and "--simulate-gpu" in message
    assert not cache.exists()


def test_the_default_budget_holds_the_head_and_two_streamed_layers():
    """On every released shape, the default GPU budget holds the embeddings and LM head (on the GPU in the
    offloading baseline) and the two layers it streams, with room left for a batch's activations."""
    from engine.memory.footprint import global_bytes, layer_bytes
    from engine.spec import spec_from_config
    from jobs.bench.gpu_models import GPU_PRESETS, default_gpu_budget

    for name, preset in GPU_PRESETS.items():
        if name.startswith("tiny"):
            continue
        spec = spec_from_config(preset.hf_config().to_dict())
        room = default_gpu_budget(spec) - global_bytes(spec, 2) - 2 * layer_bytes(spec, 2, False)
        assert room > 0, name
