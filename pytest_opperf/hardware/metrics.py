"""FLOPs and bytes + a hardware spec -> GFLOP/s, GB/s, MFU, MBU.

>>> from pytest_opperf.hardware.specs import HardwareSpec
>>> spec = HardwareSpec("x", matrix_tflops={"bf16": 1000}, mem_bw_gbytes_per_s=2000)
>>> derive(flops=2e12, nbytes=1e9, time_us=4000.0, spec=spec, dtype="bf16", kind="matrix")
{'gflops': 500000.0, 'gbytes_per_s': 250.0, 'mfu': 0.5, 'mbu': 0.125}
"""

from __future__ import annotations

from typing import Optional


def derive(flops: float, nbytes: float, time_us: float, spec, dtype: str, kind: str) -> dict:
    """Throughputs of one call that took time_us, and their fractions of the spec's peaks."""
    seconds = time_us * 1e-6
    if seconds <= 0:
        return {"gflops": None, "gbytes_per_s": None, "mfu": None, "mbu": None}
    flops_per_s = flops / seconds
    bytes_per_s = nbytes / seconds
    if kind == "link":  # a collective: its bytes cross links, not the memory or the cores (busbw_util)
        return {"gflops": flops_per_s / 1e9, "gbytes_per_s": bytes_per_s / 1e9, "mfu": None, "mbu": None}
    peak = spec.peak_flops(dtype, kind)
    bw = spec.mem_bw_bytes_per_s
    return {
        "gflops": flops_per_s / 1e9,
        "gbytes_per_s": bytes_per_s / 1e9,
        "mfu": _ratio(flops_per_s, peak),
        "mbu": _ratio(bytes_per_s, bw),
    }


def _ratio(value: float, peak: Optional[float]) -> Optional[float]:
    return None if not peak else value / peak
