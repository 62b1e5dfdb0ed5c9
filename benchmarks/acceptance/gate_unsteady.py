"""The gate as a CI job on a shared CPU runs it: a baseline saved once, beside a busy process or
quietly, then reruns of unchanged code beside the busy process; then the same baselines with every
time halved (every case 2x slower than its baseline). Issue 54's acceptance (CPU, about 3 minutes):

    python3 benchmarks/acceptance/gate_unsteady.py [--reruns 5] [--out DIR]

In a throw-away project, 20 fp32 GEMMs of torch (m 16 to 2048, n = k = 64 and 256: the smallest
take 12-20 us on a 2-core VM). Each session runs `pytest benches --device=cpu` with
`--opperf-max-regression=5%` and the plugin's other defaults; the busy process is load.py's spin
(one process: half of a 2-core machine); unchanged code is rerun beside it and quietly. Prints,
per condition, the sessions that failed and the verdicts; writes every session's JSON report under OUT. Unchanged code must fail no session; the
halved baselines must fail theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from load import Load

BENCH = "def test_gemm(backend, inputs, bench):\n    bench(backend, *inputs)\n"
CONFIG = "backends: [torch]\ndtypes: [fp32]\nparams: {m: [16, 32, 48, 64, 80, 128, 256, 512, 1024, 2048], n: [64, 256], k: [64]}\n"


def project(root: Path) -> Path:
    (root / "benches").mkdir(parents=True, exist_ok=True)
    (root / "configs").mkdir(exist_ok=True)
    (root / "benches" / "test_gemm.py").write_text(BENCH)
    (root / "configs" / "gemm.yaml").write_text(CONFIG)
    return root


def session(root: Path, *args: str) -> dict:
    """One pytest session in the project: its exit code, the gate's line, its verdicts."""
    report = root / f"report-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "pytest", "benches", "-q", "-p", "no:cacheprovider", "--device=cpu",
           "--opperf-max-regression=5%", f"--opperf-report-json={report}", "--opperf-summary=0", *args]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900)
    gate = [line for line in done.stdout.splitlines() if line.startswith("gate: ")]
    verdicts = []
    if report.exists():
        data = json.loads(report.read_text())
        verdicts = [c for c in data.get("cases", []) if c.get("verdict")]
    return {"rc": done.returncode, "gate": gate[-1] if gate else "", "verdicts": verdicts,
            "tail": done.stdout.splitlines()[-3:]}


def halved(source: Path, target: Path) -> Path:
    """The baseline with every case's time (and its runs) halved: the code reads 2x slower against it."""
    data = json.loads(source.read_text())
    for case in data["cases"]:
        for key in ("time_us", "time_us_p95"):
            if case.get(key):
                case[key] = case[key] / 2
        if case.get("runs"):
            case["runs"] = [r / 2 for r in case["runs"]]
    target.write_text(json.dumps(data, indent=1))
    return target


def count(result: dict) -> str:
    kinds = Counter(v["verdict"] for v in result["verdicts"])
    regressed = sorted((round(v["ratio"], 2) for v in result["verdicts"] if v["verdict"] == "regressed"), reverse=True)
    return f"rc {result['rc']}: {dict(kinds)}" + (f", regressed at {regressed[:6]}" if regressed else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reruns", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gate-unsteady-"))
    root = project(out / "project")
    table = []
    started = time.monotonic()
    for save in ("busy", "quiet"):
        base = root / f"base-{save}.json"
        if save == "busy":
            with Load(procs=1, seconds=900):
                saved = session(root, f"--opperf-save-baseline={base}")
        else:
            saved = session(root, f"--opperf-save-baseline={base}")
        print(f"baseline saved {save}: {saved['tail'][-1] if saved['tail'] else saved['rc']}", flush=True)
        reruns, quiet = [], []
        with Load(procs=1, seconds=1800):
            for i in range(args.reruns):
                reruns.append(session(root, f"--opperf-baseline={base}"))
                print(f"  unchanged rerun {i + 1} beside a busy process: {count(reruns[-1])}", flush=True)
            slow = session(root, f"--opperf-baseline={halved(base, root / f'half-{save}.json')}")
        print(f"  against the halved baseline, beside a busy process: {count(slow)}", flush=True)
        for i in range(args.reruns):
            quiet.append(session(root, f"--opperf-baseline={base}"))
            print(f"  unchanged rerun {i + 1}, quiet: {count(quiet[-1])}", flush=True)
        quiet_slow = session(root, f"--opperf-baseline={root / f'half-{save}.json'}")
        print(f"  against the halved baseline, quiet: {count(quiet_slow)}", flush=True)
        table.append({"save": save, "reruns": len(reruns), "unchanged_failed": sum(1 for r in reruns if r["rc"] != 0),
                      "unchanged_quiet_failed": sum(1 for r in quiet if r["rc"] != 0),
                      "halved_busy_failed": slow["rc"] != 0, "halved_quiet_failed": quiet_slow["rc"] != 0,
                      "sessions": [count(r) for r in reruns], "quiet_sessions": [count(r) for r in quiet],
                      "halved": [count(slow), count(quiet_slow)]})
    (out / "gate_unsteady.json").write_text(json.dumps(table, indent=1))
    print(f"\n{time.monotonic() - started:.0f} s; OUT {out}")
    print("| baseline saved | unchanged reruns beside a busy process: failed | unchanged reruns, quiet: failed "
          "| halved baseline, busy: run failed | halved baseline, quiet: run failed |")
    print("| --- | ---: | ---: | --- | --- |")
    for row in table:
        print(f"| {row['save']} | {row['unchanged_failed']} of {row['reruns']} | {row['unchanged_quiet_failed']} of "
              f"{row['reruns']} | {row['halved_busy_failed']} | {row['halved_quiet_failed']} |")
    ok = all(r["unchanged_failed"] == 0 and r["unchanged_quiet_failed"] == 0 and r["halved_busy_failed"]
             and r["halved_quiet_failed"] for r in table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
