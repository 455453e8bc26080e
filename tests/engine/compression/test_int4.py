"""Group-wise 4-bit compression: error bound, odd sizes, format metadata, packed size, int4pack agreement."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import engine.compression.int4 as quant
from engine.compression.int4 import QTensor, QuantConfig, dequantize, int4_linear, pack_int4, quantize
from engine.errors import InvalidParamsError

pytestmark = pytest.mark.usefixtures("one_thread")


def moved(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x -> [*L, R, C] with the group dim last (the QTensor's logical layout)."""
    x = x.movedim(dim, -1)
    return x.reshape(1, -1) if x.dim() == 1 else x


def per_value(param: torch.Tensor, qt: QTensor) -> torch.Tensor:
    """A per-group parameter [*L, ng, R] -> per value [*L, R, C]."""
    return param.float().movedim(-1, -2).repeat_interleave(qt.config.group_size, -1)[..., : qt.cols]


SHAPES = [((64, 128), -1), ((100, 200), -1), ((3, 4, 37, 70), -1), ((130,), 0), ((5, 70, 9), 1), ((96, 50), 0)]


@pytest.mark.parametrize("shape,dim", SHAPES)
def test_round_trip_within_half_a_step(shape, dim):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 1
    x.view(-1)[::17] *= 20  # outliers widen some groups
    qt = quantize(x, QuantConfig(dim=dim))
    dq = dequantize(qt, dtype=torch.float32)
    assert dq.shape == x.shape
    err = (moved(x, dim) - moved(dq, dim)).abs()
    s = per_value(qt.scales, qt)
    assert torch.all(err <= s / 2 + 2**-20 * (moved(x, dim).abs() + 1))
    assert torch.all(per_value(qt.mins, qt) <= moved(x, dim))  # mins rounded down, never above the data


def test_bfloat16_dequant_is_the_float32_one_rounded():
    torch.manual_seed(1)
    x = torch.randn(64, 192)
    qt = quantize(x)
    ref = dequantize(qt, dtype=torch.float32)
    bf = dequantize(qt, dtype=torch.bfloat16).float()
    bound = 2**-8 * (ref.abs() + per_value(qt.mins, qt).abs() + 15 * per_value(qt.scales, qt))
    assert torch.all((bf - ref).abs() <= bound)


def test_constant_groups_and_zeros_are_exact():
    x = torch.zeros(4, 128)
    x[1] = 0.375
    x[2, :64] = -2.5
    qt = quantize(x)
    assert torch.equal(dequantize(qt, dtype=torch.float32), x)


def test_non_finite_or_out_of_float16_range_raises():
    for bad in (float("nan"), float("inf"), 1e6):
        x = torch.zeros(2, 64)
        x[1, 3] = bad
        with pytest.raises(ValueError, match="float16"):
            quantize(x)


def test_config_is_validated():
    with pytest.raises(InvalidParamsError, match="bits=8"):
        QuantConfig(bits=8)
    with pytest.raises(InvalidParamsError, match="group_size=33"):
        QuantConfig(group_size=33)


def test_quantizing_in_passes_equals_one_pass(monkeypatch):
    x = torch.randn(50, 130)
    whole = quantize(x)
    monkeypatch.setattr(quant, "_ROWS_PER_PASS", 300)  # 2 rows per pass
    parts = quantize(x)
    for a, b in zip((whole.data, whole.mins, whole.scales), (parts.data, parts.mins, parts.scales)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape,dim", SHAPES)
def test_packed_size_is_half_a_byte_per_value_plus_groups(shape, dim):
    qt = quantize(torch.randn(shape), QuantConfig(dim=dim))
    *lead, r, c = moved(torch.empty(shape), dim).shape
    groups = -(-c // 64) * r * torch.Size(lead).numel()
    assert qt.nbytes == groups * 32 + groups * 4  # 64 codes in 32 bytes, float16 min and scale
    if c % 64 == 0:
        assert qt.nbytes == torch.Size(shape).numel() / 2 * (1 + 4 / 32)


def test_metadata_round_trips_through_safetensors(tmp_path):
    x = torch.randn(40, 100, dtype=torch.bfloat16)
    qt = quantize(x, QuantConfig(group_size=32))
    meta = qt.metadata()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    save_file({"data": qt.data, "mins": qt.mins, "scales": qt.scales}, tmp_path / "w.safetensors", metadata=meta)
    from safetensors import safe_open

    with safe_open(tmp_path / "w.safetensors", "pt") as f:
        meta_back = f.metadata()
    t = load_file(tmp_path / "w.safetensors")
    back = QTensor.from_parts(meta_back, t["data"], t["mins"], t["scales"])
    assert (back.shape, back.dtype, back.config) == (qt.shape, qt.dtype, qt.config)
    assert back.metadata() == meta
    assert torch.equal(dequantize(back), dequantize(qt))


def test_from_parts_refuses_mismatched_tensors_or_format():
    qt = quantize(torch.randn(8, 64))
    with pytest.raises(ValueError, match="do not match"):
        QTensor.from_parts(qt.metadata(), qt.data[..., :4], qt.mins, qt.scales)
    with pytest.raises(ValueError, match="not a"):
        QTensor.from_parts({**qt.metadata(), "format": "gptq"}, qt.data, qt.mins, qt.scales)


def test_dequantize_reuses_the_given_buffers():
    qt = quantize(torch.randn(32, 128))
    n = torch.Size(qt.buffer_shape).numel()
    out, scratch = torch.empty(n + 10), torch.empty(n, dtype=torch.uint8)
    dq = dequantize(qt, out=out, scratch=scratch)
    assert dq.data_ptr() == out.data_ptr() and dq.dtype == torch.float32
    assert torch.equal(dq, dequantize(qt, dtype=torch.float32))
    assert dq.mT.is_contiguous()  # W^T contiguous: a plain GEMM operand
    with pytest.raises(ValueError, match="cannot hold"):
        dequantize(qt, out=torch.empty(n - 1))


@pytest.mark.parametrize("n,k", [(64, 128), (100, 200)])
def test_int4_linear_matches_dequant_matmul(n, k):
    torch.manual_seed(2)
    qt = quantize(torch.randn(n, k) * 0.05)
    x = torch.randn(2, 3, k)
    y = int4_linear(x, pack_int4(qt, torch.float32))
    ref = x @ dequantize(qt, dtype=torch.float32).T
    assert y.shape == (2, 3, n)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_int4_linear_bfloat16_is_close():
    torch.manual_seed(3)
    qt = quantize(torch.randn(64, 256) * 0.05)
    x = torch.randn(4, 256)
    y = int4_linear(x.bfloat16(), pack_int4(qt, torch.bfloat16)).float()
    ref = x @ dequantize(qt, dtype=torch.float32).T
    torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)


def test_int4_pack_refuses_unsupported_layouts():
    with pytest.raises(InvalidParamsError, match="group size"):
        pack_int4(quantize(torch.randn(16, 64), QuantConfig(group_size=16)), torch.float32)
    with pytest.raises(InvalidParamsError, match="dim 1"):
        pack_int4(quantize(torch.randn(16, 64), QuantConfig(dim=0)), torch.float32)
