"""Does the clock warm-up keep an idle GPU's first cases stable? The same sweep from idle, off vs auto.

For each mode (off, then auto, then off and auto again with --rounds 2): let the GPU idle for
--idle seconds (its SM clock drops; printed), run `pytest BENCHES -k EXPR` with
--opperf-clock-warmup=MODE into a results directory of its own, then read the rows: unstable
cases (CV > 0.15) overall and among the first --first cases, the SM clock each case started
at, and the warm-ups recorded. Writes OUT/clock_warmup.json and prints a table last.

    python3 benchmarks/clock_warmup.py --out out/clockwarm -k gemm            # on the GPU machine
    python3 benchmarks/clock_warmup.py --out out/clockwarm -k "gemm and bf16" --idle 60 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from pytest_opperf.measure import clocks, devstate


def sm_clock() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return devstate.open_monitor(torch.device("cuda", torch.cuda.current_device())).sm_clock()


def read_rows(db: Path) -> tuple[list[dict], dict]:
    """The op tables' rows in the order they were measured, and the runs row."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        tables = [t for (t,) in con.execute("select name from sqlite_master where type = 'table' and name != 'runs'")]
        found = [dict(r) for t in tables for r in con.execute(f"select rowid as _rowid, * from [{t}]")]
        run = dict(con.execute("select * from runs").fetchone())
    finally:
        con.close()
    return sorted(found, key=lambda r: (r["created_at"], r["_rowid"])), run


def one_run(args, mode: str, index: int) -> dict:
    time.sleep(args.idle)
    idle_mhz = sm_clock()
    results = args.out / f"{mode}{index}"
    cmd = [sys.executable, "-m", "pytest", args.benches, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--opperf-clock-warmup={mode}", f"--opperf-results={results}", "--opperf-summary=0"]
    cmd += ["-k", args.k] if args.k else []
    began = time.monotonic()
    subprocess.run(cmd, check=False)
    wall = time.monotonic() - began
    dbs = list(results.glob("*.db"))
    if not dbs:
        return {"mode": mode, "round": index, "error": f"no database under {results}"}
    found, run = read_rows(dbs[0])
    first = found[:args.first]
    return {
        "mode": mode, "round": index, "idle_sm_clock_mhz": idle_mhz, "wall_s": round(wall, 2), "cases": len(found),
        "unstable": sum(r["unstable"] for r in found), "unstable_first": sum(r["unstable"] for r in first),
        "first_cases": [{k: r.get(k) for k in ("test_id", "cv", "time_us", "sm_clock_mhz_before", *clocks.COLUMNS)}
                        for r in first],
        "clock_warmups": run.get("clock_warmups"), "clock_warmup_s": run.get("clock_warmup_s"),
        "device": run.get("device_reported"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("-k", default="gemm", help="pytest -k expression selecting the cases")
    parser.add_argument("--benches", default="benches")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds the GPU idles before each sweep")
    parser.add_argument("--first", type=int, default=10, help="how many of the first cases to show")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [one_run(args, mode, i) for i in range(args.rounds) for mode in ("off", "auto")]
    (args.out / "clock_warmup.json").write_text(json.dumps(runs, indent=2) + "\n")

    print(f"\n{'mode':<6} {'round':>5} {'idle MHz':>9} {'cases':>6} {'unstable':>9} {'of first':>9} "
          f"{'warm-ups':>9} {'warm-up s':>10} {'wall s':>8}")
    for r in runs:
        if "error" in r:
            print(f"{r['mode']:<6} {r['round']:>5}  {r['error']}")
            continue
        print(f"{r['mode']:<6} {r['round']:>5} {r['idle_sm_clock_mhz'] or '-':>9} {r['cases']:>6} {r['unstable']:>9} "
              f"{r['unstable_first']:>6}/{args.first:<2} {r['clock_warmups'] or 0:>9} {r['clock_warmup_s'] or 0:>10} "
              f"{r['wall_s']:>8}")
    for r in runs:
        if "error" in r:
            continue
        print(f"\n{r['mode']} round {r['round']}: first cases (SM clock at start, CV, warm-up)")
        for c in r["first_cases"]:
            print(f"  {c['test_id'].split('::')[-1][:60]:<60} {c['sm_clock_mhz_before'] or '-':>5} MHz  "
                  f"cv {c['cv']:.3f}  {c['clock_warmup_method'] or ''} {c['clock_warmup_s'] if c['clock_warmup_s'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
