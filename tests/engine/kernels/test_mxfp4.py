"""The MXFP4 kernels (engine/kernels/mxfp4_linear.py, engine/kernels/mxfp4_experts.py) against the float32
dequantization of the same bytes (engine/quantized/mxfp4.py `dense`, transformers' own values) times the rows in
float64, on every instruction set this CPU runs."""

import pytest
import torch

from engine.kernels import mxfp4_experts, mxfp4_linear
from engine.kernels.mxfp4_linear import Mxfp4Weight
from engine.quantized.mxfp4 import dense, pack
from tests.engine.kernels.own_isas import isas

pytestmark = pytest.mark.skipif(not isas(), reason="the project's kernels are not built for this CPU")
EPS = 2.0**-24  # float32's unit roundoff


def random_weight(out: int, inp: int, seed: int, scales=(112, 132)) -> tuple[Mxfp4Weight, torch.Tensor]:
    """A packed weight of random codes (every byte value) and scales in [scales), and its dense [out, in] float64."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (1, out, inp // 32, 16), generator=g, dtype=torch.uint8)
    exps = torch.randint(*scales, (1, out, inp // 32), generator=g, dtype=torch.uint8)
    return Mxfp4Weight(pack(blocks[0], exps[0], "w")), dense(blocks, exps, torch.float32, "w")[0].T.double()


def close(y: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor) -> bool:
    """Within 32 float32 roundings of the sum of |products| (the kernel's sums), plus the output's own rounding to
    bfloat16 where it is bfloat16."""
    rounding = 2.0**-8 * ref.abs() if y.dtype == torch.bfloat16 else 0
    return bool(((y.double() - ref).abs() <= 32 * EPS * magnitude + rounding).all())


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("out,inp", [(1, 32), (7, 64), (70, 96), (130, 320)])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gemm_equals_the_dequantized_weight_in_float64(pinned, isa, out, inp, rows, dtype):
    pinned(isa)
    w, W = random_weight(out, inp, seed=out * rows + inp)
    x, b = torch.randn(rows, inp).to(dtype), torch.randn(out).to(dtype)
    y = mxfp4_linear.linear(x, w, b)
    assert y.dtype == dtype and y.shape == (rows, out)
    ref = x.double() @ W.T + b.double()
    assert close(y, ref, x.double().abs() @ W.abs().T + b.double().abs())


@pytest.mark.parametrize("isa", isas())
def test_every_code_and_scale_decodes_exactly(pinned, isa):
    """Rows of the identity pick each weight out alone: every byte value and every finite scale (0: a subnormal
    power of two, up to 252: 6 x 2^125) give the dequantization's float32 value exactly."""
    pinned(isa)
    out, inp = 64, 256  # 512 blocks of 16 bytes: every byte value 32 times, every scale at least twice
    blocks = (torch.arange(out * inp // 2) % 256).to(torch.uint8).view(1, out, inp // 32, 16)
    scales = (torch.arange(out * inp // 32) % 253).to(torch.uint8).view(1, out, inp // 32)
    w = Mxfp4Weight(pack(blocks[0], scales[0], "w"))
    assert torch.equal(mxfp4_linear.linear(torch.eye(inp), w), dense(blocks, scales, torch.float32, "w")[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_leading_dims_no_rows_and_no_bias(dtype):
    w, W = random_weight(48, 64, seed=2)
    x = torch.randn(2, 3, 64).to(dtype)
    torch.testing.assert_close(mxfp4_linear.linear(x, w), mxfp4_linear.linear(x.view(6, 64), w).view(2, 3, 48))
    assert mxfp4_linear.linear(torch.randn(0, 64).to(dtype), w).shape == (0, 48)
    y = mxfp4_linear.linear(x.view(6, 64), w)
    assert close(y, x.view(6, 64).double() @ W.T, x.view(6, 64).double().abs() @ W.abs().T)


def gpt_oss_expert(x, gate_up, gate_up_bias, down, down_bias, limit, alpha):
    """gpt-oss's expert in float64 (gate_up [2F, H]: gate rows, then up rows)."""
    gate, up = (x @ gate_up.T + gate_up_bias).chunk(2, dim=-1)
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return ((up + 1) * gate * torch.sigmoid(gate * alpha)) @ down.T + down_bias


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_experts_in_one_call_equal_gpt_oss_experts_in_float64(pinned, isa, dtype):
    """Experts of 1, 3, 70 and 5 rows (a row block past 64), each its gate_up + bias, clamped SwiGLU (some gates
    and ups past the limit) and down + bias; float32 between the GEMMs, so the result is within float32's
    rounding of the float64 expert (bfloat16: of its output's rounding)."""
    pinned(isa)
    H, F, counts, limit, alpha = 96, 64, [1, 3, 70, 5], 1.5, 1.702
    g = torch.Generator().manual_seed(3)
    x = torch.randn(sum(counts), H, generator=g).to(dtype)
    gate_up = [random_weight(2 * F, H, seed=10 + e, scales=(118, 122)) for e in range(len(counts))]
    down = [random_weight(H, F, seed=20 + e, scales=(118, 122)) for e in range(len(counts))]
    gate_up_bias = [torch.randn(2 * F, generator=g).to(dtype) for _ in counts]
    down_bias = [torch.randn(H, generator=g).to(dtype) for _ in counts]
    y = mxfp4_experts.run(x, counts, [w for w, _ in gate_up], gate_up_bias, [w for w, _ in down], down_bias, limit,
                          alpha)
    assert y.dtype == dtype and y.shape == x.shape
    ref, before = [], []
    for rows, (_, GU), gub, (_, DN), dnb in zip(x.double().split(counts), gate_up, gate_up_bias, down, down_bias):
        before.append(rows @ GU.T + gub.double())
        ref.append(gpt_oss_expert(rows, GU, gub.double(), DN, dnb.double(), limit, alpha))
    ref, before = torch.cat(ref), torch.cat(before)
    assert (before[:, :F] > limit).any() and (before[:, F:].abs() > limit).any(), "the clamps are not exercised"
    tol = 2e-5 * ref.abs().max() + (2.0**-8 * ref.abs() if dtype == torch.bfloat16 else 0)
    assert ((y.double() - ref).abs() <= tol).all()


def test_another_weight_form_or_a_missing_bias_is_not_taken():
    w, _ = random_weight(64, 32, seed=4)
    d, _ = random_weight(32, 32, seed=5)
    x, b = torch.randn(2, 32), torch.zeros(64)
    assert mxfp4_experts.run(x, [2], [torch.zeros(64, 32)], [b], [d], [torch.zeros(32)], 7.0, 1.702) is None
    assert mxfp4_experts.run(x, [2], [w], [None], [d], [torch.zeros(32)], 7.0, 1.702) is None
    assert mxfp4_experts.run(x, [2], [w], [b], [d], [torch.zeros(32)], 7.0, 1.702) is not None

