"""Mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE with its shared expert, gpt-oss with its sinks, biases,
clamped SwiGLU and YaRN, and gpt-oss's MXFP4 checkpoints): token-exact with transformers as every family is
(tests/engine/test_families.py runs its greedy, teacher-forced and disk / shared-prefix checks on them too);
4-bit and int8 experts (routers kept as they are) within the Llama family's tolerance for those formats; each
expert runs once per call, over the rows of the tokens that chose it."""

import pytest
import torch
from safetensors.torch import load_file

from engine.compression.codecs import SCRATCH
from engine.engine import Engine
from engine.memory.footprint import disk_staged_bytes, routed_layer_bytes
from engine.models.experts import mixture, route
from engine.policy import Policy
from engine.request import Request, SamplingParams
from engine.spec import spec_from_config
from tests.checkpoints import MOE_VARIANTS
from tests.engine.loop.test_shared_prefix import ROWS
from tests.engine.reference import PROMPTS, hf_greedy
from tests.engine.teacher_forcing import continuation_logprobs

MAX_NEW = 12


def _reqs(prompts, max_new=MAX_NEW):
    return [Request(str(i), p, SamplingParams(max_new_tokens=max_new)) for i, p in enumerate(prompts)]


def _format_error(checkpoint, variant: str, fmt: str) -> float:
    """Mean |teacher-forced log-probability change| per token with `fmt` weights, against float32 weights."""
    model_dir = checkpoint(variant)
    texts = [p for p in ROWS if len(p) > 70]
    plain = continuation_logprobs(Engine.load(model_dir, dtype="float32"), texts)
    packed = continuation_logprobs(Engine.load(model_dir, dtype="float32",
                                               policy=Policy(compress_weight=True, weight_format=fmt)), texts)
    diffs = [abs(a - b) for row_a, row_b in zip(plain, packed) for a, b in zip(row_a, row_b)]
    return sum(diffs) / len(diffs)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_compressed_experts_stay_within_the_llama_familys_tolerance(checkpoint, variant, fmt):
    """docs/MODELS.md's tolerance for compressed weights: a mixture's mean teacher-forced log-probability change
    at most 1.5x the Llama family's over the same texts (a router choice flipped by rounding is part of it)."""
    baseline, error = _format_error(checkpoint, "llama_gqa_llama3", fmt), _format_error(checkpoint, variant, fmt)
    assert 0 < error <= 1.5 * baseline, (error, baseline)


@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_experts_are_stored_compressed_and_routers_are_not(checkpoint, variant, tmp_path):
    engine = Engine.load(checkpoint(variant), dtype="float32", policy=Policy(weight_cpu=0.0, compress_weight=True),
                         offload_dir=tmp_path)
    stored = load_file(next(tmp_path.rglob("layer_0000.safetensors")))
    p = engine.spec.moe_prefix
    assert f"{p}experts.0.gate_up_proj.weight.data" in stored and f"{p}{engine.spec.router_name}.weight" in stored
    engine.weights.close()


def test_each_expert_runs_once_over_the_tokens_that_chose_it():
    spec = spec_from_config(dict(model_type="qwen3_moe", hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, vocab_size=10, max_position_embeddings=16, num_experts=6,
                                 num_experts_per_tok=3, moe_intermediate_size=4, norm_topk_prob=True))
    g = torch.Generator().manual_seed(0)
    x, logits, scale = torch.randn(20, 8, generator=g), torch.randn(20, 6, generator=g), torch.randn(6, 8, generator=g)
    weights, chosen = route(logits, spec)
    assert torch.allclose(weights.sum(-1), torch.ones(20)) and chosen.shape == (20, 3)
    calls = []

    def expert(e, rows):
        calls.append((e, rows.shape[0]))
        return rows * scale[e]

    got = mixture(x, weights, chosen, expert)
    want = torch.stack([sum(weights[t, j] * x[t] * scale[chosen[t, j]] for j in range(3)) for t in range(20)])
    assert torch.allclose(got, want, atol=1e-6)
    assert [e for e, _ in calls] == sorted(set(chosen.flatten().tolist()))  # each chosen expert once, ascending
    assert sum(n for _, n in calls) == 20 * 3  # every (token, choice) once


