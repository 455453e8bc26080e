"""The fused layer kernels (engine/kernels/layer_ops.py) against today's PyTorch code, on every instruction set this
CPU runs, float32 and bfloat16, odd widths and many rows; and the seam (NativeKernels) falling back where they do
not take the operands.

Tolerances: RoPE is bit-equal. RMSNorm differs from PyTorch only in the order of the mean's sum: bit-equal where
that sum is exact (small integers), else float32 within 4 ulp and bfloat16 one rounding step apart for at most
1 value in 10^4. SiLU * up: exp within 2 ulp, so float32 within 4 ulp and bfloat16 as for the norm."""

import threading

import pytest
import torch

from engine.kernels import compiled, layer_ops
from engine.kernels.native import NativeKernels
from engine.kernels.rope import cos_sin, inv_frequencies
from engine.spec import RopeSpec
from tests.engine.kernels.own_isas import isas

DTYPES = [torch.float32, torch.bfloat16]
F32_ULPS = 4 * torch.finfo(torch.float32).eps
BF16_STEP = 2 * torch.finfo(torch.bfloat16).eps  # two roundings: the normalized value, then its product


def assert_close_to(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    rel = ((got.float() - want.float()).abs() / want.float().abs().clamp_min(1e-6)).max().item()
    if dtype == torch.float32:
        assert rel <= F32_ULPS, rel
    else:
        assert rel <= BF16_STEP, rel
        assert (got != want).sum().item() <= max(1, want.numel() // 10_000)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 1024), (37, 1000), (300, 17), (129, 4096), (5, 33)])
def test_add_rms_norm_equals_pytorch(pinned, isa, dtype, rows, n):
    pinned(isa)
    torch.manual_seed(rows + n)
    h = torch.randn(rows, n) * 3
    delta = torch.randn(rows, n).to(dtype)
    w = (torch.rand(n) + 0.5).to(dtype)
    want_h, want_x = layer_ops.add_rms_norm(h, delta, w, 1e-5, in_place=False)
    got_h, got_x = layer_ops.fused_add_rms_norm(h, delta, w, 1e-5, in_place=False)
    assert torch.equal(got_h, want_h)  # one float32 add: bit-equal
    assert_close_to(got_x, want_x, dtype)
    assert_close_to(layer_ops.fused_add_rms_norm(h, None, w, 1e-5, True)[1], layer_ops.rms_norm(h, w, 1e-5), dtype)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1024, 999, 23])
def test_rms_norm_rounds_as_pytorch_does(pinned, isa, dtype, n):
    """With small integers the sum of squares is exact in any order: then every value is bit-equal, which pins
    the rounding steps (normalized in float32, rounded to the dtype, times the weight, rounded again)."""
    pinned(isa)
    torch.manual_seed(n)
    h = torch.randint(-8, 9, (64, n)).float()
    delta = torch.randint(-4, 5, (64, n)).to(dtype)
    w = torch.randn(n).to(dtype)
    want_h, want_x = layer_ops.add_rms_norm(h.clone(), delta, w, 1e-6, in_place=True)
    got_h, got_x = layer_ops.fused_add_rms_norm(h, delta, w, 1e-6, in_place=True)
    assert got_h is h and torch.equal(h, want_h)
    assert torch.equal(got_x, want_x)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,f", [(1, 2816), (32, 1000), (200, 13), (3, 11008)])
def test_silu_mul_equals_pytorch(pinned, isa, dtype, rows, f):
    pinned(isa)
    torch.manual_seed(rows + f)
    gate_up = (torch.randn(rows, 2 * f) * 4).to(dtype)
    gate_up[0, :8] = torch.tensor([100.0, -100.0, 88.5, -88.5, 0.0, -1e-3, 20.0, -20.0])  # exp's range ends
    assert_close_to(layer_ops.fused_silu_mul(gate_up), layer_ops.silu_mul(gate_up), dtype)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,S,NH,KVH,D", [(1, 1, 16, 4, 64), (32, 1, 16, 4, 64), (2, 300, 4, 2, 128),
                                          (3, 5, 3, 1, 80), (2, 7, 2, 1, 18)])
