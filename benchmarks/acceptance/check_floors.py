"""The functional check's detection floor of every row of a results database (issue 45).

    python3 benchmarks/acceptance/check_floors.py results/h100.db [--run RUN_ID]

Prints, per op table, the rows of the run (default: the latest that wrote rows), how many carry a
floor (`check_floor`), the floors' range, the rows whose floor is 0 (every output compared exactly:
ids, integers: `exact`, each named) and those with none (rows written before exact comparisons
recorded 0) and every row whose floor is above 1% (a kernel 1%
off could pass its check). Exit 1 when the run wrote no row with a floor at all.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

LIMIT = 0.01


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--run", default=None, help="a run id (default: the latest run that wrote rows)")
    args = parser.parse_args(argv)
    if not args.db.is_file():
        print(f"{args.db}: no such database", file=sys.stderr)
        return 2
    con = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    tables = [r[0] for r in con.execute("select name from sqlite_master where type = 'table'")]
    ops = [t for t in tables if "check_floor" in {c[1] for c in con.execute(f'pragma table_info("{t}")')}]
    run = args.run or _latest_run(con, ops)
    total, over, without, exacts, floored = 0, [], [], [], 0
    print(f"{args.db}, run {run}")
    print(f"{'op':24} {'rows':>5} {'floor':>6} {'exact':>6} {'min':>9} {'max':>9} {'> 1%':>5}")
    for op in sorted(ops):
        rows = con.execute(f'select test_id, check_floor from "{op}" where run_id = ?', [run]).fetchall()
        if not rows:
            continue
        floors = [f for _, f in rows if f]  # 0: every output compared exactly
        exact = [t for t, f in rows if f == 0]
        missing = [t for t, f in rows if f is None]
        high = [(t, f) for t, f in rows if f is not None and f > LIMIT]
        without += missing
        exacts += exact
        floored += len(floors) + len(exact)
        total += len(rows)
        over += high
        low, top = (f"{min(floors):.2e}", f"{max(floors):.2e}") if floors else ("-", "-")
        print(f"{op:24} {len(rows):5} {len(floors):6} {len(exact):6} {low:>9} {top:>9} {len(high):5}")
    print(f"{total} rows; {len(over)} with a floor above {LIMIT:.0%}:")
    for test_id, floor in over:
        print(f"  {floor:7.2%}  {test_id.split('::', 1)[-1]}")
    print(f"{len(exacts)} exact (every output compared exactly: floor 0):")
    for test_id in exacts:
        print(f"  {test_id.split('::', 1)[-1]}")
    print(f"{len(without)} without a floor (NULL: written before exact comparisons recorded 0):")
    for test_id in without:
        print(f"  {test_id.split('::', 1)[-1]}")
    return 0 if floored else 1


def _latest_run(con, ops) -> str:
    best = None
    for op in ops:
        row = con.execute(f'select run_id, max(created_at) from "{op}" group by run_id order by 2 desc limit 1').fetchone()
        if row and row[0] and (best is None or row[1] > best[1]):
            best = row
    return best[0] if best else ""


if __name__ == "__main__":
    sys.exit(main())
