"""What one profiler session costs the profiler timer, apart from the calls it times.

For sessions of 1, 20 and 200 samples of a 1M-element bf16 add (hot, and cold with the timer's
flush), each taken 10 times through the profiler timer's own session and reader
(profiler_records.profiling, recorded_events, kernel_times): median ms of the start, the calls,
the stop and the reading. Then the host time of a plain call outside any session (a launch, no
profiler), which a CUPTI left subscribed between sessions could slow. Run it once as is and once
with TEARDOWN_CUPTI=0 in the environment (kineto keeps CUPTI subscribed after a session's stop
then, where by default it tears it down and subscribes again at the next start):

    python3 benchmarks/probes/profiler_session_cost.py
    TEARDOWN_CUPTI=0 python3 benchmarks/probes/profiler_session_cost.py
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch.profiler import record_function

from pytest_opperf.measure import profiler_records as records
from pytest_opperf.measure.inputs import Flusher

REPEATS = 10


def session(fn, flush, n: int, toggle: bool = False) -> dict:
    from torch.profiler import ProfilerActivity

    both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    t0 = time.perf_counter()
    with records.profiling("cuda") as prof:
        t1 = time.perf_counter()
        for _ in range(n):
            if flush is not None:
                if toggle:
                    prof.toggle_collection_dynamic(False, both)
                flush()
                if toggle:
                    prof.toggle_collection_dynamic(True, both)
            with record_function(records.CALL_RANGE):
                fn()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    raw = prof.profiler.kineto_results.events()
    t_list = time.perf_counter()
    kinds = [e.device_type() for e in raw]
    t_kind = time.perf_counter()
    events = records.recorded_events(prof, "cuda")
    totals, _ = records.kernel_times(events, n)
    t4 = time.perf_counter()
    return {"start": t1 - t0, "calls": t2 - t1, "stop": t3 - t2, "read": t4 - t_kind, "median_us": statistics.median(totals),
            "list": t_list - t3, "kind": t_kind - t_list, "records": len(kinds),
            "cpu": sum(1 for k in kinds if str(k).endswith("CPU"))}


def plain_call_us(fn, calls: int = 2000) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    dev = torch.device("cuda", 0)
    x = torch.randn(2**20, device=dev, dtype=torch.bfloat16)
    y = torch.randn(2**20, device=dev, dtype=torch.bfloat16)
    fn = lambda: torch.add(x, y)  # noqa: E731
    flush = Flusher(dev, None)
    print(f"TEARDOWN_CUPTI={os.environ.get('TEARDOWN_CUPTI', '(unset)')}; plain call before any session "
          f"{plain_call_us(fn):.2f} us", flush=True)
    session(fn, None, 5)  # the process's first session: CUPTI's start
    for cache, fl, toggle in (("hot", None, False), ("cold", flush, False), ("cold, flush untraced", flush, True)):
        for n in (1, 20, 200):
            runs = [session(fn, fl, n, toggle) for _ in range(REPEATS)]
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{cache} n={n:3d}: start {m['start'] * 1e3:6.2f} ms, calls {m['calls'] * 1e3:6.2f} ms "
                  f"({m['calls'] / n * 1e6:6.1f} us a call), stop {m['stop'] * 1e3:6.2f} ms, read {m['read'] * 1e3:6.2f} ms"
                  f" ({m['read'] / n * 1e6:6.1f} us a call); kernel median {m['median_us']:.2f} us; records "
                  f"{m['records'] / n:.1f} a call ({m['cpu'] / n:.1f} host), their list {m['list'] * 1e3:.2f} ms, "
                  f"one device_type() each {m['kind'] * 1e3:.2f} ms", flush=True)
    print(f"plain call after the sessions {plain_call_us(fn):.2f} us", flush=True)


if __name__ == "__main__":
    main()
