"""The plugin's collective rows beside nccl-tests' output, from one run of
benchmarks/acceptance/collectives_conventions.sh (its $OUT: nccl/<op>_g<n>_G<graph>.txt and results/*.db).

    python3 benchmarks/acceptance/collectives_table.py OUT_DIR [one_thread_]   # against nccl-tests -t n -g 1 [-g n]

Prints, per op, group size, nccl-tests' size and backend: the plugin's time for each convention it
ran, nccl-tests' time (out-of-place; in-place for torch_dist's all_reduce, which runs in place) plain
and with -G, and the ratios; then per backend the share of rows within the acceptance bands (loop
within 3% from 1 MiB, within 10% below; graph within 5% of -G) and the unstable rows (CV > 0.05).
Rows join nccl-tests' table on the row's `bytes`, which is nccl-tests' `size` for every collective
(all_gather's is the gathered buffer, n x message_bytes).
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


def in_place(op: str, backend: str) -> bool:
    """Which of nccl-tests' two columns a row compares with: torch_dist reduces all_reduce in place."""
    return op in IN_PLACE and backend != "nccl"


def main(out: Path, prefix: str = "") -> None:
    """prefix: which nccl-tests files to read ("one_thread_": one thread driving every GPU)."""
    ours = rows(out)
    tables = {(op, n, g, ip): nccl_times(out / "nccl" / f"{prefix}{NCCL_NAME[op]}_g{n}_G{g}.txt", ip)
              for op in NCCL_NAME for n in {r["num_devices"] for r in ours} for g in (0, 10) for ip in (False, True)}
    print("| op | n | size (nccl-tests) | backend | loop us | graph us | nccl-tests us | nccl-tests -G us | "
          "loop / nccl | graph / nccl -G | cv loop | cv graph |")
    print("| --- | ---: | ---: | --- |" + " ---: |" * 8)
    verdicts: dict = {}
    unstable = []
    keys = sorted({(r["op"], r["num_devices"], r["bytes"], r["backend"]) for r in ours})
    for op, n, size, backend in keys:
        by = {r["comm_convention"]: r for r in ours if (r["op"], r["num_devices"], r["bytes"], r["backend"]) ==
              (op, n, size, backend)}
        # A row's `bytes` is nccl-tests' size for every collective (all_gather: the gathered buffer).
        ref = {g: tables.get((op, n, g, in_place(op, backend)), {}).get(int(size)) for g in (0, 10)}
        cells, ratios = [], []
        for c, g in (("loop", 0), ("graph", 10)):
            r = by.get(c)
            cells.append(f"{r['time_us']:.2f}" if r else "-")
            ratio = r["time_us"] / ref[g] if r and ref[g] else None
            ratios.append(f"{ratio:.3f}" if ratio else "-")
            if ratio:
                band = ("loop >= 1 MiB", 0.03) if c == "loop" and size >= 1 << 20 else \
                    ("loop < 1 MiB", 0.10) if c == "loop" else ("graph", 0.05)
                tally = verdicts.setdefault((backend, band[0], band[1]), [0, 0, []])
                tally[1] += 1
                if abs(ratio - 1) <= band[1]:
                    tally[0] += 1
                else:
                    tally[2].append(f"{op} n={n} {int(size)}: {ratio:.3f}")
        for r in by.values():
            if r["cv"] is not None and r["cv"] > 0.05:
                unstable.append(f"{op} n={n} {int(size)} {backend} {r['comm_convention']}: cv {r['cv']:.3f}")
        cvs = [f"{by[c]['cv']:.3f}" if c in by and by[c]["cv"] is not None else "-" for c in ("loop", "graph")]
        refs = [f"{ref[g]:.2f}" if ref[g] else "-" for g in (0, 10)]
        print(f"| {op} | {n} | {int(size)} | {backend} | {' | '.join(cells)} | {' | '.join(refs)} | "
              f"{' | '.join(ratios)} | {' | '.join(cvs)} |")
    print()
    for (backend, band, limit), (good, total, off) in sorted(verdicts.items()):
        print(f"{backend} {band}: within {limit:.0%} of nccl-tests in {good} of {total}"
              + (f" (off: {'; '.join(off)})" if off else ""))
    print(f"rows with CV > 0.05: {len(unstable)} of {len(ours)} ({len(unstable) / max(len(ours), 1):.1%})")
    for line in unstable:
        print("  " + line)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
