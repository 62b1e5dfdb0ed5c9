"""The harness's cost per case on the default sweep, against its sampling and do_bench.

    python3 benchmarks/acceptance/harness_cost.py [--out DIR] [--pytest-args "-k 'not fp8'"] [--no-do-bench]

1. Runs `pytest benches/` with the default settings (the shipped configs, the default timer) in
   a fresh process, rows to DIR/results/<device>.db, and times it end to end.
2. Reads the rows: per case the sampling time (`phase_sampling_ms`), the other phases, and the
   case's wall time (`started_unix_s` .. `ended_unix_s`); the start-up (process start to the first
   case) and the end (last case to process exit) are what the session costs once.
   Kernel and collective cases alike (both carry phase columns and stamps).
3. For the same cases, in this process, times `triton.testing.do_bench(fn, return_mode="median")`
   (its defaults: 25 ms warm-up, 100 ms of repetitions) on the same inputs: its wall time per case,
   without and with the case's first call (compilation). The first calls run on empty Triton and
   Inductor caches of their own, as the sweep's did on a fresh machine (--warm-cache: on the
   machine's caches, for a second run whose sweep also found them filled).

Both sides are shown with and without their first calls: compiling a backend is the backend's
cost and a user pays it once per machine (Triton and Inductor keep their caches on disk), while
the harness's own cost is the rest. Run the script twice on one machine for the warm figures.

Prints markdown tables and writes them to DIR/harness_cost.md (DIR: --out, else $OUT, else a
temporary directory). Targets: end-to-end wall per case <= 2x the sampling time
per case, and <= 0.5x do_bench's wall per case. The do_bench part stops after --do-bench-budget
seconds (default 60; the cases are taken in a seeded random order, so a subset spans the ops):
about 3-4 minutes in all on an H100 (the default sweep alone took 140 s there at 7e73ce1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("setup", "inputs", "check", "warmup", "devstate", "sampling", "verify", "record")


def run_sweep(out: Path, extra: list[str]) -> tuple[float, float, float, int, Path]:
    """(process start unix s, end unix s, wall s, exit code, database) of `pytest benches/`."""
    results = out / "results"
    command = [sys.executable, "-m", "pytest", "benches/", "-q", "-p", "no:cacheprovider",
               f"--opperf-results={results}", "--opperf-summary=0", *extra]
    print("$", " ".join(shlex.quote(c) for c in command), flush=True)
    start_unix, start = time.time(), time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (out / "sweep.log").write_text(done.stdout + done.stderr)
    tail = [line for line in done.stdout.splitlines() if line.startswith("opperf:") or " passed" in line]
    print("\n".join(tail[-6:]), flush=True)
    dbs = sorted(results.glob("*.db"))
    if not dbs:
        raise SystemExit(f"the sweep wrote no database (exit {done.returncode}); see {out / 'sweep.log'}")
    return start_unix, start_unix + wall, wall, done.returncode, dbs[0]


def read_rows(db: Path) -> list[dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    tables = [r[0] for r in con.execute("select name from sqlite_master where type='table' and name != 'runs' "
                                        "and name not like 'sqlite_%'")]
    rows = []
    for table in tables:
        if "started_unix_s" not in {r["name"] for r in con.execute(f"pragma table_info([{table}])")}:
            continue  # not a table of cases (ceilings)
        key = [r["name"] for r in con.execute(f"pragma index_info([{table}_key])")]
        for r in con.execute(f"select * from [{table}] where started_unix_s is not null"):
            row = dict(r)
            row["op"] = table
            row["_params"] = [c for c in key if c not in ("dtype_in", "dtype_out", "backend", "backend_version",
                                                          "knobs", "timer", "cache")]
            rows.append(row)
    con.close()
    return rows


def do_bench_walls(rows: list[dict], budget_s: float, fresh_caches: bool) -> list[tuple[str, float, float, float, str]]:
    """(case, do_bench's wall ms, do_bench's median us, first call ms, test id) for the rows' cases,
    rebuilt here, in a seeded random order (so a subset spans the ops) until budget_s has passed.
    fresh_caches: compile into empty Triton and Inductor cache directories."""
    if fresh_caches:
        for variable in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            os.environ[variable] = tempfile.mkdtemp(prefix=variable.lower() + "-")
    import torch
    import triton.testing

    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import BACKENDS, OPS, DTypes
    from pytest_opperf import dtypes as table

    load_builtin()
    device = torch.device("cuda", 0)
    out = []
    started = time.perf_counter()
    order = list(rows)
    random.Random(0).shuffle(order)
    for row in order:
        if time.perf_counter() - started > budget_s:
            print(f"do_bench: budget of {budget_s:g} s spent after {len(out)} of {len(rows)} cases")
            break
        op, key = OPS.get(row["op"]), (row["op"], row["backend"])
        if op is None or key not in BACKENDS or row.get("busbw_gbps") is not None:
            continue  # a collective (its rank group is the plugin's): do_bench times one process
        params = {p: row[p] for p in row["_params"]}
        knobs = json.loads(row["knobs"]) if row.get("knobs") else {}
        fn = BACKENDS[key].fn
        dt = DTypes(table.lookup(row["dtype_in"]), table.lookup(row["dtype_out"]))
        gen = torch.Generator(device=device).manual_seed(0)
        try:
            with torch.inference_mode():
                args = op.inputs(params, dt, device, gen)
                call = (lambda: fn(*args, **knobs))
                first = time.perf_counter()
                call()  # compilation and autotuning: shown apart, as ours (first_call_ms)
                torch.cuda.synchronize()
                start = time.perf_counter()
                median_ms = triton.testing.do_bench(call, return_mode="median")
                wall = time.perf_counter() - start
        except Exception as exc:  # a case do_bench cannot time is left out of the comparison, said so
            print(f"do_bench: {row['op']}/{row['backend']} {params}: {type(exc).__name__}: {exc}"[:300])
            continue
        out.append((f"{row['op']}/{row['backend']}", wall * 1e3, median_ms * 1e3, (start - first) * 1e3, row["test_id"]))
        del args
    return out


def bytecode_note() -> str:
    """Where torch's modules have no bytecode cache, every process (the sweep, its rank server,
    inductor's compile workers) compiles them from source: seconds each, that a pip-installed
    torch does not cost. Said in the results, so such a machine's start-up is read as such."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return ""
    cached = Path(importlib.util.cache_from_source(spec.origin))
    if cached.exists():
        return ""
    return (f"Note: torch's modules have no bytecode cache here ({cached.parent} missing"
            f"{', PYTHONDONTWRITEBYTECODE is set' if sys.dont_write_bytecode else ''}): every process "
            f"compiles them from source. `python3 -m compileall -q <site-packages>` first does what pip "
            f"does at install.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments for the sweep, one string")
    parser.add_argument("--no-do-bench", action="store_true", help="leave out the do_bench comparison")
    parser.add_argument("--do-bench-budget", type=float, default=60.0,
                        help="seconds for the do_bench part (a seeded random subset of the cases past it)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="do_bench's first calls use the machine's compile caches (a second run)")
    args = parser.parse_args()
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="harness-cost-"))
    out.mkdir(parents=True, exist_ok=True)

    start, end, wall, code, db = run_sweep(out, shlex.split(args.pytest_args))
    rows = [r for r in read_rows(db) if r["started_unix_s"] >= start]  # this sweep's rows, not older ones
    if not rows:
        raise SystemExit(f"{db}: no rows with phase columns")
    n = len(rows)
    first = min(r["started_unix_s"] for r in rows)
    last = max(r["ended_unix_s"] for r in rows)
    case_walls = [(r["ended_unix_s"] - r["started_unix_s"]) * 1e3 for r in rows]
    sampling = [r["phase_sampling_ms"] or 0.0 for r in rows]
    per_case = wall * 1e3 / n
    end_to_end = [f"| end to end (process wall {wall:.1f} s / {n} cases) | {per_case:.1f} |"]
    first_calls = sum(r.get("first_call_ms") or 0.0 for r in rows) / n
    lines = [f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {db.name}, {n} cases stored, sweep exit {code}", ""]
    note = bytecode_note()
    if note:
        lines += [note, ""]
    lines += ["| | ms a case |", "| --- | ---: |",
              *end_to_end,
              f"| the cases alone (first case start to last case end / cases) | {(last - first) * 1e3 / n:.1f} |",
              f"| a case's own wall time, mean (median) | {statistics.mean(case_walls):.1f} "
              f"({statistics.median(case_walls):.1f}) |",
              f"| sampling, mean (median) | {statistics.mean(sampling):.1f} ({statistics.median(sampling):.1f}) |",
              f"| **end to end / sampling** (target <= 2) | **{per_case / statistics.mean(sampling):.2f}x** |",
              f"| first calls (compilation), mean | {first_calls:.1f} |",
              f"| end to end less first calls / sampling | {(per_case - first_calls) / statistics.mean(sampling):.2f}x |",
              "", f"Once per session: start-up (process start to the first case) {first - start:.1f} s, "
              f"end (last case to exit) {end - last:.1f} s.", "",
              "| phase | mean ms a case | share of the cases' wall time |", "| --- | ---: | ---: |"]
    total_wall = sum(case_walls)
    for p in PHASES:
        total = sum(r.get(f"phase_{p}_ms") or 0.0 for r in rows)
        lines.append(f"| {p} | {total / n:.1f} | {total / total_wall:.1%} |")
    other = total_wall - sum(sum(r.get(f"phase_{p}_ms") or 0.0 for r in rows) for p in PHASES)
    lines.append(f"| other (pytest between phases) | {other / n:.1f} | {other / total_wall:.1%} |")
    slowest = sorted(rows, key=lambda r: -(r["ended_unix_s"] - r["started_unix_s"]))[:8]
    lines += ["", "Slowest cases (ms): wall, check (first_call_ms inside it), sampling", ""]
    for r in slowest:
        lines.append(f"- {r['test_id'].split('::')[-1]}: {(r['ended_unix_s'] - r['started_unix_s']) * 1e3:.0f}, "
                     f"{r['phase_check_ms'] or 0:.0f} ({r['first_call_ms'] or 0:.0f}), {r['phase_sampling_ms'] or 0:.0f}")
    if not args.no_do_bench:
        try:
            bench = do_bench_walls(rows, args.do_bench_budget, fresh_caches=not args.warm_cache)
        except ImportError as exc:
            bench = []
            lines += ["", f"do_bench not run: {exc}"]
        if bench:
            mean_db = statistics.mean(w for _, w, *_ in bench)
            mean_first = statistics.mean(f for _, _, _, f, _ in bench)
            caches = "the machine's" if args.warm_cache else "empty"
            lines += ["", "| | ms a case |", "| --- | ---: |",
                      f"| do_bench wall, same cases, this process ({len(bench)} cases) | {mean_db:.1f} |",
                      f"| do_bench's first calls ({caches} compile caches), mean | {mean_first:.1f} |",
                      f"| **end to end / do_bench** (target <= 0.5) | **{per_case / mean_db:.2f}x** |",
                      f"| end to end / do_bench, first calls in both | {per_case / (mean_db + mean_first):.2f}x |",
                      f"| end to end / do_bench, first calls in neither | "
                      f"{(per_case - first_calls) / mean_db:.2f}x |"]
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "harness_cost.md").write_text(text)
    print(f"written to {out / 'harness_cost.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
