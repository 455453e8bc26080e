"""The int8 kernel's tile layout (engine/kernels/int8_tiles.py; its values, equal to the kernel over the weight as
stored, are checked in test_int8_rows.py) and the way a weight kept in the tiles alone computes."""

import pytest
import torch

from engine.compression.int8 import dequantize_int8, quantize_int8
from engine.compression.qlinear import QLinear, one_call, stored_bytes
from engine.kernels import int8_rows, int8_tiles
from engine.kernels.native import int8_head, qweight

needs_kernels = pytest.mark.skipif(not int8_rows.available(),
                                   reason="the project's kernels are not built here: no weight is kept in the tiles")


@needs_kernels
def test_leading_dims_and_other_dtypes():
    w = int8_tiles.pack(quantize_int8(torch.randn(40, 96)))
    x = torch.randn(2, 3, 96)
    assert torch.equal(int8_tiles.linear(x, w), int8_tiles.linear(x.view(6, 96), w).view(2, 3, 40))
    assert int8_tiles.linear(x.half(), w).dtype == torch.float16


@pytest.mark.parametrize("n,k", [(48, 128), (17, 100), (40, 70)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tiles_dequantize_to_the_stored_forms_dense_weight(n, k, dtype):
    """The dense path of a weight kept in the tiles alone gets the very weight the stored form would give."""
    w = quantize_int8(torch.randn(n, k))
    tiles = int8_tiles.pack(w)
    want = dequantize_int8(w, dtype)
    assert torch.equal(int8_tiles.dequantize(tiles, dtype), want)
    buf = torch.full((tiles.codes.numel() + 5,), float("nan"), dtype=dtype)
    assert torch.equal(int8_tiles.dequantize(tiles, dtype, out=buf), want)


@needs_kernels
def test_a_weight_kept_in_memory_is_kept_in_the_tiles_alone():
    """Packed once (a layer kept in CPU memory, the int8 head): the tiles replace the codes, both the kernel's
    calls and the dense path's compute from them, and the weight is accounted at the tiles' bytes."""
    w = quantize_int8(torch.randn(64, 128))
    q = qweight(w, torch.float32, pack=True)
    assert q.stored is None and isinstance(q.fast, int8_tiles.Int8Tiles)
    assert stored_bytes([q]) == q.fast.nbytes
    x = torch.randn(5, 128)
    view = QLinear(q, lambda: int8_tiles.dequantize(q.fast, torch.float32))
    dense = dequantize_int8(w, torch.float32)
    assert torch.equal(view.dense(), dense)
    want = int8_rows.fast_linear(x, int8_rows.pack_fast(w)) if view.uses_fast(5) else torch.nn.functional.linear(x, dense)
    assert torch.equal(view(x), want)
    streamed = qweight(w, torch.float32, pack=False)  # a layer read anew at every step keeps its codes
    assert streamed.stored is w and isinstance(streamed.fast, int8_rows.Int8Rows)


@needs_kernels
def test_the_int8_head_is_kept_in_the_tiles_and_its_dense_copy_is_the_stored_forms():
    emb = torch.randn(50, 32)
    head = int8_head({"embed_tokens.weight": emb}, tied=True, dtype=torch.float32)["lm_head.weight"]
    assert head.stored is None and isinstance(head.fast, int8_tiles.Int8Tiles)
    assert torch.equal(one_call(head, torch.float32).dense(), dequantize_int8(quantize_int8(emb), torch.float32))
