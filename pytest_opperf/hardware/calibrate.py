"""Measured ceilings: what this device reaches, beside what its datasheet says.

A datasheet peak is not reachable: an H100's bf16 GEMMs top out near 80% of 989 TFLOP/s and a
copy near 90% of 3.35 TB/s, and a CPU spec has no peaks at all. `calibrate()` measures, with the
project's own timers (measure/timers/), the ceilings that rows are then also held against:

    copy     dst.copy_(src) of a buffer far past the last-level cache (bytes read + written)
    read     a sum over that buffer (a read-only reduction)
    matrix   large square GEMMs per dtype the device runs (the best size of those tried)
    vector   an FMA-bound elementwise kernel (CUDA: a jiterator kernel of a long fma chain per
             element, computed in fp32; a CPU: its fp32 GEMM, which runs on the same SIMD FMA
             units, since eager torch has no FMA-bound elementwise kernel on a CPU)
    launch   host time per call of a one-element add, 100 back to back (dispatch + launch)

Each measurement is one row of the `ceilings` table (store/ceilings.py): its statistics like an
op row, the method in words, the datasheet figure beside it, and the environment it was taken in
(driver, torch, clocks, power limit, threads), which stale_reasons() compares with a run's.

>>> cal = Calibration([{"quantity": "matrix", "dtype": "bf16", "tflops": 800.0, "calibration_id": "c1"},
...                    {"quantity": "copy", "dtype": "", "gbytes_per_s": 3000.0, "calibration_id": "c1"}])
>>> attainable(flops=8e11, nbytes=3e9, time_us=2000.0, calibration=cal, dtype="bf16", kind="matrix")
{'mfu_attainable': 0.5, 'mbu_attainable': 0.5}
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

from pytest_opperf import dtypes as dtype_table
from pytest_opperf.version import __version__

QUANTITIES = ("copy", "read", "matrix", "vector", "launch")
# What a staleness check compares: a ceiling measured under another driver, torch, clock setting,
# power limit or thread count is not this run's ceiling. `host` counts on a CPU only: two hosts
# with the same GPU model share ceilings, two hosts called "cpu" rarely share a processor.
ENVIRONMENT = ("device_reported", "driver", "cuda", "hip", "torch", "sm_clock_mhz", "mem_clock_mhz",
               "power_limit_w", "threads", "host")

# Sizes. Accelerators: square GEMMs of 4096 and 8192 (the best counts), buffers of 512 MiB (at
# least 16x any GPU's L2). A CPU's sizes are chosen for time, a few seconds in all on two cores:
# fp32 GEMMs of 1024 (~0.1 s a call on a 2-core EPYC VM), fp16/bf16 of 256 (torch's CPU kernels
# for them are ~40x slower there), buffers of 64 MiB (twice a 32 MiB L3). A CPU's sizes are keyed
# by bytes per element.
GEMM_SIZES = {"accelerator": (4096, 8192), "cpu": {4: (1024,), 2: (256,)}}
BUFFER_BYTES = {"accelerator": 512 << 20, "cpu": 64 << 20}
FMA_CHAIN = 1024  # fmas per element of the vector kernel: 2048 FLOP per 8 bytes moved
VECTOR_ELEMENTS = 1 << 24
LAUNCH_CALLS = 100


@dataclass(frozen=True)
class Rules:
    """How long each measurement samples: a StoppingRule's fields, and the warm-up."""

    target_rel: float
    min_samples: int
    max_samples: int
    budget_s: float
    warmup_s: float


RULES = {"accelerator": Rules(0.01, 10, 500, 0.5, 0.2), "cpu": Rules(0.02, 3, 50, 0.2, 0.0)}


class CalibrationError(Exception):
    pass


# --- what a calibration says ------------------------------------------------------------------


