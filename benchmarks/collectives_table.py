"""The plugin's collective rows beside nccl-tests' output, from one run of
benchmarks/collectives_conventions.sh (its $OUT: nccl/<op>_g<n>_G<graph>.txt and results/*.db).

    python3 benchmarks/collectives_table.py OUT_DIR

Prints, per op, group size and message size: the plugin's time for each convention it ran, nccl-tests'
time (out-of-place; in-place for all_reduce, which the plugin's torch_dist backend runs in place), and
the ratio; then the share of rows within 3% at 1 MiB and above, and the unstable rows (CV > 0.05).
nccl-tests' `size` is the whole buffer of its op: all_gather's is the gathered one (n x message_bytes).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

NCCL_NAME = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
             "all_to_all": "alltoall"}
IN_PLACE = {"all_reduce"}


def nccl_times(path: Path, in_place: bool) -> dict:
    """size -> time in us from one nccl-tests table (out-of-place or in-place columns)."""
    out = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 12 or not parts[0].isdigit():
            continue
        # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
        try:
            out[int(parts[0])] = float(parts[9] if in_place else parts[5])
        except ValueError:
            continue
    return out


def rows(out: Path) -> list:
    found = []
    for db in sorted((out / "results").glob("*.db")):
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        for op in NCCL_NAME:
            try:
                found += [dict(r, op=op) for r in con.execute(f"select * from [{op}]")]
            except sqlite3.OperationalError:
                continue
        con.close()
    return found


def main(out: Path) -> None:
    ours = rows(out)
    conventions = sorted({r["comm_convention"] for r in ours if r.get("comm_convention")})
    graph_ours = {"graph": 10, "loop": 0}
    print(f"| op | n | message_bytes | {' | '.join(f'{c} us' for c in conventions)} | nccl-tests us | "
          f"nccl-tests -G us | loop / nccl | graph / nccl -G | cv (loop) |")
    print("| --- | ---: | ---: |" + " ---: |" * (len(conventions) + 5))
    within, big, unstable = 0, 0, []
    keys = sorted({(r["op"], r["num_devices"], r["message_bytes"]) for r in ours})
    for op, n, size in keys:
        by = {r["comm_convention"]: r for r in ours if (r["op"], r["num_devices"], r["message_bytes"]) == (op, n, size)}
        nccl_size = size * n if op == "all_gather" else size
        ref = {g: nccl_times(out / "nccl" / f"{NCCL_NAME[op]}_g{n}_G{g}.txt", op in IN_PLACE).get(nccl_size)
               for g in graph_ours.values()}
        cells = [f"{by[c]['time_us']:.2f}" if c in by else "-" for c in conventions]
        ratios = []
        for c, g in (("loop", 0), ("graph", 10)):
            r = by.get(c)
            ratios.append(f"{r['time_us'] / ref[g]:.3f}" if r and ref[g] else "-")
            if c == "loop" and r and ref[g] and size >= 1 << 20:
                big += 1
                within += abs(r["time_us"] / ref[g] - 1) <= 0.03
        for r in by.values():
            if r["cv"] is not None and r["cv"] > 0.05:
                unstable.append(f"{op} n={n} {size} {r['comm_convention']}: cv {r['cv']:.3f}")
        loop_cv = f"{by['loop']['cv']:.3f}" if "loop" in by else "-"
        refs = [f"{ref[g]:.2f}" if ref[g] else "-" for g in (0, 10)]
        print(f"| {op} | {n} | {size} | {' | '.join(cells)} | {' | '.join(refs)} | {' | '.join(ratios)} | {loop_cv} |")
    print(f"\nloop within 3% of nccl-tests at >= 1 MiB: {within} of {big}")
    print(f"rows with CV > 0.05: {len(unstable)} of {len(ours)}")
    for line in unstable:
        print("  " + line)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
