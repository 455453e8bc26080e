"""The bfloat16-weight x float32 kernel (engine/kernels/bf16_tiles.py): float32 products of the weight as stored,
each row's outputs independent of the rows beside it, its layout undone exactly, and a float32 run over bfloat16
weights at rest through it giving transformers' greedy tokens over the same weights widened to float32."""

import pytest
import torch

from engine.compression.qlinear import QLinear
from engine.engine import Engine
from engine.kernels import bf16_tiles
from engine.kernels.bf16_tiles import Bf16Tiles
from engine.policy import Policy
from engine.request import Request, SamplingParams
from jobs.bench import models as bm
from tests.engine.kernels.own_isas import isas
from tests.engine.reference import hf_model

pytestmark = pytest.mark.skipif(not isas(), reason="the own kernels are not built for this CPU")


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("n,k", [(96, 1024), (17, 100), (5, 64), (70, 200), (33, 768), (48, 1)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 13, 70, 130])
def test_kernel_equals_float32_products_of_the_weight(pinned, isa, n, k, rows):
    pinned(isa)
    torch.manual_seed(n * rows + k)
    w = (torch.randn(n, k) * 0.05).bfloat16()
    x = torch.randn(rows, k)
    tiles = bf16_tiles.pack(w)
    y = bf16_tiles.linear(x, tiles)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    ref = x.double() @ w.double().T
    # float32 sums of k products: within k float32 roundings of the sum of magnitudes
    bound = 2 * k * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T)
    assert ((y.double() - ref).abs() <= bound + 1e-30).all()
    # one FMA chain per output, in input order, whatever block of rows and tiles it was computed in
    alone = torch.cat([bf16_tiles.linear(x[i : i + 1], tiles) for i in range(rows)])
    assert torch.equal(alone, y)


def test_the_layout_is_undone_exactly():
    w = torch.randn(37, 29).bfloat16()
    tiles = bf16_tiles.pack(w)
    assert tiles.values.shape == (3, 29, 16) and tiles.nbytes == 3 * 29 * 16 * 2
    assert torch.equal(bf16_tiles.dequantize(tiles, torch.float32), w.float())
    out = torch.empty(37 * 29 + 5)
    assert torch.equal(bf16_tiles.dequantize(tiles, torch.float32, out=out), w.float())


def test_leading_dimensions_and_strided_rows_are_taken():
    w = torch.randn(40, 64).bfloat16()
    x = torch.randn(2, 3, 80)[..., :64]  # rows 80 apart
    y = bf16_tiles.linear(x, bf16_tiles.pack(w))
    assert y.shape == (2, 3, 40)
    torch.testing.assert_close(y, x @ w.float().T, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    return bm.build_checkpoint("tiny", tmp_path_factory.mktemp("bf16-cache"))  # saved in bfloat16


def hf_tokens(model, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             min_new_tokens=new, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("isa", isas())
def test_bf16_weights_at_rest_give_the_float32_tokens_of_the_bf16_weights(bf16_checkpoint, pinned, isa,
                                                                           compressed_kernels):
    """Weights kept in bfloat16, activations and KV cache in float32, every Linear through the kernel: greedy
    tokens equal transformers' float32 over the checkpoint's bfloat16 weights (widening them is exact)."""
    pinned(isa)
    policy = Policy(gbs=4, num_gb=1, compress_weight=True, weight_format="bf16")
    eng = Engine.load(bf16_checkpoint, dtype="float32", policy=policy)
    linear = [w for w in eng.weights.get(0, "cpu").values() if isinstance(w, QLinear)]
    assert linear and all(isinstance(w.weight.fast, Bf16Tiles) for w in linear)
    prompts = [p[:n] for p, n in zip(bm.prompt_ids(4, 11, eng.spec.vocab_size, seed=5), (11, 3, 8, 1))]
    new = 16
    got = eng.generate([Request(str(i), "", SamplingParams(max_new_tokens=new), prompt_ids=tuple(p))
                        for i, p in enumerate(prompts)])
    ref = hf_model(bf16_checkpoint)
    assert [c.token_ids for c in got] == [hf_tokens(ref, p, new) for p in prompts]