class Calibration:
    """The rows of one calibration, and the ceilings they give."""

    def __init__(self, rows: list[dict]):
        if not rows:
            raise CalibrationError("a calibration needs at least one measurement")
        self.rows = rows

    @property
    def id(self) -> str:
        return self.rows[0]["calibration_id"]

    @property
    def created_at(self) -> str:
        return self.rows[0].get("created_at") or ""

    @property
    def environment(self) -> dict:
        return {k: self.rows[0].get(k) for k in ENVIRONMENT}

    @property
    def contention(self) -> Optional[str]:
        """What else ran during the calibration (measure.contention); None: the machine was quiet, or not watched."""
        return self.rows[0].get("contention")

    def _best(self, quantity: str, dtype: str, column: str) -> Optional[float]:
        values = [r[column] for r in self.rows
                  if r["quantity"] == quantity and r.get("dtype", "") == dtype and r.get(column)]
        return max(values) if values else None

    def peak_flops(self, dtype: str, kind: str) -> Optional[float]:
        """The measured FLOP/s ceiling of the matrix or vector units for dtype, or None.

        A vector op of any dtype is held against the fp32 vector ceiling when its own dtype has
        none: torch computes fp16/bf16 elementwise math in fp32 (its "opmath" type).
        """
        quantity = "matrix" if kind == "matrix" else "vector"
        tflops = self._best(quantity, dtype, "tflops")
        if tflops is None and quantity == "vector":
            tflops = self._best("vector", "fp32", "tflops")
        return None if tflops is None else tflops * 1e12

    @property
    def mem_bytes_per_s(self) -> Optional[float]:
        """The better of the copy and the read-only reduction: the bandwidth a kernel can reach."""
        values = [v for v in (self._best("copy", "", "gbytes_per_s"), self._best("read", "", "gbytes_per_s")) if v]
        return max(values) * 1e9 if values else None

    @property
    def launch_us(self) -> Optional[float]:
        rows = [r for r in self.rows if r["quantity"] == "launch" and r.get("time_us")]
        return rows[0]["time_us"] if rows else None

    def stale_reasons(self, now: dict) -> list[str]:
        """What changed since the calibration, as 'torch 2.12.0 -> 2.13.0'; [] when nothing did.

        Only fields known on both sides count (a CPU has no driver; NVML may be missing).
        """
        reasons = []
        cpu = (self.environment.get("cuda") is None and self.environment.get("hip") is None
               and now.get("cuda") is None and now.get("hip") is None)
        for key in ENVIRONMENT:
            if key == "host" and not cpu:
                continue
            then, current = self.environment.get(key), now.get(key)
            if then is None or current is None or str(then) == str(current):
                continue
            reasons.append(f"{key} {then} -> {current}")
        if self.contention:
            reasons.append(f"measured on a busy machine ({self.contention})")
        return reasons


def attainable(flops: float, nbytes: float, time_us: float, calibration: Optional[Calibration], dtype: str,
               kind: str) -> dict:
    """A row's FLOP/s and bytes/s as fractions of the measured ceilings (None where there is none)."""
    out = {"mfu_attainable": None, "mbu_attainable": None}
    if calibration is None or not time_us or time_us <= 0:
        return out
    seconds = time_us * 1e-6
    peak = calibration.peak_flops(dtype, kind)
    bw = calibration.mem_bytes_per_s
    if peak and flops:
        out["mfu_attainable"] = flops / seconds / peak
    if bw and nbytes:
        out["mbu_attainable"] = nbytes / seconds / bw
    return out


# --- the environment a calibration is valid for -------------------------------------------------


def environment(device, reported_name: str) -> dict:
    """The fields of ENVIRONMENT for this process and device (None where unknown)."""
    import torch

    env = {k: None for k in ENVIRONMENT}
    env.update(device_reported=reported_name, torch=str(torch.__version__),
               cuda=None if torch.version.cuda is None else str(torch.version.cuda),
               hip=None if getattr(torch.version, "hip", None) is None else str(torch.version.hip),
               host=socket.gethostname())
    if device.type == "cpu":
        env["threads"] = torch.get_num_threads()
    if device.type == "cuda":
        env.update(_nvml_settings(device))
    return env


