"""What a collective case costs, and what its row reads, by the shortest sample the loop takes.

    python3 benchmarks/probes/collective_case_cost.py [--ranks 2] [--min-sample-ms 2,5] [--batch 2]
        [--style measure|commands] [--out DIR]

On `--ranks` GPUs of this host, one group of rank processes as the sweep starts them
(run/collective.py's RankGroup) runs each case as the sweep does (the `case` command, then
`measure`: warm-up, samples until README's stopping rule, the timed-call check), for each
backend (torch_dist, nccl), op, message size and convention, once per --min-sample-ms (the
shortest a sample of many calls is, measure/collective.py's MIN_SAMPLE_S). Prints per case the
wall time of its two commands, the samples taken, the median, the CV inside the fences (the
row's `cv`) and whether the 1% target was met; DIR/collective_case_cost.json holds every row.
What chose MIN_SAMPLE_S for issue 52 (docs/collectives.md, "A case at the cost of its statistics").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

OPS = ("all_reduce", "all_to_all")
SIZES = (1024, 16384, 262144, 1 << 20, 4 << 20, 16 << 20, 256 << 20)


def by_commands(group, convention: str, min_sample_s: float, budget_s: float) -> dict:
    """The case as the controller ran it before 9e58dd6: warm-up commands doubling from one call
    for 10 ms, then `sample` commands of a few samples each until the stopping rule, a seconds-a-call
    estimate from the warm-up's wall time (round trips in it), then verify and end_case."""
    from pytest_opperf.measure.collective import sample_shape
    from pytest_opperf.measure.stats import Stats, StoppingRule

    began = time.perf_counter()
    calls, chunk = 0, 1
    while calls < 3 or time.perf_counter() - began < 0.01:
        group.ask("warmup", calls=chunk)
        calls += chunk
        chunk = min(2 * chunk, 1000)
    per_call = (time.perf_counter() - began) / calls
    iters, replays = sample_shape(convention, per_call, min_sample_s)
    batch = max(1, min(200, int(0.01 / max(per_call * iters * replays, 1e-7))))
    rule = StoppingRule(0.01, 10, 10_000, budget_s)
    warmed = time.perf_counter()
    samples, stats = [], None
    while not rule.done(stats, time.perf_counter() - warmed):
        per_rank = group.ask("sample", count=batch, timer="event", convention=convention, iters=iters,
                             replays=replays)
        samples.extend(sum(t) / len(t) for t in zip(*per_rank))
        stats = Stats(samples)
    sampled = time.perf_counter()
    group.ask("verify")
    group.ask("end_case")
    return {"samples": samples, "iters": iters, "replays": replays,
            "phase_s": {"warmup": warmed - began, "sampling": sampled - warmed,
                        "verify": time.perf_counter() - sampled}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--min-sample-ms", default="2,5")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--conventions", default="loop", help="comma-separated: loop, graph")
    parser.add_argument("--budget", type=float, default=1.0, help="the stopping rule's seconds (README's: 1)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of torch_dist (gloo), two sizes")
    parser.add_argument("--batch", type=int, default=2, help="samples between two exchanges of the ranks (SAMPLE_BATCH)")
    parser.add_argument("--style", default="measure", choices=("measure", "commands"),
                        help="commands: the controller drives warm-up and samples a few at a time (before 9e58dd6)")
    args = parser.parse_args()

    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import DTypes
    from pytest_opperf.dtypes import lookup
    from pytest_opperf.measure.stats import Stats
    from pytest_opperf.run.collective import RankGroup
    from collective_samples import case_args  # beside this script

    load_builtin()
    bf16 = lookup("bf16")
    dtypes = DTypes(bf16, bf16)
    cpu = args.device == "cpu"
    group = RankGroup(args.ranks, args.device, 300.0)
    rows = []
    try:
        for min_ms in (float(v) for v in args.min_sample_ms.split(",")):
            for convention in args.conventions.split(","):
                for backend in ("torch_dist",) if cpu else ("nccl", "torch_dist"):
                    for op in args.ops.split(","):
                        for size in SIZES[:2] if cpu else SIZES:
                            parts, params = case_args(op, backend, args.ranks, size)
                            start = time.perf_counter()
                            checked = group.ask("case", parts=parts, params=params, dtypes=dtypes,
                                                seeds=list(range(args.ranks)), tolerance=0.02)
                            problems = [c.get("problem") or c.get("skip") for c in checked
                                        if c.get("problem") or c.get("skip")]
                            if problems:
                                print(f"{backend} {op} {size}: {problems}", flush=True)
                                group.ask("end_case")
                                continue
                            if args.style == "commands":
                                measured = by_commands(group, convention, min_ms / 1e3, args.budget)
                            else:
                                measured = group.ask("measure", timer="cpu" if cpu else "event", convention=convention,
                                                     warmup_s=0.01, rule=(0.01, 10, 10_000, args.budget),
                                                     min_sample_s=min_ms / 1e3, batch=args.batch)[0]
                            wall = time.perf_counter() - start
                            stats = Stats(measured["samples"])
                            inside, outliers = stats.fenced()
                            row = {"min_sample_ms": min_ms, "convention": convention, "backend": backend, "op": op,
                                   "bytes": size, "wall_ms": wall * 1e3, "samples": stats.n,
                                   "calls_per_sample": measured["iters"] * measured["replays"],
                                   "median_us": stats.median, "cv": inside.cv, "outliers": outliers,
                                   "ci_rel": stats.median_ci_rel, "met": stats.median_ci_rel <= 0.01,
                                   "phase_ms": {k: v * 1e3 for k, v in measured["phase_s"].items()},
                                   "style": args.style, "batch": args.batch, "sample_us": measured["samples"]}
                            rows.append(row)
                            print(f"{min_ms:3g} ms {convention:5s} {backend:10s} {op:11s} {size:>10d}: "
                                  f"{row['wall_ms']:7.1f} ms  n {stats.n:4d} x {row['calls_per_sample']:4d}  "
                                  f"{stats.median:9.2f} us  cv {inside.cv:.3f}  ci {stats.median_ci_rel:.4f}",
                                  flush=True)
    finally:
        group.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "collective_case_cost.json").write_text(json.dumps(rows, indent=1))
    for min_ms in sorted({r["min_sample_ms"] for r in rows}):
        mine = [r for r in rows if r["min_sample_ms"] == min_ms]
        print(f"{min_ms:g} ms: {len(mine)} cases, {sum(r['wall_ms'] for r in mine) / 1e3:.2f} s, "
              f"met {sum(r['met'] for r in mine)}, cv > 0.05: {sum(r['cv'] > 0.05 for r in mine)}")


if __name__ == "__main__":
    main()
