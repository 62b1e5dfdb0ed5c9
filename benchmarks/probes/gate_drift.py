"""How often would the gate fail unchanged code? Run-to-run drift per rule and threshold.

Takes a baseline with one session, reruns the same cases --reruns times (nothing changed, so every
`regressed` verdict is a false alarm), and judges every rerun against the baseline under each rule
and threshold. Writes DIR/gate_drift.json and prints a table last.

    python3 benchmarks/probes/gate_drift.py --out out/drift -k "gemm and bf16" --device=h100
    python3 benchmarks/probes/gate_drift.py --out out/drift -k "add and fp32" --reruns 3    # on a CPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pytest_opperf.gate.baseline import Baseline, case_key
from pytest_opperf.gate.rules import RULES, judge
from pytest_opperf.measure.stats import percentile

THRESHOLDS = (0.02, 0.05, 0.10, 0.20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the baseline, reports and the JSON")
    parser.add_argument("--reruns", type=int, default=5)
    parser.add_argument("-k", default="", help="pytest -k expression selecting the cases")
    parser.add_argument("--device", default="", help="as pytest --device")
    parser.add_argument("--benches", default="benches")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base_file = args.out / "baseline.json"
    base_file.unlink(missing_ok=True)

    common = [sys.executable, "-m", "pytest", args.benches, "-q", "-p", "no:randomly", "--opperf-sample-only"]
    common += ["-k", args.k] if args.k else []
    common += [f"--device={args.device}"] if args.device else []
    subprocess.run([*common, f"--opperf-save-baseline={base_file}"], check=True)
    baseline = Baseline.load(base_file)

    runs = []
    for i in range(args.reruns):
        report = args.out / f"rerun{i}.json"
        # Exit status 1 is expected when the default rule flags drift; the reports are what count.
        subprocess.run([*common, f"--opperf-baseline={base_file}", f"--opperf-report-json={report}"])
        runs.append(json.loads(report.read_text()))

    ratios, alarms = [], {(r, t): 0 for r in RULES for t in THRESHOLDS}
    judged = 0
    for run in runs:
        for case in run["cases"]:
            new = {"op": case["op"], "backend": case["backend"], "dtype_in": case["dtype_in"],
                   "dtype_out": case["dtype_out"], "params": case["params"],
                   "knobs": json.loads(case["knobs"]) if case["knobs"] else {},
                   "time_us": case["p50_us"], "ci_rel": case["ci_rel"], "cv": case["cv"], "samples": case["samples"],
                   "timer": case["timer"], "cache": case["cache"]}
            base = baseline.entries.get(case_key(new))
            if base is None:
                continue
            judged += 1
            ratios.append(new["time_us"] / base["time_us"])
            for rule in RULES:
                for t in THRESHOLDS:
                    alarms[(rule, t)] += judge(base, new, t, rule)["verdict"] == "regressed"

    drift = sorted(abs(r - 1) for r in ratios)
    result = {
        "cases": len(baseline.entries), "reruns": args.reruns, "judged": judged,
        "drift_abs_p50": percentile(drift, 50) if drift else None,
        "drift_abs_p95": percentile(drift, 95) if drift else None,
        "drift_abs_max": drift[-1] if drift else None,
        "false_regressions": {f"{r}@{t:g}": n for (r, t), n in alarms.items()},
        "environment": runs[0]["environment"] if runs else None,
    }
    (args.out / "gate_drift.json").write_text(json.dumps(result, indent=2) + "\n")

    print(f"\n{judged} judgements ({len(baseline.entries)} cases x {args.reruns} reruns) of unchanged code")
    if drift:
        print(f"|ratio - 1|: p50 {result['drift_abs_p50']:.2%}, p95 {result['drift_abs_p95']:.2%}, "
              f"max {result['drift_abs_max']:.2%}")
    print(f"{'rule':<10} " + " ".join(f"{f'max {t:.0%}':>9}" for t in THRESHOLDS) + "   (false regressions)")
    for rule in RULES:
        print(f"{rule:<10} " + " ".join(f"{alarms[(rule, t)]:>9}" for t in THRESHOLDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