def _nvml_settings(device) -> dict:
    """Driver, the clocks the GPU is set to (applications clocks, else its max) and its power limit."""
    from pytest_opperf.measure import devstate

    monitor = devstate.open_monitor(device)
    nv, handle = monitor.nvml, monitor.handle
    if handle is None:
        return {}

    def read(name: str, *args):
        fn = getattr(nv, name, None)
        try:
            return fn(handle, *args) if fn is not None else None
        except Exception:  # NVMLError_NotSupported: that setting is unknown, the others stand
            return None

    driver = None
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        pass
    limit_mw = read("nvmlDeviceGetEnforcedPowerLimit")
    return {"driver": driver, "sm_clock_mhz": monitor.sm_clock_target(),
            "mem_clock_mhz": read("nvmlDeviceGetApplicationsClock", nv.NVML_CLOCK_MEM)
            or read("nvmlDeviceGetMaxClockInfo", nv.NVML_CLOCK_MEM),
            "power_limit_w": None if limit_mw is None else limit_mw / 1000.0}


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Probe:
    """One measurement: what runs, its FLOPs and bytes per call, and how it is described."""

    quantity: str
    dtype: str
    shape: str
    method: str
    make: Callable[[], Callable]  # builds the inputs on the device, returns the call to time
    flops: float = 0.0
    nbytes: float = 0.0
    timer: Optional[str] = None  # None: the device's default timer
    calls_per_sample: int = 1


def calibrate(device, spec, reported_name: str, log: Callable[[str], None] = lambda line: None,
              seed: int = 0, watch=None) -> Calibration:
    """Measure every ceiling this device has (see the module's docstring); one row each.

    A probe the device cannot run (fp8 before sm_89, a kernel that fails to compile) is left out
    with a line to `log`; the calibration fails only when nothing could be measured. What else ran
    meanwhile (`watch`: the probe each case gets, measure.contention.Probe) is kept in every row's
    `contention` when it saw contention, and a busy machine is a warning to `log`: its ceilings are
    low, and such a calibration counts as stale (stale_reasons).
    """
    import torch

    from pytest_opperf.measure import contention, devstate
    from pytest_opperf.measure.stats import StoppingRule
    from pytest_opperf.measure.accelerator import synchronize
    from pytest_opperf.measure.sampler import measure
    from pytest_opperf.measure.timers import default_timer

    side = "cpu" if device.type == "cpu" else "accelerator"
    rules = RULES[side]
    rule = StoppingRule(rules.target_rel, rules.min_samples, rules.max_samples, rules.budget_s)
    env = environment(device, reported_name)
    calibration_id = uuid.uuid4().hex[:16]
    created_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    rows = []
    started = time.perf_counter()
    watch = watch if watch is not None else contention.Probe(devstate.open_monitor(device))
    watch.start(threads=torch.get_num_threads() if device.type == "cpu" else 1)
    for probe in probes(device, seed):
        try:
            fn = probe.make()
            timer = probe.timer or default_timer(device.type)
            m = measure(fn, device, timer, "hot", rule, warmup_s=rules.warmup_s, calls_per_sample=probe.calls_per_sample)
        except Exception as exc:  # one unsupported probe must not cost the others
            label = " ".join(part for part in (probe.quantity, probe.dtype, probe.shape) if part)
            log(f"{label}: not measured ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})")
            continue
        finally:
            fn = None
            synchronize(device.type)
            _free(device)
        rows.append(_row(probe, m, spec, env, calibration_id, created_at, device))
    if device.type == "cpu":
        rows.extend(_cpu_vector_rows(rows, spec))
    if not rows:
        raise CalibrationError(f"nothing could be measured on {device}")
    seen = watch.stop()
    busy = seen["contention"] if seen.get("contended") else None
    for row in rows:
        row["contention"] = busy
    if busy:
        log(f"warning: the machine was busy during the calibration ({busy}): its ceilings may be low and rows "
            f"held against them read high; it counts as stale: rerun `opperf calibrate` on an idle machine")
    log(f"calibrated {spec.name} in {time.perf_counter() - started:.1f} s ({len(rows)} measurements)")
    return Calibration(rows)


