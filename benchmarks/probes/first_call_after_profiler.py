"""Does a profiler session (CUPTI set up) make later first calls slower?

    python3 benchmarks/probes/first_call_after_profiler.py none   # once, to fill the compile caches
    python3 benchmarks/probes/first_call_after_profiler.py none   # warm caches, no profiler session before
    python3 benchmarks/probes/first_call_after_profiler.py prof   # warm caches, one profiler session before
    TEARDOWN_CUPTI=0 python3 benchmarks/probes/first_call_after_profiler.py prof
    python3 benchmarks/probes/first_call_after_profiler.py compile  # a torch.compile'd call before

Times, in ms, the first call of our Triton rmsnorm at three row lengths (each a new
specialisation), of add_rmsnorm, a second call, and a torch.compile'd function at three sizes
(each a recompile): the first calls a case of the sweep pays in its check.
"""

import os
import sys
import time

import torch

from pytest_opperf.catalog import load_builtin
from pytest_opperf.catalog.registry import BACKENDS
from pytest_opperf.measure import profiler_records

load_builtin()
mode = sys.argv[1] if len(sys.argv) > 1 else "none"
dev = "cuda"
a = torch.randn(1 << 20, device=dev)
import triton  # noqa: E402,F401  (its import out of the timed calls)

torch.cuda.synchronize()
t = time.perf_counter()
if mode == "prof":
    with profiler_records.profiling("cuda") as prof:
        for _ in range(20):
            torch.add(a, a)
        torch.cuda.synchronize()
    profiler_records.recorded_events(prof, "cuda")
if mode == "compile":
    # Inductor points TRITON_CACHE_DIR at its own directory when it builds its first kernel: do
    # later Triton kernels (ours, liger's) miss their cache there?
    torch.compile(lambda y: y * 3 + 1, dynamic=False)(a)
    torch.cuda.synchronize()
prof_s = time.perf_counter() - t


def timed(f):
    t = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


res = {}
w = {n: torch.randn(n, device=dev, dtype=torch.bfloat16) for n in (1024, 4096, 8192)}
for n in (1024, 4096, 8192):
    x = torch.randn(8, n, device=dev, dtype=torch.bfloat16)
    res[f"triton rmsnorm n={n}"] = timed(lambda: BACKENDS[("rmsnorm", "triton")].fn(x, w[n]))
x = torch.randn(8, 4096, device=dev, dtype=torch.bfloat16)
res["triton add_rmsnorm"] = timed(lambda: BACKENDS[("add_rmsnorm", "triton")].fn(x, x.clone(), w[4096]))
res["triton rmsnorm again"] = timed(lambda: BACKENDS[("rmsnorm", "triton")].fn(x, w[4096]))
f = torch.compile(lambda y: torch.nn.functional.silu(y) * 2 + 1, dynamic=False)
for n in (1000, 3000, 5000):
    y = torch.randn(n, device=dev)
    res[f"compiled n={n}"] = timed(lambda: f(y))
print(mode, f"before {prof_s * 1e3:.0f} ms; TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR')};", "; ".join(f"{k} {v:.0f}" for k, v in res.items()), flush=True)
