"""Timer fidelity, harness cost and repeatability on one GPU, in one run.

1. Fidelity: kernels from ~2 us to ~10 ms (elementwise add, bf16/fp32 GEMM, softmax), cold and
   hot; each timer against profiler (CUPTI) kernel time measured in the same process, with
   triton.testing.do_bench (cold: it flushes) side by side.
2. Harness cost: a sweep of >= 100 cases with kernels >= 20 us: wall time per case of the
   default timer at the 1% target vs do_bench's default budget (warmup 25 ms, rep 100 ms).
3. Repeatability: the sweep twice; per case the relative difference of the medians.

    python benchmarks/probes/timer_fidelity.py --out results_dir   # writes fidelity.json and a markdown table
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path

import torch

from pytest_opperf import dtypes
from pytest_opperf.catalog.ops.activation import softmax
from pytest_opperf.catalog.ops.matmul import gemm
from pytest_opperf.catalog.ops.memory import add
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.measure import inputs, sampler, timers
from pytest_opperf.measure.stats import StoppingRule

DEV = torch.device("cuda", 0)


def _dt(name):
    return DTypes(dtypes.lookup(name), dtypes.lookup(name))


def workloads():
    """(label, Workload) from ~2 us to ~10 ms."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    out = []
    for n in (2**12, 2**16, 2**20, 2**22, 2**24, 2**26, 2**28):
        args = add.inputs({"n": n}, _dt("fp32"), DEV, gen)
        out.append((f"add fp32 n=2^{n.bit_length() - 1}", inputs.Workload(add.add_torch, args)))
    for s in (256, 512, 1024, 2048, 4096, 8192, 16384):
        args = gemm.inputs({"m": s, "n": s, "k": s}, _dt("bf16"), DEV, gen)
        out.append((f"gemm bf16 {s}^3", inputs.Workload(gemm.gemm_torch, args)))
    args = gemm.inputs({"m": 4096, "n": 4096, "k": 4096}, _dt("fp32"), DEV, gen)
    out.append(("gemm fp32 4096^3", inputs.Workload(gemm.gemm_torch, args)))
    for m, n in ((4096, 1024), (8192, 8192)):
        args = softmax.inputs({"m": m, "n": n}, _dt("bf16"), DEV, gen)
        out.append((f"softmax bf16 {m}x{n}", inputs.Workload(softmax.softmax_torch, args)))
    return out


def median_of(work, timer_name, cache, l2, rule):
    m = sampler.measure(work, DEV, timer_name, cache, rule, cache_bytes=l2)
    return m


def do_bench_us(work):
    import triton.testing

    t0 = time.perf_counter()
    ms = triton.testing.do_bench(work, return_mode="median")
    return ms * 1e3, time.perf_counter() - t0


def fidelity(l2):
    rule = StoppingRule(target_rel=0.005, min_samples=30, max_samples=5000, budget_s=1.5)
    rows = []
    for label, work in workloads():
        for cache in ("cold", "hot"):
            ref = median_of(work, "profiler", cache, l2, rule)
            row = {"kernel": label, "cache": cache, "profiler_us": ref.stats.median, "kernels": ref.kernels}
            for name in ("cuda_graph", "event", "cpu"):
                m = median_of(work, name, cache, l2, rule)
                row[f"{name}_us"] = m.stats.median
                row[f"{name}_err"] = m.stats.median / ref.stats.median - 1
            if cache == "cold":
                us, _ = do_bench_us(work)
                row["do_bench_us"], row["do_bench_err"] = us, us / ref.stats.median - 1
            rows.append(row)
            print(f"{label:<24} {cache:<4} profiler {ref.stats.median:9.2f} us | graph {row['cuda_graph_err']:+7.1%} "
                  f"| event {row['event_err']:+7.1%} | cpu {row['cpu_err']:+7.1%}"
                  + (f" | do_bench {row['do_bench_err']:+7.1%}" if cache == "cold" else ""), flush=True)
        del work
        torch.cuda.empty_cache()
    return rows


def sweep_cases():
    """>= 100 cases with kernels of 20 us and more: bf16 GEMMs and fp32 adds."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    for s in range(1536, 8192 + 1, 128):
        args = gemm.inputs({"m": s, "n": s, "k": s}, _dt("bf16"), DEV, gen)
        yield f"gemm bf16 {s}^3", inputs.Workload(gemm.gemm_torch, args)
    for k in range(6, 206, 4):
        args = add.inputs({"n": k << 20}, _dt("fp32"), DEV, gen)
        yield f"add fp32 n={k}Mi", inputs.Workload(add.add_torch, args)


def sweep(l2, with_do_bench, timer_name=None):
    rule = StoppingRule(target_rel=0.01, min_samples=10, max_samples=10_000, budget_s=1.0)
    out = []
    for label, work in sweep_cases():
        m = sampler.measure(work, DEV, timer_name or timers.default_timer("cuda"), "cold", rule, cache_bytes=l2)
        row = {"case": label, "time_us": m.stats.median, "wall_s": m.wall_s, "met": m.met, "samples": m.stats.n,
               "cv": m.stats.cv}
        if with_do_bench:
            row["do_bench_us"], row["do_bench_wall_s"] = do_bench_us(work)
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--profiler-sweep", action="store_true", help="also time the sweep with the profiler timer")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    report = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(DEV),
              "torch": torch.__version__, "l2_bytes": l2}
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        pass
    report["sweep_timer"] = timers.default_timer("cuda")
    with torch.inference_mode():
        if not args.skip_fidelity:
            report["fidelity"] = fidelity(l2)
        first = sweep(l2, with_do_bench=True)
        second = sweep(l2, with_do_bench=False)
        if args.profiler_sweep:
            prof = sweep(l2, with_do_bench=False, timer_name="profiler")
            report["sweep_profiler_median_wall_ms"] = 1e3 * statistics.median(r["wall_s"] for r in prof)
            report["sweep_profiler_vs_default"] = statistics.median(p["time_us"] / a["time_us"] for p, a in zip(prof, first))
            print(f"profiler timer sweep: median wall {report['sweep_profiler_median_wall_ms']:.1f} ms/case, "
                  f"median time ratio profiler/default {report['sweep_profiler_vs_default']:.4f}")
    walls = [r["wall_s"] for r in first]
    db_walls = [r["do_bench_wall_s"] for r in first]
    diffs = [abs(b["time_us"] / a["time_us"] - 1) for a, b in zip(first, second)]
    report["sweep"] = {"cases": len(first), "first": first, "second": second,
                       "median_wall_ms": 1e3 * statistics.median(walls),
                       "do_bench_median_wall_ms": 1e3 * statistics.median(db_walls),
                       "met": sum(r["met"] for r in first),
                       "repeat_median_diff": statistics.median(diffs),
                       "repeat_within_1pct": sum(d <= 0.01 for d in diffs),
                       "repeat_max_diff": max(diffs)}
    s = report["sweep"]
    print(f"sweep: {s['cases']} cases, median wall {s['median_wall_ms']:.1f} ms/case (do_bench "
          f"{s['do_bench_median_wall_ms']:.1f} ms), target met {s['met']}/{s['cases']}; repeat: median diff "
          f"{s['repeat_median_diff']:.2%}, within 1%: {s['repeat_within_1pct']}/{s['cases']}, max {s['repeat_max_diff']:.2%}")
    (args.out / "fidelity.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