def probes(device, seed: int = 0) -> list[Probe]:
    """The measurements for this device, in the order they run."""
    import torch

    side = "cpu" if device.type == "cpu" else "accelerator"
    gen = torch.Generator(device=device).manual_seed(seed)
    nbytes = _buffer_bytes(device)
    n = nbytes // 4
    out = [
        Probe("copy", "", f"{nbytes >> 20} MiB fp32", "dst.copy_(src): bytes read + written over time",
              lambda: _copy(n, device, gen), nbytes=2 * n * 4),
        Probe("read", "", f"{nbytes >> 20} MiB fp32", "torch.sum(x) into one fp32: bytes read over time",
              lambda: _read(n, device, gen), nbytes=n * 4),
    ]
    for dtype in _matrix_dtypes(device):
        sizes = GEMM_SIZES["cpu"][dtype_table.lookup(dtype).itemsize] if side == "cpu" else GEMM_SIZES["accelerator"]
        for size in sizes:
            out.append(Probe("matrix", dtype, f"m=n=k={size}", _gemm_method(dtype),
                             lambda d=dtype, s=size: _gemm(d, s, device, gen),
                             flops=2.0 * size ** 3, nbytes=_gemm_bytes(dtype, size)))
    if device.type == "cuda":
        out.append(Probe("vector", "fp32", f"{VECTOR_ELEMENTS} elements x {FMA_CHAIN} fma",
                         f"jiterator kernel: x = x * a + b, {FMA_CHAIN} times per element, in fp32",
                         lambda: _fma_chain(device, gen), flops=2.0 * FMA_CHAIN * VECTOR_ELEMENTS,
                         nbytes=2 * 4 * VECTOR_ELEMENTS))
    out.append(Probe("launch", "", "1 element", f"x.add_(1) on one element, {LAUNCH_CALLS} calls back to back, "
                     f"host clock with a synchronize at the ends", lambda: _launch(device),
                     timer="cpu", calls_per_sample=LAUNCH_CALLS))
    return out


def _matrix_dtypes(device) -> list[str]:
    if device.type == "cpu":
        return ["fp32", "bf16", "fp16"]
    dtypes = ["bf16", "fp16", "fp32"]
    if device.type == "cuda":
        import torch

        if torch.cuda.get_device_capability(device) >= (8, 9) and hasattr(torch, "float8_e4m3fn"):
            dtypes.append("fp8")
        dtypes.append("int8")
    return dtypes


def _gemm_method(dtype: str) -> str:
    if dtype == "fp8":
        return "torch._scaled_mm, e4m3 x e4m3 with unit tensor-wise scales, bf16 out (B column-major)"
    if dtype == "int8":
        return "torch._int_mm, int8 x int8 -> int32"
    return f"torch.matmul of two square {dtype} matrices (torch's default matmul precision flags)"


def _gemm_bytes(dtype: str, size: int) -> float:
    item_in = dtype_table.lookup(dtype).itemsize
    item_out = dtype_table.lookup(_gemm_out(dtype)).itemsize
    return float(2 * size * size * item_in + size * size * item_out)


def _gemm_out(dtype: str) -> str:
    """The dtype the probe's GEMM writes: fp8 GEMMs write bf16 (torch._scaled_mm), int8 ones int32."""
    return "bf16" if dtype == "fp8" else "int32" if dtype == "int8" else dtype


