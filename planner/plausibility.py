"""Whether a measured hardware profile can describe this machine: its rate tables checked for the figures a
stalled or broken measurement leaves (`implausible`), before the planner prices plans from them."""

from __future__ import annotations

import math

from planner.hardware import HardwareSpec

MIN_GEMM_GFLOP_PER_S = 10.0  # the least peak of a measured dense GEMM table (`implausible`)
MAX_RATE_FALL = 2.0  # how many times below its best at fewer rows a table's rate may fall (`implausible`)


def implausible(spec: HardwareSpec) -> str | None:
    """Why a measured profile's rate tables cannot describe this machine, naming the figure, or None when they can.
    Each GEMM table (streamed, cache-hot and float32 dense GEMMs, the compressed kernels) and the prefill attention
    table of each device is rejected when

    - a rate is not a positive finite number (a broken timing);
    - a dense GEMM table's best rate is below MIN_GEMM_GFLOP_PER_S: its largest call (1024 rows x 2048 x 6144) is
      compute-bound, one AVX2 core at 2 GHz peaks at 64 GFLOP/s in float32 and the slowest machine measured here
      did 104 on 2 threads, while 2 threads sharing their cores with another process measured 0.01-4 GFLOP/s
      (OpenMP's team waiting for a descheduled thread);
    - along one width, a rate falls below 1/MAX_RATE_FALL of the best rate at fewer rows (shorter prompts, for
      prefill attention): more rows are more of the same work, and the rate per FLOP grows or levels off with them
      on every machine measured, so a steep fall is a call that stalled (the spirit of
      `engine.kernels.rates.plausible`, which bounds the times of one shape's calls the same way).

    The ratios of dense_reorder_gain are not rates; their entries pass `engine.kernels.rates.plausible`."""
    for name, points, curves, floor in rate_tables(spec):
        for width, curve in curves:
            if not all(math.isfinite(g) and g > 0 for g in curve):
                return f"{name}{width} = {curve} holds a rate that is not a positive number"
        peak = max(max(curve) for _, curve in curves)
        if not peak >= floor:
            return f"{name} peaks at {peak:.3g} GFLOP/s, below the {floor:g} that any CPU core computes"
        for width, curve in curves:
            for i in range(1, len(curve)):
                best = max(curve[:i])
                if not curve[i] * MAX_RATE_FALL >= best:
                    return (f"{name}{width} falls from {best:.3g} GFLOP/s to {curve[i]:.3g} at {points[i]} "
                            f"(more work is never {MAX_RATE_FALL:g}x slower per FLOP)")
    return None


def rate_tables(spec: HardwareSpec) -> list[tuple[str, list[str], list[tuple[str, tuple]], float]]:
    """Each non-empty rate table of `spec`'s devices as (name, its points: row counts or prompt lengths, its curves
    as (" at width w" or "", rates), the least peak rate `implausible` accepts: MIN_GEMM_GFLOP_PER_S for a dense
    GEMM table, 0 for the others)."""
    out = []
    for device_name in ("cpu", "gpu"):
        device = getattr(spec, device_name)
        if device is None:
            continue
        gemms = {"matmul_gflop_per_s": device.matmul_gflop_per_s,
                 "matmul_hot_gflop_per_s": device.matmul_hot_gflop_per_s,
                 "matmul_f32_gflop_per_s": device.matmul_f32_gflop_per_s,
                 **{f"kernel_gflop_per_s[{fmt}]": table for fmt, table in device.kernel_gflop_per_s.items()}}
        rows = [f"{r} rows" for r in device.matmul_rows]
        widths = [f" at width {w}" for w in device.matmul_widths]
        for name, table in gemms.items():
            if table:
                floor = MIN_GEMM_GFLOP_PER_S if name.startswith("matmul") else 0.0
                curves = list(zip(widths, table)) if widths else [("", table)]
                out.append((f"{device_name}.{name}", rows, curves, floor))
        if device.attention_prefill_gflop_per_s:
            out.append((f"{device_name}.attention_prefill_gflop_per_s",
                        [f"{n}-token prompts" for n in device.attention_prefill_lens],
                        [("", device.attention_prefill_gflop_per_s)], 0.0))
    return out
