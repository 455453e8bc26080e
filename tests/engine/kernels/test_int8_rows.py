"""The int8 x int8 kernel (engine/kernels/int8_rows.py) against the same arithmetic written in PyTorch, on every
instruction set this CPU runs (AVX-512 VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd for CPUs without VNNI, equal
bit for bit), its tile layout's (engine/kernels/int8_tiles.py) equal to it bit for bit, and the fallback where the
kernels are off."""

import pytest
import torch

from engine.compression.int8 import Int8Weight, quantize_int8
from engine.kernels import compiled, int8_rows, int8_tiles
from tests.engine.kernels.own_isas import isas, needs_both, on_both


def reference(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x quantized per row as the kernel does (round half to even, |code| <= 127), times the codes, rescaled, in
    float64: what the kernel computes up to float32 rounding."""
    x = x.double()
    a = x.abs().amax(-1, keepdim=True) / 127
    qx = torch.where(a > 0, x / a, 0.0).round().clamp(-127, 127)
    return (qx @ w.codes.double().T) * a * w.scales.double()


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("n,k", [(96, 1024), (17, 100), (5, 64), (70, 200), (33, 768)])
@pytest.mark.parametrize("rows", [1, 3, 4, 9, 70, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_the_reference_arithmetic(pinned, isa, n, k, rows, dtype):
    pinned(isa)
    torch.manual_seed(n * rows + k)
    w = quantize_int8(torch.randn(n, k) * 0.05)
    x = torch.randn(rows, k).to(dtype)
    y = int8_rows.fast_linear(x, int8_rows.pack_fast(w))
    assert y.dtype == dtype and y.shape == (rows, n)
    ref = reference(x, w)
    # float32: the activation codes are x * (127 / max) rounded, the reference's x / (max / 127): a value on a
    # rounding tie may land one code apart, one step of one input
    tol = 2e-3 if dtype == torch.float32 else 8e-3
    assert (y.double() - ref).abs().max() <= tol * ref.abs().max()
    # over the tile layout: the same activation codes, exact int32 dot products, the rescale in the same order
    # (rows in blocks of 4 and 64, tiles in fours, padding cut off)
    assert torch.equal(int8_tiles.linear(x, int8_tiles.pack(w)), y)


@pytest.mark.parametrize("isa", isas())
def test_the_largest_products_sum_exactly(pinned, isa):
    """Weight codes of -128 and 127 times activation codes of +-127: AVX2 (no VNNI) multiplies pairs with vpmaddubsw
    into int16 as |w| times x with w's sign, at most 2 * 128 * 127 = 32,512 a pair, below int16's 32,767, so the
    sums are exact as VNNI's int32 ones: both equal the integer dot product rescaled in float32, bit for bit."""
    pinned(isa)
    g = torch.Generator().manual_seed(7)
    codes = torch.tensor([-128, 127, -127], dtype=torch.int8)[torch.randint(0, 3, (40, 1000), generator=g)]
    w = Int8Weight(codes, torch.rand(40, generator=g) + 0.5)
    x = torch.where(torch.rand(3, 1000, generator=g) < 0.5, -1.0, 1.0)  # every code +-127, scale 1 / 127
    dot = (x.round().long() * 127) @ codes.long().T
    expected = dot.float() * (torch.tensor(1.0) / 127 * w.scales)
    assert torch.equal(int8_rows.fast_linear(x, int8_rows.pack_fast(w)), expected)
    assert torch.equal(int8_tiles.linear(x, int8_tiles.pack(w)), expected)


@needs_both
def test_both_instruction_sets_agree(pinned):
    w = int8_rows.pack_fast(quantize_int8(torch.randn(80, 333)))
    x = torch.randn(9, 333)
    a, b = on_both(pinned, lambda: int8_rows.fast_linear(x, w))
    assert torch.equal(a, b)  # exact integer sums, the same rescale


def test_kernels_off_keep_the_pytorch_path(monkeypatch):
    monkeypatch.setattr(compiled, "_loaded", [None])
    w = quantize_int8(torch.randn(32, 64))
    assert int8_rows.pack_fast(w) is w
    x = torch.randn(3, 64)
    torch.testing.assert_close(int8_rows.fast_linear(x, w), reference(x, w).float(), rtol=2e-2, atol=2e-2)
