"""Tune two of our Triton kernels on a GPU, then run them with the tuned table.

1. Sweep: rmsnorm over a grid of BLOCK_SIZE x num_warps (25 knob sets, the constraint
   `block_size >= n` leaves 20 to 25 per shape) and softmax by the seeded random search
   (20 of the sets the constraints allow per shape, budget 40 s per shape), both with their default, on model shapes.
2. `opperf best --export tuned.json`: the fastest knobs per shape against the default.
3. The kernels without knobs, with `--opperf-tuned=tuned.json`: each row must show the table's
   knobs, and its time is set beside the default's.
4. What `--opperf-trace` costs: the same default cases with and without it (wall time, file sizes).

    python3 benchmarks/probes/tune_rmsnorm.py                # files to $OUT, else a temporary directory

Prints markdown tables; writes tune.json, tuned.json, the databases and the traces. About 2-3
minutes on an H100 (Triton compiles each knob set once: ~50 compilations).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWEEP = {
    "rmsnorm": """\
backends:
  triton:
    knobs: {BLOCK_SIZE: [4096, 8192, 16384, 32768, 65536], num_warps: [2, 4, 8, 16, 32]}
    constraints: ["block_size >= n"]
    default: true
dtypes: bf16
cases:
  - {M: 4096, N: 4096}     # Llama-3.1 8B, a 4096-token prefill
  - {M: 16384, N: 8192}    # Llama-3.1 70B, a 16384-token prefill
  - {M: 256, N: 8192}      # Llama-3.1 70B, 256 decode tokens
""",
    "softmax": """\
backends:
  triton:
    knobs: {BLOCK_SIZE: {min: 4096, max: 65536, mul: 2}, num_warps: [1, 2, 4, 8, 16, 32]}
    constraints: ["block_size >= n", "block_size // (32 * num_warps) <= 1024"]
    default: true
    search: {samples: 20, seed: 0, budget: 40}
dtypes: bf16
cases:
  - {M: 1024, N: 4096}     # unfused attention: 32 heads x 32 sequences over a 4096-token context
  - {M: 64, N: 32768}      # sampler probabilities over a 32768-word vocabulary
""",
}
PLAIN = {op: text.split("backends:")[0] + "backends: [triton]\ndtypes: bf16\ncases:" + text.split("cases:")[1]
         for op, text in SWEEP.items()}


def pytest(out: Path, configs: dict, results: str, *extra: str) -> tuple[float, str]:
    for op, text in configs.items():
        (out / f"{op}.yaml").write_text(text)
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "benches"), "-k", " or ".join(f"test_{op}" for op in configs), "-q",
           "-p", "no:cacheprovider", "-p", "no:randomly", f"--rootdir={ROOT}", "--opperf-summary=0", "-rs",
           f"--opperf-results={out / results}", "--opperf-budget=0.2", "--opperf-timeout=60",
           *(f"--opperf-config={out / f'{op}.yaml'}" for op in configs), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(f"$ pytest ... {results}: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]}"
          f" ({wall:.0f} s)", flush=True)
    if proc.returncode not in (0, 1):
        print(proc.stdout[-4000:], proc.stderr[-4000:])
    return wall, proc.stdout


def rows(db: Path, op: str) -> list[dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(f"select * from [{op}]")]
    finally:
        con.close()


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="opperf-tune-"))
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {}

    pytest(out, SWEEP, "sweep")
    db = next((out / "sweep").glob("*.db"))
    for op in SWEEP:
        got = rows(db, op)
        report.setdefault("knob_sets", {})[op] = {
            f"m={m}-n={n}": len({r["knobs"] for r in got if (r["m"], r["n"]) == (m, n)})
            for m, n in sorted({(r["m"], r["n"]) for r in got})}
    best = subprocess.run([sys.executable, "-m", "pytest_opperf.cli", "best", str(db), "--markdown",
                           "--export", str(out / "tuned.json")], cwd=ROOT, capture_output=True, text=True)
    print(best.stdout, best.stderr)
    table = json.loads((out / "tuned.json").read_text())

    pytest(out, PLAIN, "tuned", f"--opperf-tuned={out / 'tuned.json'}")
    tuned_db = next((out / "tuned").glob("*.db"))
    lines = ["| op | shape | knob sets (and the default) | default us | best knobs (sweep) | best us | tuned run us | knobs of the tuned run "
             "| speedup over default |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ok = True
    for name, entries in table["tables"].items():
        op = name.split("/")[0]
        by_shape = {f"bf16-m={r['m']}-n={r['n']}": r for r in rows(tuned_db, op)}
        for shape, e in entries["shapes"].items():
            run = by_shape.get(shape, {})
            same = json.loads(run.get("knobs") or "{}") == e["knobs"]
            ok &= same
            sets = report["knob_sets"][op].get(shape.removeprefix("bf16-"), 1) - 1
            default = e["default_time_us"]
            lines.append(f"| {op} | {shape} | {sets} | {default:.2f} | {e['knobs']} | {e['time_us']:.2f} | "
                         f"{run.get('time_us', float('nan')):.2f} | {'table' if same else 'NOT the table: ' + str(run.get('knobs'))} | "
                         f"{default / run['time_us'] if run and default else float('nan'):.2f}x |")
    print("\n".join(lines))

    plain_wall, _ = pytest(out, PLAIN, "untraced", "--opperf-sample-only")
    traced_wall, _ = pytest(out, PLAIN, "traced", "--opperf-sample-only", f"--opperf-trace={out / 'traces'}")
    traces = sorted((out / "traces").glob("*.json"))
    sizes = [p.stat().st_size for p in traces]
    ranges = [sum(1 for e in json.loads(p.read_text())["traceEvents"] if str(e.get("name", "")).startswith("opperf::sample"))
              for p in traces]
    cases = len(traces)
    print(f"\n| --opperf-trace | cases | wall s | per case s | trace KB (min-max) | sample ranges per file |\n"
          f"| --- | --- | --- | --- | --- | --- |\n"
          f"| off | {cases} | {plain_wall:.1f} | {plain_wall / max(cases, 1):.2f} | - | - |\n"
          f"| on | {cases} | {traced_wall:.1f} | {traced_wall / max(cases, 1):.2f} | "
          f"{min(sizes, default=0) // 1024}-{max(sizes, default=0) // 1024} | {sorted(set(ranges))} |")
    report.update(tuned=table, round_trip_ok=ok, trace={"cases": cases, "off_s": plain_wall, "on_s": traced_wall,
                                                         "bytes": sizes})
    (out / "tune.json").write_text(json.dumps(report, indent=1))
    print(f"\nfiles in {out}; round trip {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
