"""The profiler timer's raw reader, us a record, on any machine.

    python3 benchmarks/probes/reader_cost.py [--calls 200] [--repeats 30]

Profiles --calls calls of a small host-side add, each in the timer's call range (host activity
only, so it runs without a GPU), and times `profiler_records.recorded_events` over the session's
raw records: the best of --repeats, in us a record. On a GPU each call also adds a launch, a kernel
and a device-side range (see profiler_sample_cost.py for the whole batch).
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pytest_opperf.measure import profiler_records

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--calls", type=int, default=200)
parser.add_argument("--repeats", type=int, default=30)
args = parser.parse_args()
a = torch.randn(1000)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(args.calls):
        with record_function(profiler_records.CALL_RANGE):
            torch.add(a, a)
records = len(prof.profiler.kineto_results.events())
best = float("inf")
for _ in range(args.repeats):
    start = time.perf_counter()
    profiler_records.recorded_events(prof, "cuda")  # "cuda": the raw reader, which reads host records alike
    best = min(best, time.perf_counter() - start)
print(f"{records} records, {best * 1e6 / records:.2f} us a record (best of {args.repeats})")