@pytest.fixture(scope="module")
def mxfp4_gpt_oss(tmp_path_factory):
    """A tiny gpt-oss checkpoint with its experts in MXFP4 (e2m1 blocks of 32, e8m0 scales) and transformers' model
    of it, read by transformers' own MXFP4 loader (dequantize=True: its CPU path)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    from tests.quantized_checkpoints import make_mxfp4_gpt_oss

    model_dir = make_mxfp4_gpt_oss(tmp_path_factory.mktemp("gpt-oss"))
    ref = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=Mxfp4Config(dequantize=True),
                                               dtype=torch.float32).eval()
    return model_dir, ref


def _mxfp4_expected(ref, engine) -> list[list[int]]:
    return [hf_greedy(ref, engine.tokenizer, p, MAX_NEW, engine.eos_ids) for p in PROMPTS]


def _checkpoint_expert_bytes(model_dir, layer: int) -> int:
    """The bytes of one layer's MXFP4 expert weights in the checkpoint (blocks and scales)."""
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(f.get_tensor(f"model.layers.{layer}.mlp.experts.{proj}_{part}").nbytes
                   for proj in ("gate_up_proj", "down_proj") for part in ("blocks", "scales"))


def test_mxfp4_experts_dequantize_to_transformers_own_values(mxfp4_gpt_oss):
    from safetensors import safe_open

    from engine.quantized.mxfp4 import dense

    model_dir, ref = mxfp4_gpt_oss
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        ours = dense(f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_blocks"),
                     f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_scales"), torch.float32, "gate_up_proj")
    assert torch.equal(ours, ref.model.layers[0].mlp.experts.gate_up_proj.data)


def test_mxfp4_experts_compute_in_their_checkpoint_form_token_exact_with_transformers(mxfp4_gpt_oss, monkeypatch):
    """Every expert's gate_up and down kept as the checkpoint's bytes (engine/kernels/mxfp4_linear.py), every routed
    expert of a step in one kernel call (engine/kernels/mxfp4_experts.py): greedy float32 tokens equal those of
    transformers' dequantized model; the layer and the planner count the same bytes."""
    from engine.kernels import mxfp4_experts
    from engine.kernels.mxfp4_linear import Mxfp4Weight, available
    from engine.memory.footprint import layer_bytes, stored_layer_bytes

    if not available():
        pytest.skip("the project's kernels are not built here: the experts are dequantized (tested below)")
    model_dir, ref = mxfp4_gpt_oss
    engine = Engine.load(model_dir, dtype="float32")
    spec = engine.spec
    widened = 3 * spec.num_experts * spec.expert_ffn_size * spec.hidden_size * 4  # float32 experts
    for i, lw in engine.weights.resident.items():
        experts = [w for name, w in lw.items() if ".experts." in name and name.endswith(".weight")]
        assert len(experts) == 2 * spec.num_experts and all(isinstance(w, Mxfp4Weight) for w in experts)
        packed = _checkpoint_expert_bytes(model_dir, i)
        assert sum(w.nbytes for w in experts) == packed == widened * 17 // 128  # 4.25 of 32 bits a weight
        assert engine.weights.layer_bytes[i] == layer_bytes(spec, 4, False) - widened + packed
        assert engine.weights.layer_bytes[i] == stored_layer_bytes(spec, 4, engine.policy)
    calls, run = [], mxfp4_experts.run
    monkeypatch.setattr(mxfp4_experts, "run", lambda *a: calls.append(run(*a)) or calls[-1])
    assert [c.token_ids for c in engine.generate(_reqs(PROMPTS))] == _mxfp4_expected(ref, engine)
    assert calls and all(y is not None for y in calls)


@pytest.mark.parametrize("dtype,fmt", [("bfloat16", None), ("float32", "int4"), ("float32", "int8")])
def test_the_footprint_counts_mxfp4_experts_at_their_checkpoint_bytes_beside_any_format(mxfp4_gpt_oss, tmp_path,
                                                                                      dtype, fmt):
    """Compressed runs compress the other Linear weights and keep the experts packed; the planner's figure for a
    layer is the engine's."""
    from engine.kernels.mxfp4_linear import Mxfp4Weight, available
    from engine.memory.footprint import stored_layer_bytes

    if not available():
        pytest.skip("the project's kernels are not built here")
    policy = Policy(compress_weight=True, weight_format=fmt) if fmt else Policy()
    engine = Engine.load(mxfp4_gpt_oss[0], dtype=dtype, policy=policy, offload_dir=tmp_path)
    assert isinstance(engine.weights.get(0, "cpu")["mlp.experts.0.down_proj.weight"], Mxfp4Weight)
    assert engine.weights.layer_bytes[0] == stored_layer_bytes(engine.spec, engine.dtype.itemsize, policy)
    engine.weights.settle()


def test_with_the_kernels_off_mxfp4_experts_are_dequantized_at_load(mxfp4_gpt_oss, monkeypatch):
    """FLEXBATCH_KERNELS=off (no kernels module): the experts are widened to the run's dtype at load, as before, and
    the tokens are the same; the footprint counts them widened too."""
    from engine.kernels import compiled
    from engine.memory.footprint import stored_layer_bytes

    monkeypatch.setattr(compiled, "_loaded", [None])
    model_dir, ref = mxfp4_gpt_oss
    engine = Engine.load(model_dir, dtype="float32")
    spec, lw = engine.spec, engine.weights.resident[0]
    w = lw["mlp.experts.0.gate_up_proj.weight"]
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float32
    assert w.shape == (2 * spec.expert_ffn_size, spec.hidden_size)
    assert engine.weights.layer_bytes[0] == stored_layer_bytes(spec, 4, engine.policy)
    assert [c.token_ids for c in engine.generate(_reqs(PROMPTS))] == _mxfp4_expected(ref, engine)


def test_mxfp4_experts_on_disk_are_stored_packed_and_read_by_expert(mxfp4_gpt_oss, tmp_path):
    """Layers on the disk tier are converted once into the offload folder with their experts packed, and read by
    expert as tokens route (each expert's projections through the MXFP4 GEMM one at a time): the tokens stay
    transformers'; the planner prices a one-token step's read as the engine reads it."""
    from engine.kernels.mxfp4_linear import available

    if not available():
        pytest.skip("the project's kernels are not built here")
    model_dir, ref = mxfp4_gpt_oss
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(weight_cpu=0.0), offload_dir=tmp_path)
    store = engine.weights
    assert sorted(store.streamed) == [0, 1] and not store.plans
    stored = load_file(next(tmp_path.rglob("layer_0000.safetensors")))
    packed = {n: t for n, t in stored.items() if n.endswith(".mxfp4")}
    assert len(packed) == 2 * engine.spec.num_experts and all(t.dtype == torch.uint8 for t in packed.values())
    assert sum(t.nbytes for t in packed.values()) == _checkpoint_expert_bytes(model_dir, 0)
    assert [c.token_ids for c in engine.generate(_reqs(PROMPTS))] == _mxfp4_expected(ref, engine)
    expert = store.streamed[0][1][0].stored_bytes
    assert routed_layer_bytes(engine.spec, 4, engine.policy, 1) == (store.streamed[0][0].stored_bytes
                                                                     + engine.spec.experts_per_token * expert)
    store.close()


