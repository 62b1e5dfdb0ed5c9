"""What a fresh process pays before its first Triton launch: torch's import, the catalogue, CUDA's
start, and the first and later calls of our Triton rmsnorm and add_rmsnorm.

    python3 benchmarks/probes/first_call_cost.py            # run it twice: the second finds Triton's cache filled
    python3 benchmarks/probes/first_call_cost.py --prof     # and where the first call's time goes (cProfile)

The first launch of any Triton kernel in a process computes Triton's own key (a hash over its
sources and libraries) and imports the rest of Triton: paid once a process, cache or not.
"""

import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402  (its import is what is timed)

t1 = time.perf_counter()
from pytest_opperf.catalog import load_builtin  # noqa: E402
from pytest_opperf.catalog.registry import BACKENDS  # noqa: E402

load_builtin()
t2 = time.perf_counter()
x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t3 = time.perf_counter()
prof = None
if "--prof" in sys.argv:
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
BACKENDS[("rmsnorm", "triton")].fn(x, w)
torch.cuda.synchronize()
t4 = time.perf_counter()
if prof:
    prof.disable()
BACKENDS[("add_rmsnorm", "triton")].fn(x, x.clone(), w)
torch.cuda.synchronize()
t5 = time.perf_counter()
BACKENDS[("rmsnorm", "triton")].fn(x, w)
torch.cuda.synchronize()
t6 = time.perf_counter()
print(f"import torch {t1 - t0:.2f}s, catalogue {t2 - t1:.2f}s, cuda init+inputs {t3 - t2:.2f}s, triton rmsnorm "
      f"first call {(t4 - t3) * 1e3:.0f} ms, add_rmsnorm first {(t5 - t4) * 1e3:.0f} ms, rmsnorm second "
      f"{(t6 - t5) * 1e3:.2f} ms", flush=True)
if prof:
    import pstats

    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
