"""Which limit a measured op hits, where its best backend is far under the roofline (issue 10).

For each op table of a results database: the largest shape (by roofline time), its fastest
backend, the roofline time there (the longer of FLOPs / peak and bytes / bandwidth, the device's
datasheet peaks), the fraction of it the measured time reaches, and the kernels one call ran.
Where that fraction is under 50%, the limit is named from what the row holds:

- launch-bound: under 5 us per kernel; the fixed cost of a launch and a kernel's ramp-up is
  most of the time (fusing kernels or larger batches help);
- multi-pass: two or more kernels of 5 us or more on average; each pass moves data again, so the traffic
  is well above the formula's minimum bytes (fusion removes passes);
- latency/occupancy: one long kernel still far from the bound: too little parallel work
  per SM, or dependent memory accesses. The row cannot tell the two apart; the profiler's
  occupancy and stall counters (Nsight Compute) can.

The kernels column lists the distinct kernels of a call, so a kernel launched twice counts once:
the launch-bound test then errs towards "not launch-bound".

    python3 benchmarks/limit_diagnosis.py results/h100.db        # a markdown table on stdout
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from pytest_opperf.hardware.specs import load_specs
from pytest_opperf.store.results import open_results

LAUNCH_US = 5.0  # per kernel: below this a kernel's time is mostly its fixed cost on a current GPU
FAR = 0.5  # a best backend under this fraction of its roofline gets a named limit


def classify(fraction: float, time_us: float, kernels: int) -> str:
    """The limit a case hits, from its roofline fraction, time and distinct kernels per call.

    >>> classify(0.9, 100.0, 1)
    'near the roofline'
    >>> classify(0.1, 8.0, 3)
    'launch-bound'
    >>> classify(0.2, 600.0, 4)
    'multi-pass'
    >>> classify(0.3, 600.0, 1)
    'latency/occupancy'
    """
    if fraction >= FAR:
        return "near the roofline"
    if time_us / max(kernels, 1) < LAUNCH_US:
        return "launch-bound"
    if kernels >= 2:
        return "multi-pass"
    return "latency/occupancy"


def roofline_us(flops: float, nbytes: float, peak: Optional[float], bandwidth: float) -> float:
    """The shortest time the formulas allow: the longer of compute at peak and bytes at bandwidth.

    >>> roofline_us(2e12, 1e9, 1e15, 1e12)   # 2 ms of compute against 1 ms of memory
    2000.0
    """
    return max(flops / peak if peak else 0.0, nbytes / bandwidth) * 1e6


def diagnose(db: Path) -> tuple[str, list[dict]]:
    with open_results(db) as results:
        device = results.latest_run()["device"]
        spec = load_specs()[device]
        out = []
        for table in results.op_tables():
            rows = results.rows(table)
            if any(r.get("busbw_gbps") is not None for r in rows):
                continue  # a collective: bound by links, not by memory or compute
            rows = [r for r in rows if (r.get("time_us") or 0) > 0 and (r.get("bytes") or 0) > 0]
            if rows:
                out.append(_best_against_roofline(table, rows, results.params(table), spec))
    return device, out


def _best_against_roofline(table: str, rows: list[dict], shape_cols: list[str], spec) -> dict:
    """The largest shape's fastest row against its roofline."""
    for row in rows:
        peak = spec.peak_flops(row["peak_dtype"], row["peak_kind"]) if row["peak_dtype"] else None
        row["roofline_us"] = roofline_us(row["flops"] or 0.0, row["bytes"], peak, spec.mem_bw_bytes_per_s)
    largest = max(rows, key=lambda r: r["roofline_us"])
    same = [r for r in rows if all(r[c] == largest[c] for c in shape_cols) and r["dtype_in"] == largest["dtype_in"]]
    best = min(same, key=lambda r: r["time_us"])
    kernels = len(json.loads(best["kernels"])) if best["kernels"] else 0
    fraction = best["roofline_us"] / best["time_us"]
    return {"op": table, "shape": " ".join(f"{c}={best[c]}" for c in shape_cols), "dtype": best["dtype_in"],
            "backend": best["backend"], "time_us": best["time_us"], "roofline_us": best["roofline_us"],
            "fraction": fraction, "kernels": kernels, "limit": classify(fraction, best["time_us"], kernels)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    args = parser.parse_args(argv)
    device, found = diagnose(args.db)
    print(f"{args.db} ({device}): per op, its largest shape's fastest backend against the datasheet roofline\n")
    print("| op | shape | dtype | best backend | time_us | roofline_us | fraction | kernels | limit |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in found:
        print(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['backend']} | {r['time_us']:.1f} | "
              f"{r['roofline_us']:.1f} | {r['fraction']:.0%} | {r['kernels']} | {r['limit']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