@pytest.mark.parametrize("variant,fmt", [("qwen2_moe", None), ("qwen3_moe", "int4")])
def test_a_mixture_on_disk_reads_its_trunk_and_only_the_experts_its_tokens_chose(checkpoint, variant, fmt, tmp_path,
                                                                                 monkeypatch):
    """One row: each decode step routes one token, so a layer on disk reads its trunk and the top-k experts that
    token chose (each expert once), not the layer; the tokens stay those of the weights in memory."""
    import engine.models.experts as experts

    distinct = []

    def counting_route(logits, spec):
        weights, chosen = route(logits, spec)
        distinct.append(len(torch.unique(chosen)))
        return weights, chosen

    model_dir = checkpoint(variant)
    packed = {"compress_weight": True, "weight_format": fmt} if fmt else {}
    expected = Engine.load(model_dir, dtype="float32", policy=Policy(**packed)).generate(_reqs(PROMPTS[:1]))
    engine = Engine.load(model_dir, dtype="float32", policy=Policy(weight_cpu=0.0, **packed), offload_dir=tmp_path)
    store = engine.weights
    moe = [i for i, m in enumerate(engine.spec.moe_layers) if m]
    assert sorted(store.streamed) == moe and set(store.placement) == {"disk"}
    monkeypatch.setattr(experts, "route", counting_route)
    before = engine.devices.links.moved.get("disk->cpu", 0)
    got = engine.generate(_reqs(PROMPTS[:1]))
    moved = engine.devices.links.moved["disk->cpu"] - before

    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    steps = len(distinct) // len(moe)
    per_step = sum(store.streamed[i][0].stored_bytes if i in store.streamed else store.layer_bytes[i]
                   for i in range(engine.spec.num_layers))
    expert = store.streamed[moe[0]][1][0].stored_bytes
    reads = steps * per_step + sum(distinct) * expert
    first = store.streamed[0][0].stored_bytes if 0 in store.streamed else store.layer_bytes[0]
    assert moved in (reads, reads + first), (moved, reads)  # + layer 0 read ahead for a step that did not come
    k, every = engine.spec.experts_per_token, len(store.streamed[moe[0]][1])
    assert distinct[-1] == k < every and moved < steps * sum(store.layer_bytes)
    # the planner prices a one-token step's read of a mixture layer as the engine reads it
    assert routed_layer_bytes(engine.spec, 4, engine.policy, 1) == store.streamed[moe[0]][0].stored_bytes + k * expert
    # the reads held one layer with its experts and the next one's trunk at most (every buffer the readers made,
    # each kept for reuse), not two layers: what the footprint stages for them, in stored bytes
    trunk, experts = store.streamed[moe[0]]
    held = sum(r.bytes_made for r in (store._buffers, store._expert_buffers, store.direct) if r is not None)
    assert held <= 2 * trunk.buffer_bytes + sum(p.buffer_bytes for p in experts.values())
    assert (disk_staged_bytes(engine.spec, 4, engine.policy, max(store.layer_bytes))
            == 2 * trunk.stored_bytes + len(experts) * expert < 2 * max(store.layer_bytes))
    if fmt:  # the dense buffers compressed weights are dequantized into: the layers' sets hold their trunks, and
        # every layer's routed experts share one set (footprint.streamed_dense_bytes)
        names = [{n.split(".weight")[0] for n in b} for b in store.codec._free]
        assert len(names) == 2 and all(n and not any(".experts." in x for x in n) for n in names)
        experts_dense = {n.split(".weight")[0] for n in store._expert_dense if n != SCRATCH}
        assert experts_dense and all(n.startswith(f"{engine.spec.moe_prefix}experts.") for n in experts_dense)


