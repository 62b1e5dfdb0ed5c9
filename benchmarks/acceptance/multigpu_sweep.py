"""One sweep, serial and with one xdist worker per GPU.

512 bf16 GEMM cases (M, N, K each in 256..8192) run through the real plugin twice: serially,
then with `-n <GPUs>`, from a copy of the serial run's database, so its workers take the
longest recorded cases first (docs/running.md). Reported: wall time of each, the speedup
against the GPU count, whether both databases hold the same row keys, and how many rows each
physical GPU (gpu_uuid) ran.
Per worker lane: when its first case started after the process did (the
controller's and the worker's start-up), the seconds its cases ran, and how long the process
took to exit after its last case.

    python3 benchmarks/acceptance/multigpu_sweep.py --out DIR                 # both runs, all visible GPUs
    python3 benchmarks/acceptance/multigpu_sweep.py --out DIR --mode serial   # one half per command, if the
    python3 benchmarks/acceptance/multigpu_sweep.py --out DIR --mode parallel #   pair does not fit one limit

Writes DIR/multigpu.json (merged over --mode calls) and prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZES = [256, 512, 1024, 2048, 3072, 4096, 6144, 8192]
CONFIG = f"""backend: torch
dtypes: bf16
params:
  M: {SIZES}
  N: {SIZES}
  K: {SIZES}
"""
KEY = ("m", "n", "k", "dtype_in", "dtype_out", "backend", "backend_version", "knobs", "timer", "cache")


def run(out: Path, name: str, workers: int, budget_s: float, extra: list[str], history: list[Path] = ()) -> dict:
    """One pytest session over the sweep (its database starting as a copy of `history`'s one file,
    if given); its wall time and rows."""
    results = out / name
    if results.exists():
        for f in results.glob("*.db"):
            f.unlink()
    results.mkdir(parents=True, exist_ok=True)
    for db in history[:1]:
        shutil.copy(db, results / db.name)
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "benches" / "test_matmul.py") + "::test_gemm", "-q",
           "-p", "no:randomly", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "--opperf-summary=0",
           f"--opperf-config={out / 'gemm.yaml'}", f"--opperf-results={results}", f"--opperf-budget={budget_s}", *extra]
    if workers:
        cmd += ["-n", str(workers)]
    start_unix, t0 = time.time(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    tail = proc.stdout.strip().splitlines()[-3:]
    dbs = sorted(results.glob("*.db"))
    rows = []
    if dbs:
        con = sqlite3.connect(dbs[0])
        con.row_factory = sqlite3.Row
        rows = [dict(r) for r in con.execute("select * from gemm where started_unix_s >= ?", [start_unix])]
        con.close()
    per_gpu: dict = {}
    for r in rows:
        label = f"gpu {r.get('gpu')} {r.get('gpu_uuid')}"
        per_gpu[label] = per_gpu.get(label, 0) + 1
    return {"name": name, "workers": workers, "wall_s": wall_s, "exit_code": proc.returncode, "rows": len(rows),
            "keys": sorted(list(tuple(r[c] for c in KEY)) for r in rows), "rows_per_gpu": per_gpu, "tail": tail,
            "lanes": lanes(rows, start_unix, start_unix + wall_s)}


def lanes(rows: list[dict], start_unix: float, end_unix: float) -> dict:
    """Per worker (serial: 'main'): seconds from the process start to its first case, from its last
    case to the process's exit, its cases, and the seconds they ran (their own wall times): where a
    session's fixed costs are, beside the cases.

    >>> lanes([{"worker": "gw0", "started_unix_s": 12.0, "ended_unix_s": 13.0},
    ...        {"worker": "gw0", "started_unix_s": 13.0, "ended_unix_s": 15.0}], 10.0, 16.0)["gw0"]
    {'first_case_s': 2.0, 'after_last_s': 1.0, 'cases': 2, 'busy_s': 3.0}
    """
    out: dict = {}
    for r in rows:
        if r.get("started_unix_s") is None or r.get("ended_unix_s") is None:
            continue
        lane = out.setdefault(r.get("worker") or "main", {"first": r["started_unix_s"], "last": r["ended_unix_s"],
                                                          "cases": 0, "busy_s": 0.0})
        lane["first"] = min(lane["first"], r["started_unix_s"])
        lane["last"] = max(lane["last"], r["ended_unix_s"])
        lane["cases"] += 1
        lane["busy_s"] += r["ended_unix_s"] - r["started_unix_s"]
    return {name: {"first_case_s": round(v["first"] - start_unix, 3), "after_last_s": round(end_unix - v["last"], 3),
                   "cases": v["cases"], "busy_s": round(v["busy_s"], 3)} for name, v in sorted(out.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=0, help="xdist workers (default: one per visible GPU)")
    parser.add_argument("--budget", type=float, default=0.25, help="--opperf-budget per case, seconds")
    parser.add_argument("--mode", choices=("both", "serial", "parallel"), default="both")
    parser.add_argument("--pytest-args", default="", help="more pytest options for both runs, e.g. "
                        "'--opperf-timer=cuda_graph --opperf-min-samples=600' (a GPU-bound sweep)")
    args = parser.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    workers = args.workers or gpus
    if workers < 1:
        print("no GPU visible", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm.yaml").write_text(CONFIG)
    report_path = args.out / "multigpu.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update({"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(0), "gpus": gpus,
                   "cases": len(SIZES) ** 3, "budget_s": args.budget, "pytest_args": args.pytest_args})
    extra = args.pytest_args.split()
    if args.mode in ("both", "serial"):
        report["serial"] = run(args.out, "serial", 0, args.budget, extra)
    if args.mode in ("both", "parallel"):
        report["parallel"] = run(args.out, "parallel", workers, args.budget, extra,
                                 sorted((args.out / "serial").glob("*.db")))
    serial, parallel = report.get("serial"), report.get("parallel")
    if serial and parallel:
        report["speedup"] = serial["wall_s"] / parallel["wall_s"]
        report["speedup_per_gpu"] = report["speedup"] / parallel["workers"]
        report["same_keys"] = serial["keys"] == parallel["keys"]
    report_path.write_text(json.dumps(report, indent=1))

    print(f"{report['date']}  {report['device']} x{gpus}  {report['cases']} cases, budget {args.budget}s/case "
          f"{args.pytest_args}")
    print(f"{'run':<10} {'workers':>7} {'wall s':>8} {'rows':>6} {'exit':>5}  rows per GPU")
    for r in (serial, parallel):
        if r:
            print(f"{r['name']:<10} {r['workers']:>7} {r['wall_s']:>8.1f} {r['rows']:>6} {r['exit_code']:>5}  "
                  f"{r['rows_per_gpu']}")
    for r in (serial, parallel):
        for name, lane in (r or {}).get("lanes", {}).items():
            print(f"  {r['name']} {name}: first case at {lane['first_case_s']:.1f} s, {lane['cases']} cases busy "
                  f"{lane['busy_s']:.1f} s, exit {lane['after_last_s']:.1f} s after its last case")
    if "speedup" in report:
        print(f"speedup {report['speedup']:.2f}x on {parallel['workers']} GPUs = {report['speedup_per_gpu']:.2f} per GPU "
              f"(target >= 0.9); identical row keys: {report['same_keys']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
