"""The bfloat16-weight x float32 kernel (engine/kernels/bf16_tiles.py): float32 products of the weight as stored,
each row's outputs independent of the rows beside it, and its layout undone exactly."""

import pytest
import torch

from engine.kernels import bf16_tiles
from tests.engine.kernels.own_isas import isas

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