def _gemm(dtype: str, size: int, device, gen) -> Callable:
    import torch

    if dtype == "fp8":
        a = torch.randn(size, size, device=device, generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(size, size, device=device, generator=gen).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if dtype == "int8":
        a = torch.randint(-128, 128, (size, size), device=device, generator=gen, dtype=torch.int8)
        b = torch.randint(-128, 128, (size, size), device=device, generator=gen, dtype=torch.int8)
        return lambda: torch._int_mm(a, b)
    t = dtype_table.lookup(dtype).torch
    a = torch.randn(size, size, device=device, generator=gen, dtype=t)
    b = torch.randn(size, size, device=device, generator=gen, dtype=t)
    return lambda: torch.matmul(a, b)


def _copy(n: int, device, gen) -> Callable:
    import torch

    src = torch.rand(n, device=device, generator=gen)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _read(n: int, device, gen) -> Callable:
    import torch

    x = torch.rand(n, device=device, generator=gen)
    total = torch.empty((), device=device)
    return lambda: torch.sum(x, dim=0, out=total)


def _fma_chain(device, gen) -> Callable:
    import torch
    from torch.cuda import jiterator

    # a < 1 and b = 1 - a hold every x in [0, 1] there (the fixed point is 1): no overflow, no
    # denormals, and the compiler cannot fold a runtime a and b away.
    code = ("template <typename T> T opperf_fma_chain(T x, T a, T b) {\n"
            f"  #pragma unroll 64\n  for (int i = 0; i < {FMA_CHAIN}; ++i) {{ x = x * a + b; }}\n"
            "  return x;\n}")
    kernel = jiterator._create_jit_fn(code, a=0.999, b=0.001)
    x = torch.rand(VECTOR_ELEMENTS, device=device, generator=gen)
    return lambda: kernel(x, a=0.999, b=0.001)


def _launch(device) -> Callable:
    import torch

    x = torch.zeros(1, device=device)
    return lambda: x.add_(1)


def _buffer_bytes(device) -> int:
    if device.type == "cpu":
        return BUFFER_BYTES["cpu"]
    nbytes = BUFFER_BYTES["accelerator"]
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        nbytes = min(nbytes, free // 8)  # two buffers and room for the allocator
    return max(nbytes, 1 << 20)


def _free(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def _row(probe: Probe, m, spec, env: dict, calibration_id: str, created_at: str, device) -> dict:
    s = m.stats
    seconds = s.median * 1e-6
    tflops = probe.flops / seconds / 1e12 if probe.flops and seconds > 0 else None
    gbytes = probe.nbytes / seconds / 1e9 if probe.nbytes and seconds > 0 and probe.quantity in ("copy", "read") else None
    datasheet_tflops = datasheet_gbytes = None
    if probe.quantity in ("matrix", "vector"):
        peak = spec.peak_flops(probe.dtype, probe.quantity)
        datasheet_tflops = None if peak is None else peak / 1e12
    if probe.quantity in ("copy", "read"):
        datasheet_gbytes = spec.mem_bw_gbytes_per_s
    measured, sheet = (tflops, datasheet_tflops) if tflops is not None else (gbytes, datasheet_gbytes)
    row = {
        "calibration_id": calibration_id, "device": spec.name, "quantity": probe.quantity, "dtype": probe.dtype,
        "shape": probe.shape, "method": probe.method, "tflops": tflops, "gbytes_per_s": gbytes,
        "datasheet_tflops": datasheet_tflops, "datasheet_gbytes_per_s": datasheet_gbytes,
        "ratio": measured / sheet if measured and sheet else None,
        "flops": probe.flops or None, "bytes": probe.nbytes or None,
        "time_us": s.median, "time_us_mean": s.mean, "time_us_p95": s.p95, "time_us_std": s.std,
        "time_us_min": s.min, "cv": s.steady.cv, "samples": s.n, "ci_rel": s.median_ci_rel, "target_met": int(m.met),
        "timer": m.timer, "cache": m.cache, "calls_per_sample": m.calls_per_sample, "warmup_calls": m.warmup_calls,
        "torch_device": str(device), "plugin_version": __version__, "python": platform.python_version(),
        "pid": os.getpid(), "created_at": created_at,
    }
    row.update(env)
    return row


def _cpu_vector_rows(rows: list[dict], spec) -> list[dict]:
    """A CPU's vector ceiling: its fp32 GEMM's rate (the same SIMD FMA units), as a row of its own."""
    gemms = [r for r in rows if r["quantity"] == "matrix" and r["dtype"] == "fp32" and r.get("tflops")]
    if not gemms:
        return []
    best = dict(max(gemms, key=lambda r: r["tflops"]))
    peak = spec.peak_flops("fp32", "vector")
    best.update(quantity="vector", method="the fp32 GEMM's rate above: a CPU multiplies matrices on its SIMD "
                "FMA units, and eager torch has no FMA-bound elementwise kernel there",
                datasheet_tflops=None if peak is None else peak / 1e12,
                ratio=best["tflops"] / (peak / 1e12) if peak else None)
    return [best]
