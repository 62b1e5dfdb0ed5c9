"""The cuda_graph timer on a large cold GEMM: what its events read, what its kernels ran.

Issue 68: tests/test_timing.py's large-GEMM test (bf16 4096^3, cold) read the cuda_graph timer at
179.6 us between two profiler readings of 173.6 and 173.5 us (H200), once in three runs. A cold
graph holds, per call, the L2 flush and the GEMM between a pair of external events. This probe
times the GEMM alternately with the profiler, cuda_graph and event timers (ROUNDS rounds), NVML's SM
clock beside. At efd63ec it also profiled the graph timer's replays, setting its events beside the
GEMM kernels they bracketed (3% over them: docs/benchmarks.md); since 483ed7a the cold graph timer
reads those kernels itself (under its own profiler session, which cannot nest in another).

    python3 benchmarks/probes/graph_cold_gemm.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
from lm_head_power import Sampler  # noqa: E402


def main() -> int:
    from pytest_opperf.measure import inputs, sampler as sampling
    from pytest_opperf.measure.stats import StoppingRule

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    a, b = (torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    work = inputs.Workload(torch.matmul, (a, b))
    rule = StoppingRule(target_rel=0.005, min_samples=20, budget_s=2)
    nv = Sampler()
    nv.start()
    rounds = []
    for r in range(args.rounds):
        row = {}
        for name in ("profiler", "cuda_graph", "event"):
            t0 = time.perf_counter()
            m = sampling.measure(work, dev, name, "cold", rule, cache_bytes=l2)
            row[name] = {"median_us": round(m.stats.median, 2), "n": len(m.samples), **nv.between(t0, time.perf_counter())}
        rounds.append(row)
        print(json.dumps(row), flush=True)
    nv.stop.set()
    ratio = [rw["cuda_graph"]["median_us"] / rw["profiler"]["median_us"] for rw in rounds]
    print(f"cuda_graph / profiler: {', '.join(f'{x:.3f}' for x in ratio)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(0), "rounds": rounds}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
