"""What the per-case extras cost on one GPU: the profiled call for kernel names, and NVML readings.

Decides whether --opperf-kernel-names=auto can stay the default under the harness-cost target
(<= 40 ms per stable case): for a few kernels, the wall time of one profiled call after timing
(the first in the process separately: the profiler's start-up), and of a before/after pair of
device-state readings. Also prints the names found, to eyeball that they are the library's.

    python3 benchmarks/probes/kernel_names_cost.py --out DIR      # writes DIR/kernel_names_cost.json
    python3 benchmarks/probes/kernel_names_cost.py --out DIR --device cpu   # smoke run: no GPU, all None
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path
from typing import Optional

import torch

from pytest_opperf import dtypes
from pytest_opperf.catalog.ops.matmul import gemm
from pytest_opperf.catalog.ops.memory import add
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.measure import accelerator, devstate, inputs, timers

REPEATS = 20


def _dt(name):
    return DTypes(dtypes.lookup(name), dtypes.lookup(name))


def workloads(device):
    gen = torch.Generator(device=device).manual_seed(0)
    for n in (2**16, 2**24):
        yield f"add fp32 n=2^{n.bit_length() - 1}", inputs.Workload(add.add_torch, add.inputs({"n": n}, _dt("fp32"), device, gen))
    for s in (256, 4096):
        args = gemm.inputs({"m": s, "n": s, "k": s}, _dt("bf16" if device.type != "cpu" else "fp32"), device, gen)
        yield f"gemm {s}^3", inputs.Workload(gemm.gemm_torch, args)


def profiled_kernel_names(work: inputs.Workload, device) -> Optional[list[str]]:
    """The kernels one profiled call of `work` runs, unique, in call order; None if unknown (a device
    the profiler cannot trace, or a call without kernels). What the plugin once did after timing
    with another timer, kept here as the procedure this script times."""
    if timers.ProfilerTimer.unsupported(device.type):
        return None
    tmr = timers.ProfilerTimer(work, device, "hot", None)
    try:
        tmr.sample(1)
    except timers.TimerError:
        return None
    return tmr.kernels


def _ms(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device, 0) if args.device != "cpu" else torch.device("cpu")
    monitor = devstate.open_monitor(device)
    rows = []
    first_ms = None
    for label, work in workloads(device):
        work()
        accelerator.synchronize(device.type)
        if first_ms is None:
            first_ms, _ = _ms(lambda: profiled_kernel_names(work, device))
        names_ms, names = [], None
        for _ in range(REPEATS):
            t, names = _ms(lambda: profiled_kernel_names(work, device))
            names_ms.append(t)
        nvml_ms = [_ms(lambda: (monitor.read(), monitor.read()))[0] for _ in range(REPEATS)]
        rows.append({"case": label, "names_ms_median": statistics.median(names_ms), "names_ms_max": max(names_ms),
                     "nvml_pair_ms_median": statistics.median(nvml_ms), "kernels": names})
    result = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(device) if device.type == "cuda"
              else device.type, "torch": torch.__version__, "first_profiled_call_ms": first_ms,
              "nvml": monitor.handle is not None, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_names_cost.json").write_text(json.dumps(result, indent=2))
    print(f"{result['device']}, torch {result['torch']}, {result['date']}; first profiled call "
          f"{first_ms:.1f} ms (profiler start-up); NVML {'present' if result['nvml'] else 'absent'}")
    print(f"{'case':<20} {'names ms (median)':>18} {'names ms (max)':>15} {'NVML pair ms':>13}  kernels")
    for r in rows:
        print(f"{r['case']:<20} {r['names_ms_median']:>18.2f} {r['names_ms_max']:>15.2f} "
              f"{r['nvml_pair_ms_median']:>13.3f}  {', '.join(r['kernels'] or [])[:80]}")


if __name__ == "__main__":
    main()