def test_streamed_experts_are_read_once_in_routed_order_and_held_until_released():
    from concurrent.futures import ThreadPoolExecutor

    from engine.memory.expert_reads import StreamedExperts

    calls = []

    def read(e):
        calls.append(e)
        if e == 3:
            raise OSError("expert 3: short read")
        return {f"mlp.experts.{e}.down_proj.weight": torch.full((1,), float(e))}, f"buffer {e}"

    with ThreadPoolExecutor(max_workers=1) as pool:
        layer = StreamedExperts({"mlp.gate.weight": torch.zeros(1)}, "mlp.", read, pool)
        layer.read_ahead([1, 4])
        layer.read_ahead([0, 4])  # another GPU batch of the block: expert 4 is not read again
        assert layer["mlp.experts.4.down_proj.weight"].item() == 4.0
        assert layer.get("mlp.experts.4.down_proj.bias") is None and layer.get("mlp.experts.0.gate_up_proj.bias") is None
        with pytest.raises(KeyError):
            layer["mlp.shared_expert.down_proj.weight"]
        layer.read_ahead([3])
        with pytest.raises(OSError, match="expert 3"):
            layer["mlp.experts.3.down_proj.weight"]
        held = layer.release()
    assert calls == [1, 4, 0, 3] and sorted(held) == ["buffer 0", "buffer 1", "buffer 4"] and not layer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_experts_in_one_kernel_call_give_the_bytes_of_one_call_per_expert(checkpoint, dtype, monkeypatch,
                                                                             compressed_kernels):
    """4-bit experts in the kernel's tiles: every routed expert's gate_up, SiLU * up and down in one call
    (engine/kernels/int4_experts.py) give each row the bytes one expert's calls at a time give it."""
    from engine.kernels import int4_experts
    from engine.kernels.int4_tiles import available
    from engine.models.experts import moe_block

    if not available():
        pytest.skip("the project's kernels are not built here")
    engine = Engine.load(checkpoint("mixtral"), dtype=dtype,  # experts wide enough for the kernel's groups
                         policy=Policy(compress_weight=True, weight_format="int4"))
    model, lw = engine.model, engine.weights.get(0, "cpu")
    calls, run = [], int4_experts.run

    def counted(rows, counts, gate_up, down):
        out = run(rows, counts, gate_up, down)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(int4_experts, "run", counted)
    x = torch.randn(5, 7, engine.spec.hidden_size, generator=torch.Generator().manual_seed(0)).to(engine.dtype)
    with torch.inference_mode():
        fused = moe_block(model, lw, x)
        monkeypatch.setattr(int4_experts, "run", lambda *a: None)
        one_by_one = moe_block(model, lw, x)
    assert calls == [True] and torch.equal(fused, one_by_one)
    engine.weights.close()
