"""Where the profiler timer's time per sample goes.

    python3 benchmarks/probes/profiler_sample_cost.py [--n 200] [--repeats 7]

The default sweep spent 30.5 s sampling with the profiler timer for 10.2 s of kernel time
(H100, 2026-11-23): a short kernel's sample cost 150-1,500 us of host time. This takes one
batch of the timer (`ProfilerTimer.sample(n)`) apart, stage by stage, on a few workloads of
the catalogue, cold (rotated input copies, as the sweep):

- enter:   starting the profiler session
- calls:   the n calls, each inside its `record_function` range (host time: launches)
- sync:    waiting for the device after the last call
- exit:    stopping the session (the device's activity buffers are flushed)
- reader:  `recorded_events` (the raw records into ranges and kernels)
- attrib:  `kernel_times` (a sample per range: its kernels' device time)

and, for comparison, the same n calls with no profiler, with the profiler but no ranges, and
with device activity alone (no host-side recording). Medians of --repeats batches, us a call.
CUDA only; about a minute.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pytest_opperf.catalog import load_builtin
from pytest_opperf.catalog.registry import BACKENDS
from pytest_opperf.measure import inputs, profiler_records, timers


def workloads(dev: str) -> dict:
    bf16 = torch.bfloat16
    x = torch.randn(1 << 20, device=dev, dtype=bf16)
    y = torch.randn(1 << 20, device=dev, dtype=bf16)
    rows = torch.randn(16, 4096, device=dev, dtype=bf16)
    w = torch.randn(4096, device=dev, dtype=bf16)
    return {
        "add torch (1 kernel)": (BACKENDS[("add", "torch")].fn, (x, y)),
        "rmsnorm torch_unfused (8 kernels)": (BACKENDS[("rmsnorm", "torch_unfused")].fn, (rows, w)),
        "rmsnorm triton (1 Triton kernel)": (BACKENDS[("rmsnorm", "triton")].fn, (rows, w)),
        "add torch_compile (1 kernel)": (BACKENDS[("add", "torch_compile")].fn, (x, y)),
    }


def stages(tmr: timers.Timer, n: int) -> dict:
    """One batch of ProfilerTimer.sample(n), timed stage by stage (its code, with clocks between)."""
    t = [time.perf_counter()]
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    t.append(time.perf_counter())
    for _ in range(n):
        tmr._prepare()
        with record_function(profiler_records.CALL_RANGE):
            tmr.call()
    t.append(time.perf_counter())
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    prof.__exit__(None, None, None)
    t.append(time.perf_counter())
    events = profiler_records.recorded_events(prof, "cuda")
    t.append(time.perf_counter())
    totals, _ = profiler_records.kernel_times(events, n)
    t.append(time.perf_counter())
    names = ("enter", "calls", "sync", "exit", "reader", "attrib")
    out = {name: (b - a) * 1e6 / n for name, a, b in zip(names, t, t[1:])}
    out["total"] = (t[-1] - t[0]) * 1e6 / n
    out["kernel"] = statistics.median(totals)
    return out


def variant(tmr: timers.Timer, n: int, activities, ranges: bool) -> float:
    """Host us a call, enter to exit, for the n calls under the given profiler set-up."""
    t0 = time.perf_counter()
    prof = profile(activities=activities) if activities else None
    if prof:
        prof.__enter__()
    for _ in range(n):
        tmr._prepare()
        if ranges:
            with record_function(profiler_records.CALL_RANGE):
                tmr.call()
        else:
            tmr.call()
    torch.cuda.synchronize()
    if prof:
        prof.__exit__(None, None, None)
    return (time.perf_counter() - t0) * 1e6 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    load_builtin()
    timers.start_profiler("cuda", "profiler")
    cache = torch.cuda.get_device_properties(0).L2_cache_size
    both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"n = {args.n}, cold (rotated copies), median of {args.repeats}, us a call\n")
    cols = ("enter", "calls", "sync", "exit", "reader", "attrib", "total", "kernel")
    print("| workload | " + " | ".join(cols) + " | no profiler | profiler, no ranges | device activity only |")
    print("| --- |" + " ---: |" * (len(cols) + 3))
    for label, (fn, fargs) in workloads("cuda").items():
        work = inputs.Workload(fn, fargs)
        for _ in range(3):
            work()
        torch.cuda.synchronize()
        tmr = timers.ProfilerTimer(work, torch.device("cuda"), "cold", cache)
        tmr.sample(20)  # the first batch also profiles the checked call: not timed here
        runs = [stages(tmr, args.n) for _ in range(args.repeats)]
        med = {c: statistics.median(r[c] for r in runs) for c in cols}
        plain = statistics.median(variant(tmr, args.n, None, False) for _ in range(args.repeats))
        noranges = statistics.median(variant(tmr, args.n, both, False) for _ in range(args.repeats))
        device_only = statistics.median(variant(tmr, args.n, [ProfilerActivity.CUDA], False)
                                        for _ in range(args.repeats))
        print(f"| {label} | " + " | ".join(f"{med[c]:.1f}" for c in cols)
              + f" | {plain:.1f} | {noranges:.1f} | {device_only:.1f} |", flush=True)


if __name__ == "__main__":
    main()
