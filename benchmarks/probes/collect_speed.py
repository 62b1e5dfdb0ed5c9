"""Collection of a large grid against pytest's own floor, in the same run.

    python3 benchmarks/probes/collect_speed.py [--cases 100000] [--repeats 3] [--out DIR]

Two throw-away projects of the same number of cases, collected with `pytest --collect-only -q`
in fresh processes, alternately, `--repeats` times each:
- opperf: one bench test (`test_gemm(backend, inputs, bench)`) and a gemm config whose grid
  is M x N x K (50 x 50 x 40 for 100k cases), one backend, one dtype;
- floor: pytest alone (`-p no:opperf`) collecting one test parametrized over as many integers.
Prints a markdown table (median of the repeats: pytest's own "collected in" time, the process's
wall time, and its CPU time, which a loaded machine does not inflate) and the ratios opperf /
floor (target <= 1.3 on pytest's count). The opperf process also imports torch (the floor does
not): that shows in wall and CPU, not in pytest's count. Writes the table to
$OUT/collect_speed.md (or --out, else a temporary directory). Runs on a CPU: no device is used.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = "def test_gemm(backend, inputs, bench):\n    bench(backend, *inputs)\n"
FLOOR = ("import pytest\n\n\n@pytest.mark.parametrize('case', range({n}))\n"
         "def test_floor(case):\n    pass\n")


def grid(cases: int) -> tuple[int, int, int]:
    """Three axis lengths whose product is the case count (50 x 50 x 40 for 100k)."""
    for m in range(50, 0, -1):
        if cases % (m * m) == 0:
            return m, m, cases // (m * m)
    return cases, 1, 1


def make_projects(root: Path, cases: int) -> tuple[Path, Path]:
    m, n, k = grid(cases)
    opperf = root / "opperf"
    (opperf / "benches").mkdir(parents=True)
    (opperf / "configs").mkdir()
    (opperf / "benches" / "test_ops.py").write_text(BENCH)
    (opperf / "configs" / "gemm.yaml").write_text(
        "backend: torch\ndtypes: [fp32]\nparams:\n"
        f"  M: {{min: 16, max: {16 * m}, step: 16}}\n"
        f"  N: {{min: 16, max: {16 * n}, step: 16}}\n"
        f"  K: {{min: 16, max: {16 * k}, step: 16}}\n")
    floor = root / "floor"
    floor.mkdir()
    (floor / "test_floor.py").write_text(FLOOR.format(n=cases))
    return opperf, floor


def collect(project: Path, args: list[str], cases: int) -> tuple[float, float, float]:
    """(pytest's 'collected in' seconds, wall seconds, CPU seconds) of one --collect-only run.

    CPU seconds (user + system of the child) are what a shared, loaded machine does not inflate."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=project, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = done.stdout + done.stderr
    found = re.search(r"(\d+) tests? collected in ([\d.]+)s", text)
    if done.returncode != 0 or not found or int(found.group(1)) != cases:
        raise SystemExit(f"collection in {project} failed (exit {done.returncode}):\n{text[-3000:]}")
    return float(found.group(2)), wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="collect-speed-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="collect-speed-") as tmp:
        opperf, floor = make_projects(Path(tmp), args.cases)
        runs = {"opperf": [], "floor": []}
        for _ in range(args.repeats):
            runs["floor"].append(collect(floor, ["-p", "no:opperf"], args.cases))
            runs["opperf"].append(collect(opperf, ["--device=cpu", f"--opperf-max-cases={args.cases}"], args.cases))
    med = {name: [statistics.median(r[i] for r in rs) for i in range(3)] for name, rs in runs.items()}
    lines = [f"{args.cases} cases, median of {args.repeats} runs each, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "", "| collection | pytest's count (s) | wall (s) | CPU of the process (s) |",
             "| --- | ---: | ---: | ---: |"]
    for name in ("floor", "opperf"):
        lines.append(f"| {name} | {med[name][0]:.2f} | {med[name][1]:.2f} | {med[name][2]:.2f} |")
    lines.append("| opperf / floor | " + " | ".join(f"{med['opperf'][i] / med['floor'][i]:.2f}x" for i in range(3))
                 + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "collect_speed.md").write_text(text)
    print(f"written to {out / 'collect_speed.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
