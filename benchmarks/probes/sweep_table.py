"""The default sweep's per-op table for docs/benchmarks.md: every backend at each op's largest case.

Reads a results database (`pytest benches/` writes results/<device>.db) and prints, per op, the
case with the most work (the largest FLOPs, else bytes) and each backend's median there, with MFU
for matrix ops and MBU otherwise, fastest first; the fastest is named only when its lead over the
next exceeds both rows' confidence intervals (else "~", no significant difference).

    python3 benchmarks/probes/sweep_table.py results/h100.db
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pytest_opperf.catalog import OPS, load_builtin  # noqa: E402
from pytest_opperf.store.results import open_results  # noqa: E402


def table(db_path: Path) -> list[str]:
    load_builtin()
    out = ["| op | case (the sweep's largest) | backend: time_us (MFU for matrix ops, MBU otherwise) | best |",
           "| --- | --- | --- | --- |"]
    with open_results(db_path) as db:
        for op in sorted(db.op_tables()):
            rows = [r for r in db.rows(op) if r.get("time_us")]
            if op not in OPS or OPS[op].peak == "link" or not rows:
                continue
            names = db.params(op)
            key = lambda r: tuple(r[n] for n in names) + (r["dtype_in"],)  # noqa: E731
            largest = max(rows, key=lambda r: (r.get("flops") or 0, r.get("bytes") or 0))
            same = sorted((r for r in rows if key(r) == key(largest)), key=lambda r: r["time_us"])
            util = "mfu" if OPS[op].peak == "matrix" else "mbu"
            cells = [f"{r['backend']} {r['time_us']:.1f}" + (f" ({100 * r[util]:.0f}%)" if r.get(util) is not None else "")
                     for r in same]
            best = same[0]["backend"]
            if len(same) > 1:
                a, b = same[0], same[1]
                lead = b["time_us"] - a["time_us"]
                if lead <= a["time_us"] * (a.get("ci_rel") or 0) + b["time_us"] * (b.get("ci_rel") or 0):
                    best = f"~ {best}"
            case = " ".join(f"{n}={largest[n]}" for n in names) + f" {largest['dtype_in']}"
            out.append(f"| {op} | {case} | {'; '.join(cells)} | {best} |")
    return out


if __name__ == "__main__":
    print("\n".join(table(Path(sys.argv[1] if len(sys.argv) > 1 else "results/h100.db"))))
