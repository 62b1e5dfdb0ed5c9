"""Does the recorded MFU agree with the MFU from profiler kernel time? (issue 2 acceptance)

Runs one GEMM case in one process with the CUDA-graph timer (the CUDA default until
2026-11-23; the default is now the profiler timer itself) and with the profiler timer
(CUPTI kernel time), alternating A B A B so clock drift hits both, and prints the MFU of
each and their ratio.

    python benchmarks/mfu_vs_profiler.py --m 8192 --n 8192 --k 8192 --dtype bf16 --device h100
"""

from __future__ import annotations

import argparse
import datetime as dt
import json

import torch

from pytest_opperf.catalog import dtypes
from pytest_opperf.catalog.ops.matmul import gemm
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.hardware.specs import metrics
from pytest_opperf.hardware.specs import specs as hardware
from pytest_opperf.measure import inputs, sampler
from pytest_opperf.measure.stats import StoppingRule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default=None, help="spec name; default: detected")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    specs = hardware.load_specs()
    acc = hardware.detect_accelerator()
    spec = specs[args.device] if args.device else hardware.resolve_alias(specs, acc.reported_name)
    dev = torch.device("cuda", 0)
    dt_ = DTypes(dtypes.lookup(args.dtype), dtypes.lookup(args.dtype))
    p = {"m": args.m, "n": args.n, "k": args.k}
    gen = torch.Generator(device=dev).manual_seed(0)
    a, b = gemm.inputs(p, dt_, dev, gen)
    fn = inputs.Workload(gemm.gemm_torch, (a, b))
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rule = StoppingRule(target_rel=0.01, min_samples=20, max_samples=2000, budget_s=2.0)
    flops = gemm.flops(p, dt_)
    out = {"date": dt.date.today().isoformat(), "device": acc.reported_name, "spec": spec.name,
           "torch": torch.__version__, "case": {**p, "dtype": args.dtype}, "rounds": []}
    with torch.inference_mode():
        for r in range(args.rounds):
            row = {}
            for name in ("cuda_graph", "profiler"):
                m = sampler.measure(fn, dev, name, "cold", rule, cache_bytes=l2)
                mfu = metrics.derive(flops, gemm.nbytes(p, dt_), m.stats.median, spec, args.dtype, "matrix")["mfu"]
                row[name] = {"time_us": m.stats.median, "cv": m.stats.cv, "samples": m.stats.n, "mfu": mfu,
                             "kernels": m.kernels}
            row["mfu_ratio"] = row["cuda_graph"]["mfu"] / row["profiler"]["mfu"]
            out["rounds"].append(row)
            ev, pr = row["cuda_graph"], row["profiler"]
            print(f"round {r}: cuda_graph {ev['time_us']:.1f} us MFU {ev['mfu']:.3f} | "
                  f"profiler {pr['time_us']:.1f} us MFU {pr['mfu']:.3f} | ratio {row['mfu_ratio']:.4f} | {pr['kernels']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
