"""The cuda_graph timer on a large cold GEMM: what it reads beside the profiler and event timers.

bf16 4096^3, cold: the GEMM timed alternately with the profiler, cuda_graph and event timers
(ROUNDS rounds), NVML's SM clock and power beside each. The cold graph timer reads the kernels a
call ran from its flush's end to its last kernel's end, so its median sits within a few percent of
the profiler's (docs/benchmarks.md, "Timer fidelity").

    python3 benchmarks/probes/graph_cold_gemm.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import torch


class Sampler(threading.Thread):
    """NVML power (W) and SM clock (MHz) every ~2 ms while running."""

    def __init__(self):
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self.samples: list = []
        self.stop = threading.Event()

    def run(self):
        nv, h = self.nvml, self.handle
        while not self.stop.is_set():
            self.samples.append((time.perf_counter(), nv.nvmlDeviceGetPowerUsage(h) / 1000,
                                 nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
            time.sleep(0.002)

    def between(self, t0, t1) -> dict:
        got = [s for s in self.samples if t0 <= s[0] <= t1]
        if not got:
            return {}
        return {"power_w": round(statistics.mean(s[1] for s in got), 1),
                "sm_mhz": round(statistics.mean(s[2] for s in got)), "min_sm_mhz": min(s[2] for s in got)}


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
