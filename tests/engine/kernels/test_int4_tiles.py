"""The 4-bit x int8 kernel (engine/kernels/int4_tiles.py) against the same arithmetic written in PyTorch, on every
instruction set this CPU runs; the build itself; and the fallback where the kernels are off."""

import os
import shutil
import sys

import pytest
import torch

from engine.compression.int4 import Int4Packed, QuantConfig, dequantize, quantize
from engine.kernels import compiled, int4_tiles
from tests.engine.kernels.own_isas import isas, needs_both, on_both


def reference(x: torch.Tensor, qt, group: int) -> torch.Tensor:
    """x W^T with x quantized per row and group as the kernel does (round half to even, |code| <= 127), in
    float64: what the kernel computes up to float32 rounding."""
    n, k = qt.shape
    kp = -(-k // group) * group
    xp = torch.nn.functional.pad(x.double(), (0, kp - k)).view(x.shape[0], kp // group, group)
    scale = xp.abs().amax(-1, keepdim=True) / 127
    codes = torch.where(scale > 0, xp / scale, 0.0).round().clamp(-127, 127)
    xq = (codes * scale).view(x.shape[0], kp)[:, :k]
    return xq @ dequantize(qt, dtype=torch.float64).T


@pytest.mark.parametrize("n,k,group", [(48, 128, 64), (17, 100, 32), (40, 256, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tiles_dequantize_to_the_stored_forms_dense_weight(n, k, group, dtype):
    """A layer kept in the tiles alone gives the dense path (the calls the kernel does not take) the very weight the
    stored form would: bit for bit, padding cut off, into a reused buffer too."""
    if not int4_tiles.available():
        pytest.skip("the project's kernels are not built here: no layer is kept in the tiles")
    qt = quantize(torch.randn(n, k), QuantConfig(4, group, 1))
    tiles = int4_tiles.pack(qt)
    want = dequantize(qt, dtype=dtype)
    assert torch.equal(int4_tiles.dequantize(tiles, dtype), want)
    buf = torch.full((tiles.codes.numel() * 2 + 7,), float("nan"), dtype=dtype)
    assert torch.equal(int4_tiles.dequantize(tiles, dtype, out=buf), want)


def test_the_kernels_build_where_a_compiler_is():
    if compiled.compiler() is None or os.environ.get("FLEXBATCH_KERNELS", "").lower() in ("off", "0", "no"):
        pytest.skip("no C++ compiler, or the kernels turned off")
    mod = compiled.ops()
    assert mod is not None and mod.isa() in ("avx512", "avx2", "none")


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("n,k,group", [(48, 128, 64), (17, 100, 32), (96, 1024, 64), (40, 256, 128)])
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_equals_the_reference_arithmetic(pinned, isa, n, k, group, rows, dtype):
    pinned(isa)
    torch.manual_seed(n * rows + k)
    qt = quantize(torch.randn(n, k) * 0.05, QuantConfig(group_size=group))
    x = torch.randn(rows, k).to(dtype)
    y = int4_tiles.linear(x, int4_tiles.pack(qt))
    assert y.dtype == dtype and y.shape == (rows, n)
    ref = reference(x, qt, group)
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: the output's own rounding
    assert (y.double() - ref).abs().max() <= tol * ref.abs().max()


@needs_both
def test_both_instruction_sets_agree(pinned):
    tiles = int4_tiles.pack(quantize(torch.randn(80, 320) * 0.05, QuantConfig(group_size=64)))
    x = torch.randn(9, 320)
    a, b = on_both(pinned, lambda: int4_tiles.linear(x, tiles))
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not isas(), reason="kernels not built for this CPU")
def test_leading_dims_and_no_rows():
    qt = quantize(torch.randn(32, 64), QuantConfig(group_size=64))
    tiles = int4_tiles.pack(qt)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(int4_tiles.linear(x, tiles), int4_tiles.linear(x.view(6, 64), tiles).view(2, 3, 32))
    assert int4_tiles.linear(torch.randn(0, 64), tiles).shape == (0, 32)


def test_kernels_off_fall_back_to_aten(monkeypatch):
    monkeypatch.setattr(compiled, "_loaded", [None])
    qt = quantize(torch.randn(32, 64), QuantConfig(group_size=64))
    assert isinstance(int4_tiles.pack_fast(qt), Int4Packed)
    assert int4_tiles.pack_fast(quantize(torch.randn(32, 64), QuantConfig(group_size=16))) is None


def test_a_failed_build_is_logged_once_and_the_pytorch_path_runs(monkeypatch, tmp_path, caplog):
    """No compiler: ops() is None, with one warning naming why."""
    monkeypatch.setattr(compiled, "_loaded", [])
    monkeypatch.delenv("FLEXBATCH_KERNELS", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.delitem(sys.modules, compiled.NAME, raising=False)
    monkeypatch.setattr(compiled, "compiler", lambda: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with caplog.at_level("WARNING", logger="engine.kernels.compiled"):
        assert compiled.ops() is None and compiled.ops() is None
    assert [r.getMessage() for r in caplog.records].count(
        "the project's C++ kernels are unavailable, the PyTorch kernels run instead: "
        "no C++ compiler found (install g++, or set CXX)") == 1
