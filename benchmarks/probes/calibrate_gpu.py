"""Measured ceilings vs the datasheet on a GPU, then the bf16 GEMM sweep against them.

1. `opperf calibrate` on the detected GPU, into a fresh results directory: copy and read
   bandwidth, GEMM TFLOP/s per dtype (bf16, fp16, fp32, fp8, int8; 4096^3 and 8192^3), the fp32
   FMA (vector) ceiling and launch overhead, each beside the datasheet figure.
2. `pytest benches/ -k "test_gemm and not rowwise and bf16"` (the bf16 and fp8->bf16 GEMMs) into
   that directory: the sweep finds the calibration and stores `mfu_attainable` beside `mfu`; the
   bf16 8192^3 row should read close to 100%.

Prints both as markdown tables and the seconds each step took; files go to $OUT (else a temp dir).

    python3 benchmarks/probes/calibrate_gpu.py                 # about a minute on an H100
    python3 benchmarks/probes/calibrate_gpu.py --skip-sweep    # the calibration alone
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from pytest_opperf.hardware import calibrate as measured
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.run.calibration import render
from pytest_opperf.store import ceilings


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("calibrate_gpu: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="opperf-calibrate-"))
    results = out / "calibrate-results"
    results.mkdir(parents=True, exist_ok=True)
    acc = hardware.detect_accelerator()
    spec = hardware.resolve_alias(hardware.load_specs(), acc.reported_name)
    if spec is None:
        spec = hardware.HardwareSpec(hardware.slug(acc.reported_name), title=acc.reported_name, backend="cuda")
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"## {acc.reported_name} ({spec.name}), torch {torch.__version__}, CUDA {torch.version.cuda}\n")

    t0 = time.perf_counter()
    cal = measured.calibrate(device, spec, acc.reported_name, print)
    calibrate_s = time.perf_counter() - t0
    db = results / f"{spec.name}.db"
    ceilings.write(db, cal.rows)
    print()
    print(render(cal))
    print(f"\ncalibration: {calibrate_s:.1f} s; environment: {json.dumps(cal.environment)}")
    (out / "calibration.json").write_text(json.dumps(cal.rows, indent=1, default=str))

    if args.skip_sweep:
        return 0
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "benches/", "-k", "test_gemm and not rowwise and bf16", "-p", "no:cacheprovider", "-q",
           f"--opperf-results={results}", "--opperf-summary=0"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / "calibrate-sweep.log").write_text(done.stdout + done.stderr)
    print(f"\n`{' '.join(cmd[2:])}`: exit {done.returncode}, {time.perf_counter() - t0:.1f} s")
    con = sqlite3.connect(db)
    rows = con.execute("select dtype_in, m, n, k, time_us, gflops, mfu, mfu_attainable, mbu, mbu_attainable "
                       "from gemm order by dtype_in, m * n * k desc, m").fetchall()
    con.close()
    print("\n| dtype | m | n | k | time_us | TFLOP/s | MFU (datasheet) | MFU (measured ceiling) | MBU | MBU (measured) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dtype, m, n, k, t, gflops, mfu, mfu_a, mbu, mbu_a in rows:
        print(f"| {dtype} | {m} | {n} | {k} | {t:.1f} | {gflops / 1e3:.1f} | {_pct(mfu)} | {_pct(mfu_a)} | "
              f"{_pct(mbu)} | {_pct(mbu_a)} |")
    print(f"\nfiles in {out}")
    return 0 if done.returncode == 0 else 1


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


if __name__ == "__main__":
    sys.exit(main())
