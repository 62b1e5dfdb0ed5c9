"""How the samples of a collective spread, by backend, convention and calls per sample.

    python3 benchmarks/probes/collective_samples.py [--ranks 2] [--samples 100] [--out DIR]

On `--ranks` GPUs of this host, a group of rank processes as the sweep starts them
(run/collective.py's RankGroup); for each backend (torch_dist, nccl), op, message size and
convention (loop, graph) the same case is sampled with several calls per sample. Prints per row
the median time of a call, the CV (std / mean, the row's `cv`), a robust spread (the
interquartile range over 1.349 and the median: what the CV would be without the tail), the
slowest sample over the median, and the share of samples more than 10% above the median.
What chose the calls per sample of the sweep's `loop` and `graph` conventions
(docs/collectives.md, "Stable rows"); the JSON goes to DIR/collective_samples.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

OPS = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter")
SIZES = (1024, 65536, 1 << 20, 16 << 20)
CALLS = (20, 100, 400)
SAMPLE_CAP_S = 0.02  # fewer calls where a sample would take longer


def spread(samples: list[float]) -> dict:
    s = sorted(samples)
    med = statistics.median(s)
    q1, _, q3 = statistics.quantiles(s, n=4)
    return {"median_us": med, "cv": statistics.stdev(s) / statistics.fmean(s), "robust_cv": (q3 - q1) / 1.349 / med,
            "max_over_median": s[-1] / med, "above_10pct": sum(x > 1.1 * med for x in s) / len(s), "n": len(s)}


def case_args(op: str, backend: str, ranks: int, size: int) -> tuple[dict, dict]:
    """(parts, params) of the rank's `case` command for this op, backend and message size, as the
    sweep's collective fixture sends them (the op's inputs, reference, output and prepare by name)."""
    from pytest_opperf.catalog.ops.collective import COLLECTIVES
    from pytest_opperf.catalog.registry import BACKENDS, OPS

    params = {"num_devices": ranks, "message_bytes": size}
    if op in ("all_reduce", "reduce_scatter"):
        params["reduce_op"] = "sum"
    parts = {"fn": BACKENDS[(op, backend)].fn, "inputs": OPS[op].inputs, "reference": OPS[op].reference,
             "output": COLLECTIVES[op].output, "prepare": COLLECTIVES[op].prepare}
    return parts, params


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of torch_dist (gloo), loop only")
    args = parser.parse_args()

    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import DTypes
    from pytest_opperf.dtypes import lookup
    from pytest_opperf.run.collective import RankGroup

    load_builtin()
    bf16 = lookup("bf16")
    dtypes = DTypes(bf16, bf16)
    group = RankGroup(args.ranks, args.device, 300.0)
    cpu = args.device == "cpu"
    rows = []
    try:
        for backend in ("torch_dist",) if cpu else ("torch_dist", "nccl"):
            for op in args.ops.split(","):
                for size in SIZES[:2] if cpu else SIZES:
                    parts, params = case_args(op, backend, args.ranks, size)
                    checked = group.ask("case", parts=parts, params=params, dtypes=dtypes,
                                        seeds=list(range(args.ranks)), tolerance=0.02)
                    problems = [c.get("problem") or c.get("skip") for c in checked if c.get("problem") or c.get("skip")]
                    if problems:
                        print(f"{backend} {op} {size}: {problems}")
                        group.ask("end_case")
                        continue
                    start = time.perf_counter()
                    group.ask("warmup", calls=50)
                    per_call = (time.perf_counter() - start) / 50
                    for convention in ("loop",) if cpu else ("loop", "graph"):
                        for calls in CALLS:
                            calls = max(1, min(calls, int(SAMPLE_CAP_S / per_call)))
                            group.ask("sample", count=5, timer="cpu" if cpu else "event", convention=convention, iters=calls)
                            per_rank = group.ask("sample", count=args.samples, timer="cpu" if cpu else "event", convention=convention,
                                                 iters=calls)
                            row = {"backend": backend, "op": op, "bytes": size, "convention": convention,
                                   "calls": calls, **spread([statistics.fmean(t) for t in zip(*per_rank)])}
                            rows.append(row)
                            print(f"{backend:10s} {op:14s} {size:>9d} {convention:5s} calls {calls:4d}: "
                                  f"{row['median_us']:9.2f} us  cv {row['cv']:.3f}  robust {row['robust_cv']:.3f}  "
                                  f"max/med {row['max_over_median']:.2f}  >10% {row['above_10pct']:.2f}", flush=True)
                    group.ask("end_case")
    finally:
        group.close()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "collective_samples.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