def test_rope_is_bit_equal_to_pytorch(pinned, isa, dtype, B, S, NH, KVH, D):
    pinned(isa)
    torch.manual_seed(B * S + D)
    qkv = torch.randn(B, S, (NH + 2 * KVH) * D).to(dtype)
    positions = torch.randint(0, 5000, (B, S))
    tables = cos_sin(inv_frequencies(RopeSpec(), D), positions, dtype)
    native = NativeKernels()
    want_q, want_k = native.rope(*layer_ops.split_heads(qkv, NH, KVH, D)[:2], tables)
    v = layer_ops.split_heads(qkv, NH, KVH, D)[2].clone()
    q, k, got_v = native.rope_qkv(qkv, tables, NH, KVH, D)
    assert q.data_ptr() == qkv.data_ptr()  # rotated in place
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(got_v, v)


def logits_with_hard_cases(n: int) -> torch.Tensor:
    """Rows whose argmax is easy to get wrong: ties within a lane and across lanes, the largest value last, only
    -inf, NaNs (torch.argmax answers the first NaN), -0.0 beside 0.0, and plain random rows."""
    torch.manual_seed(n)
    x = torch.randn(12, n)
    x[1] = torch.randint(-3, 4, (n,)).float()  # many ties of the largest value
    x[2, -1] = 100.0
    x[3] = float("-inf")
    x[4, n // 2] = float("nan")
    x[5, -1], x[5, 0] = float("nan"), 50.0
    x[6] = 0.0
    x[6, n // 3] = -0.0
    x[7] = -x[7].abs()
    x[7, n - 1 - n // 5] = -0.0
    x[8] = 7.0  # every value the largest: index 0
    x[9, 0] = float("inf")
    x[10, n - 1], x[10, max(0, n - 17)] = float("inf"), float("inf")
    return x


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("n", [1, 5, 8, 15, 16, 17, 31, 33, 1000, 32000, 32003])
def test_argmax_rows_gives_torchs_index(pinned, isa, n):
    pinned(isa)
    x = logits_with_hard_cases(n)
    got = layer_ops.argmax_rows(x)
    assert got.dtype == torch.long and torch.equal(got, x.argmax(-1)), (got, x.argmax(-1))
    strided = torch.cat([x, x], dim=1)[:, :n]  # rows 2n apart
    assert torch.equal(layer_ops.argmax_rows(strided), x.argmax(-1))
    assert torch.equal(layer_ops.argmax_rows(x[4]), x[4].argmax(-1))  # one row: a 0-d index
    assert torch.equal(layer_ops.argmax_rows(x.view(3, 4, n)), x.view(3, 4, n).argmax(-1))


@pytest.mark.skipif(not isas(), reason="kernels not built for this CPU")
def test_the_seam_falls_back_where_the_kernels_do_not_take_the_operands():
    native = NativeKernels()
    h, w = torch.randn(4, 3, 40), torch.randn(40, dtype=torch.float16)
    assert layer_ops.fused_add_rms_norm(h, None, w, 1e-5, True) is None  # float16: PyTorch
    assert compiled.ops().argmax_rows(h.bfloat16()) is None  # logits other than float32: torch.argmax
    assert torch.equal(layer_ops.argmax_rows(h.bfloat16()), h.bfloat16().argmax(-1))
    assert compiled.ops().argmax_rows(torch.randn(5, 40)[:, ::2]) is None
    torch.testing.assert_close(native.rms_norm(h, w, 1e-5), layer_ops.rms_norm(h, w, 1e-5), rtol=0, atol=0)
    assert layer_ops.fused_add_rms_norm(h.to(torch.bfloat16), None, w.float(), 1e-5, True) is None  # h not float32
    strided = torch.randn(4, 80)[:, ::2]
    assert layer_ops.fused_silu_mul(strided) is None
    torch.testing.assert_close(native.silu_mul(strided), layer_ops.silu_mul(strided), rtol=0, atol=0)
    assert layer_ops.fused_silu_mul(torch.randn(3, 7)) is None  # odd width
    qkv = torch.randn(2, 3, 4 * 16)
    cos, sin = cos_sin(inv_frequencies(RopeSpec(), 16), torch.arange(3).view(1, 3), torch.float32)
    assert layer_ops.fused_rope_qkv(qkv, cos, sin, 2, 1, 16) is None  # tables broadcast over the batch: PyTorch
    q, k, _ = native.rope_qkv(qkv, (cos, sin), 2, 1, 16)
    want = native.rope(*layer_ops.split_heads(qkv, 2, 1, 16)[:2], (cos, sin))
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


@pytest.mark.skipif(not isas(), reason="kernels not built for this CPU")
def test_strided_rows_are_taken_where_they_are_evenly_spaced():
    """The head's norm gets the last position of each row, h[:, -1]: rows S * H apart."""
    h, w = torch.randn(3, 5, 40), torch.randn(40)
    last = h[:, -1]
    torch.testing.assert_close(layer_ops.fused_add_rms_norm(last, None, w, 1e-5, True)[1],
                               layer_ops.rms_norm(last, w, 1e-5), rtol=F32_ULPS, atol=1e-6)
    gate_up = torch.randn(4, 6, 2 * 24)[:, 2:4]  # [4, 2, 48] with rows 48 apart, batches 288 apart: not even
    assert layer_ops.fused_silu_mul(gate_up) is None
    qkv = torch.randn(2, 4, 2 * 4 * 16)[:, :, : 4 * 16]  # rows 128 apart
    cos, sin = cos_sin(inv_frequencies(RopeSpec(), 16), torch.arange(8).view(2, 4), torch.float32)
    want_q, want_k = NativeKernels().rope(*layer_ops.split_heads(qkv, 2, 1, 16)[:2], (cos, sin))
    q, k, _ = layer_ops.fused_rope_qkv(qkv, cos, sin, 2, 1, 16)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


@pytest.mark.skipif(not isas(), reason="kernels not built for this CPU")
def test_leading_dims_in_place_and_no_rows():
    h, delta, w = torch.randn(2, 3, 40), torch.randn(2, 3, 40), torch.randn(40)
    before = h.clone()
    out, x = NativeKernels().add_rms_norm(h, delta, w, 1e-5, in_place=False)
    assert torch.equal(h, before) and out.shape == x.shape == (2, 3, 40)
    out, x = NativeKernels().add_rms_norm(h, delta, w, 1e-5, in_place=True)
    assert out is h and torch.equal(h, before + delta)
    empty = torch.empty(0, 40)
    assert NativeKernels().rms_norm(empty, w, 1e-5).shape == (0, 40)
    assert NativeKernels().silu_mul(torch.empty(0, 2, 8)).shape == (0, 2, 4)


def test_off_the_kernels_the_pytorch_path_runs(monkeypatch):
    monkeypatch.setattr(compiled, "ops", lambda: None)
    h, w = torch.randn(3, 40), torch.randn(40)
    assert layer_ops.fused_add_rms_norm(h, None, w, 1e-5, True) is None
    assert torch.equal(NativeKernels().rms_norm(h, w, 1e-5), layer_ops.rms_norm(h, w, 1e-5))


@pytest.mark.skipif(not isas(), reason="kernels not built for this CPU")
def test_a_kernel_call_keeps_the_calling_threads_torch_threads():
    """The weight prefetcher sets one torch thread for itself; a thread's first kernel call must not apply that
    to the calling thread (csrc/parallel.h)."""
    before, seen = torch.get_num_threads(), {}

    def caller():
        torch.set_num_threads(2)
        torch.get_num_threads()  # torch's own first-use initialization of this thread, done before the prefetcher
        prefetcher = threading.Thread(target=torch.set_num_threads, args=(1,))
        prefetcher.start()
        prefetcher.join()
        NativeKernels().rms_norm(torch.randn(4, 64), torch.ones(64), 1e-5)
        seen["threads"] = torch.get_num_threads()

    try:
        thread = threading.Thread(target=caller)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen["threads"] == 2
