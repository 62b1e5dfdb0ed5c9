"""Does a profiler session slow the CUDA-graph and event timers that run after it, in one process?

For a few small kernels: the graph and event timers' medians in a fresh process, then after one
profiler-timer measurement, then after ten more. Prints a table; writes DIR/graph_after_profiler.json.

    python3 benchmarks/graph_after_profiler.py --out DIR
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from pytest_opperf.catalog import dtypes
from pytest_opperf.catalog.ops.matmul import gemm
from pytest_opperf.catalog.ops.memory import add
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.measure import inputs, sampler
from pytest_opperf.measure.stats import StoppingRule

DEV = torch.device("cuda", 0)


def cases():
    gen = torch.Generator(device=DEV).manual_seed(0)
    bf16 = DTypes(dtypes.lookup("bf16"), dtypes.lookup("bf16"))
    fp32 = DTypes(dtypes.lookup("fp32"), dtypes.lookup("fp32"))
    yield "gemm bf16 256^3", inputs.Workload(gemm.gemm_torch, gemm.inputs({"m": 256, "n": 256, "k": 256}, bf16, DEV, gen))
    yield "gemm bf16 1024^3", inputs.Workload(gemm.gemm_torch, gemm.inputs({"m": 1024, "n": 1024, "k": 1024}, bf16, DEV, gen))
    yield "add fp32 2^20", inputs.Workload(add.add_torch, add.inputs({"n": 1 << 20}, fp32, DEV, gen))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    rule = StoppingRule(target_rel=0.005, min_samples=30, max_samples=3000, budget_s=1.0)
    works = list(cases())
    table = {}

    def phase(label):
        for name, work in works:
            for cache in ("cold", "hot"):
                for timer_name in ("cuda_graph", "event"):
                    m = sampler.measure(work, DEV, timer_name, cache, rule, cache_bytes=l2)
                    table.setdefault(f"{name} {cache} {timer_name}", {})[label] = m.stats.median

    with torch.inference_mode():
        phase("fresh")
        ref = {}
        for name, work in works:
            for cache in ("cold", "hot"):
                ref[f"{name} {cache}"] = sampler.measure(work, DEV, "profiler", cache, rule, cache_bytes=l2).stats.median
        phase("after profiler")
        for _ in range(10):
            sampler.measure(works[0][1], DEV, "profiler", "hot", rule, cache_bytes=l2)
        phase("after 11 profiler runs")
    out = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(DEV), "torch": torch.__version__,
           "profiler_us": ref, "timers_us": table}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "graph_after_profiler.json").write_text(json.dumps(out, indent=1))
    print(f"{'case':<34} {'profiler':>9} {'fresh':>9} {'after 1':>9} {'after 11':>9}")
    for key, row in table.items():
        name, cache = key.rsplit(" ", 2)[0], key.rsplit(" ", 2)[1]
        print(f"{key:<34} {ref[f'{name} {cache}']:>9.2f} " + " ".join(f"{v:>9.2f}" for v in row.values()))


if __name__ == "__main__":
    main()
