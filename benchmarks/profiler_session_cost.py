"""What one torch.profiler session costs the profiler timer, and what CUPTI's teardown changes.

The profiler timer takes its samples in batches, one profiler session each (it must stop the
session to read the kernels and decide whether to go on). Kineto tears CUPTI down at the end of
each session where TEARDOWN_CUPTI says so (the default from CUDA 12.6 in recent Kineto), and the
next session sets it up again. Each mode runs in a fresh process (the variable is read once):

- per session: entering, the 20 profiled calls, leaving, and reading the kernels (torch's
  parser, prof.events(), against the timer's reader of the raw records), median of --sessions;
- the host cost of a launch (a 2^20-element add, no synchronisation in the loop) before the
  first session and after the last: what a session leaves behind for every later launch;
- the timer itself: `measure()` with the profiler timer on the same add, cold, wall per case.

    python3 benchmarks/profiler_session_cost.py [--sessions 30]

Prints a markdown table (device, date). CUDA only. About a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {"default (TEARDOWN_CUPTI unset)": None, "TEARDOWN_CUPTI=1": "1", "TEARDOWN_CUPTI=0": "0"}


def child(sessions: int) -> dict:
    import torch
    from torch.profiler import record_function

    from pytest_opperf.measure import inputs, profiler_records, sampler
    from pytest_opperf.measure.stats import StoppingRule

    a = torch.randn(1 << 20, device="cuda")
    b = torch.randn(1 << 20, device="cuda")

    def launch_us(n=2000) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            torch.add(a, b)
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / n * 1e6

    for _ in range(3):
        launch_us(200)
    before = launch_us()
    parts = {"enter": [], "calls": [], "exit": [], "events()": [], "raw reader": []}
    first_session_ms = None
    disagree = 0
    for i in range(sessions):
        t0 = time.perf_counter()
        with profiler_records.profiling("cuda") as prof:
            t1 = time.perf_counter()
            for _ in range(20):
                with record_function(profiler_records.CALL_RANGE):
                    torch.add(a, b)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        raw = profiler_records.kernel_times(profiler_records.recorded_events(prof, "cuda"), 20)
        t4 = time.perf_counter()
        parsed = profiler_records.kernel_times(prof.events(), 20)
        t5 = time.perf_counter()
        # Calls whose total differs between the two readers (seen on an H100: torch's parser gave
        # the first call of a session twice its one kernel's time).
        disagree += sum(abs(x - y) > 1e-6 for x, y in zip(raw[0], parsed[0]))
        if i == 0:
            first_session_ms = (t5 - t0) * 1e3
            continue
        for key, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t4 - t3)):
            parts[key].append(value * 1e3)
    after = launch_us()
    walls = []
    for _ in range(5):
        work = inputs.Workload(torch.add, (a, b))
        start = time.perf_counter()
        m = sampler.measure(work, torch.device("cuda"), "profiler", "cold", StoppingRule(),
                            cache_bytes=torch.cuda.get_device_properties(0).L2_cache_size)
        walls.append((time.perf_counter() - start) * 1e3)
    return {"session_ms": {k: statistics.median(v) for k, v in parts.items()}, "first_session_ms": first_session_ms,
            "launch_us_before": before, "launch_us_after": after, "measure_ms": statistics.median(walls),
            "measure_samples": m.stats.n, "add_us": m.stats.median, "calls_read_differently": disagree}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.sessions)))
        return 0
    import torch

    results = {}
    for label, value in MODES.items():
        env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
        if value is not None:
            env["TEARDOWN_CUPTI"] = value
        done = subprocess.run([sys.executable, __file__, "--child", f"--sessions={args.sessions}"], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{label}: exit {done.returncode}\n{done.stderr[-2000:]}")
            continue
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}; {args.sessions} sessions of 20 profiled calls (an fp32 add of 2^20), medians\n")
    print("| mode | enter ms | 20 calls ms | exit ms | events() ms | raw reader ms | first session ms | "
          "launch us before / after | measure() ms (samples) | calls the readers differ on |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, r in results.items():
        s = r["session_ms"]
        print(f"| {label} | {s['enter']:.2f} | {s['calls']:.2f} | {s['exit']:.2f} | {s['events()']:.2f} | "
              f"{s['raw reader']:.2f} | {r['first_session_ms']:.0f} | {r['launch_us_before']:.2f} / "
              f"{r['launch_us_after']:.2f} | {r['measure_ms']:.1f} ({r['measure_samples']}) | "
              f"{r['calls_read_differently']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
