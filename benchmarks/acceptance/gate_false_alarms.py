"""Does the gate cry wolf, and does it still catch a slowdown?

In a throw-away project, an `add` and a `gemm` backend named `steady` do the op and then the
same kind of work on a slice of OPPERF_SLOWDOWN of it (a slice of the add; the first rows of
the GEMM): real extra work, no sleep. With the plugin's defaults (threshold 5%, rule ci, one
re-measurement, keep 5 runs):

1. --baseline-runs sessions save the baseline (each appends a run);
2. --reruns sessions of unchanged code are gated against it: every `regressed` verdict is a
   false alarm (cases the re-measurement cleared are counted apart);
3. for each of --slowdowns, --slow-reruns sessions with the slowed backend: the share of
   judgements that fail is the catch rate. The slowdown each really caused is measured too
   (median over cases of the slowed time over the baseline's), since a slice's extra launch
   costs more than its share of the work on small kernels.

With --load, the reruns of step 2 run beside a competing load (load.py: one busy process per
core, --load-procs to choose): none may fail, and the rows measured under it should be flagged
`contended` (their verdict `inconclusive`); the baseline and the slowed sessions run without it,
so the machine must be quiet for them. Issue 28's CPU acceptance (about 4 minutes):

    python3 benchmarks/acceptance/gate_false_alarms.py --out out/contention --reruns 20 --load --slowdowns 1.0

Issue 45's (a baseline of one run judges: a 2x slowdown fails, unchanged code under load does not):

    python3 benchmarks/acceptance/gate_false_alarms.py --baseline-runs 1 --reruns 10 --slowdowns 0.10,1.0
    python3 benchmarks/acceptance/gate_false_alarms.py --baseline-runs 1 --reruns 5 --load --slowdowns 1.0

Writes OUT/gate_false_alarms.json and the per-session JSON reports under OUT (OUT: --out, else
$OUT, else a temporary directory), and prints a markdown table last.

    python3 benchmarks/acceptance/gate_false_alarms.py                       # CPU, about 3-4 minutes
    python3 benchmarks/acceptance/gate_false_alarms.py --device=h100         # CUDA, about 3-4 minutes
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from load import Load

CONFTEST = '''
import os

import torch

from pytest_opperf import register_backend

_scratch = {}
if not torch.cuda.is_available():
    # One thread per session: on a shared CPU, a thread pool per process oversubscribes the cores
    # and the medians then move with every neighbour.
    torch.set_num_threads(1)


def _extra(name, shape, like):
    key = (name, shape, like.dtype, like.device)
    if key not in _scratch:
        _scratch[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return _scratch[key]


def _fraction():
    return float(os.environ.get("OPPERF_SLOWDOWN", "0") or 0)


@register_backend("add", "steady")
def add_steady(a, b):
    out = torch.add(a, b)
    k = round(_fraction() * a.shape[0])
    if k:  # the same elementwise add on a slice of the input: extra work of the same kind
        torch.add(a[:k], b[:k], out=_extra("add", (k,), a))
    return out


@register_backend("gemm", "steady")
def gemm_steady(a, b):
    out = torch.matmul(a, b)
    k = round(_fraction() * a.shape[0])
    if k:  # the first rows again: the same GEMM kernel family on a share of the FLOPs
        torch.matmul(a[:k], b, out=_extra("gemm", (k, b.shape[1]), out))
    return out
'''

BENCH = '''
def test_add(backend, inputs, bench):
    bench(backend, *inputs)


def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)
'''

# Sizes long enough that a slice's launch is a small part of the slowdown.
CONFIGS = {
    "cpu": {"add": "backend: steady\ndtypes: fp32\nparams:\n  N: [1048576, 4194304]\n",
            "gemm": "backend: steady\ndtypes: fp32\nparams:\n  M: [256, 512]\n  N: [512]\n  K: [512]\n"},
    "gpu": {"add": "backend: steady\ndtypes: bf16\nparams:\n  N: [16777216, 67108864, 268435456]\n",
            "gemm": "backend: steady\ndtypes: bf16\nparams:\n  M: [4096, 8192]\n  N: [8192]\n  K: [8192]\n"},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: $OUT, else a temp dir)")
    parser.add_argument("--device", default="", help="as pytest --device (default: detected)")
    parser.add_argument("--baseline-runs", type=int, default=3, help="sessions that save the baseline")
    parser.add_argument("--reruns", type=int, default=10, help="sessions of unchanged code gated")
    parser.add_argument("--slow-reruns", type=int, default=3, help="sessions per slowdown")
    parser.add_argument("--slowdowns", default="0.05,0.10,0.30")
    parser.add_argument("--budget", default="0.3", help="--opperf-budget per case (seconds)")
    parser.add_argument("--load", action="store_true", help="rerun unchanged code beside a busy process per core")
    parser.add_argument("--load-procs", type=int, default=None, help="busy processes of --load (default: one per core)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest options, after --")
    args = parser.parse_args()
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="gate_")))
    out.mkdir(parents=True, exist_ok=True)

    import torch

    kind = "gpu" if torch.cuda.is_available() else "cpu"
    project = out / "project"
    (project / "benches").mkdir(parents=True, exist_ok=True)
    (project / "configs").mkdir(exist_ok=True)
    (project / "conftest.py").write_text(CONFTEST)
    (project / "benches" / "test_ops.py").write_text(BENCH)
    for op, text in CONFIGS[kind].items():
        (project / "configs" / f"{op}.yaml").write_text(text)
    baseline = out / "baseline.json"
    baseline.unlink(missing_ok=True)

    command = [sys.executable, "-m", "pytest", "benches", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               "--opperf-sample-only", f"--opperf-budget={args.budget}", *args.pytest_args]
    command += [f"--device={args.device}"] if args.device else []
    started = time.monotonic()

    def session(label: str, slowdown: float, *extra: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "OPPERF_SLOWDOWN": str(slowdown)}
        done = subprocess.run([*command, *extra], cwd=project, env=env, capture_output=True, text=True)
        (out / f"{label}.log").write_text(done.stdout + done.stderr)
        if done.returncode not in (0, 1):
            print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{label}: pytest exited {done.returncode} (log in {out / (label + '.log')})")
        return done

    for i in range(args.baseline_runs):
        session(f"baseline{i}", 0.0, f"--opperf-save-baseline={baseline}")

    groups = [("unchanged", 0.0, args.reruns)]
    groups += [(f"slowed {float(s):.0%}", float(s), args.slow_reruns) for s in args.slowdowns.split(",") if s]
    results = []
    for name, slowdown, count in groups:
        reports = []
        loaded = args.load and slowdown == 0.0
        for i in range(count):
            report = out / f"{name.replace(' ', '_').replace('%', 'pct')}_{i}.json"
            gate = (f"--opperf-baseline={baseline}", f"--opperf-report-json={report}")
            if loaded:
                with Load(args.load_procs, seconds=600):
                    session(report.stem, slowdown, *gate)
            else:
                session(report.stem, slowdown, *gate)
            reports.append(json.loads(report.read_text()))
        results.append({**tally(name, slowdown, reports), "load": loaded})

    base = json.loads(baseline.read_text())
    summary = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(), "processor": platform.processor() or platform.machine(),
        "device": torch.cuda.get_device_name() if kind == "gpu" else "cpu", "torch": torch.__version__,
        "cases": len(base["cases"]), "baseline_runs": args.baseline_runs, "budget_s": args.budget,
        "wall_s": round(time.monotonic() - started, 1), "groups": results,
        "load_procs": (args.load_procs or os.cpu_count()) if args.load else 0,
    }
    (out / "gate_false_alarms.json").write_text(json.dumps(summary, indent=2) + "\n")

    print(f"\n{summary['date']}, {summary['device']} ({summary['processor']}), torch {summary['torch']}: "
          f"{summary['cases']} cases, baseline of {args.baseline_runs} runs, defaults (5%, rule ci, confirm 1); "
          f"{summary['wall_s']} s; files in {out}\n")
    print("| sessions | slowdown asked | slowdown measured (median) | judgements | failed (regressed) | "
          "cleared by re-measurement | noisy | rows contended | inconclusive | catch rate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        measured = "-" if r["measured_slowdown"] is None else f"{r['measured_slowdown']:+.1%}"
        rate = "-" if not r["slowdown"] else f"{r['failed'] / r['judged']:.0%}" if r["judged"] else "-"
        name = r["name"] + (" under load" if r["load"] else "")
        print(f"| {r['sessions']} x {name} | {r['slowdown']:.0%} | {measured} | {r['judged']} | {r['failed']} | "
              f"{r['cleared']} | {r['noisy']} | {r['contended']} of {r['rows']} | {r['inconclusive']} | {rate} |")
    unchanged = results[0]
    ok = unchanged["failed"] == 0
    print(f"\nfalse alarms: {unchanged['failed']} in {unchanged['judged']} judgements of unchanged code"
          + ("" if ok else "  <-- the gate cried wolf"))
    if args.load:
        flagged = unchanged["contended"] == unchanged["rows"]
        print(f"rows under load flagged contended: {unchanged['contended']} of {unchanged['rows']}"
              + ("" if flagged else "  <-- contention missed"))
        ok = ok and flagged
    return 0 if ok else 1


def tally(name: str, slowdown: float, reports: list[dict]) -> dict:
    """Counts over the sessions of one group: judged cases, failures, clearances, the slowdown caused."""
    judged = [c for r in reports for c in r["cases"] if c["verdict"] not in (None, "new", "incomparable")]
    # The rows keep what the sweep measured in its turn: their ratio to the baseline is the real slowdown.
    ratios = [c["p50_us"] / c["baseline_p50_us"] for c in judged if c["baseline_p50_us"]]
    every = [c for r in reports for c in r["cases"]]
    return {"name": name, "slowdown": slowdown, "sessions": len(reports), "judged": len(judged),
            "rows": len(every), "contended": sum(bool(c.get("contended")) for c in every),
            "inconclusive": sum(c["verdict"] == "inconclusive" for c in judged),
            "failed": sum(c["verdict"] == "regressed" for c in judged),
            "cleared": sum(c.get("confirm") == "cleared" for c in judged),
            "noisy": sum(c["verdict"] == "noisy" for c in judged),
            "measured_slowdown": statistics.median(ratios) - 1 if ratios else None,
            "max_ratio": max(ratios) if ratios else None}


if __name__ == "__main__":
    sys.exit(main())
