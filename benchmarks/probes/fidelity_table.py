"""Markdown tables from the JSON that timer_fidelity.py writes (for docs/benchmarks.md).

    python benchmarks/probes/fidelity_table.py OUT/fidelity.json
"""

from __future__ import annotations

import json
import sys

TIMERS = ("cuda_graph", "event", "cpu", "do_bench")


def within_target(err: float, ref_us: float) -> bool:
    """The issue's target: within 3% or 0.2 us of kernel time, whichever is larger."""
    return abs(err) * ref_us <= max(0.03 * ref_us, 0.2)


def main(path: str) -> None:
    report = json.load(open(path))
    print(f"{report['date']}, {report['device']}, torch {report['torch']}, triton {report.get('triton', '-')}, "
          f"L2 {report['l2_bytes'] / 1e6:.0f} MB\n")
    if "fidelity" in report:
        print("| kernel | cache | profiler (kernel time) us | " + " | ".join(TIMERS) + " |")
        print("| --- | --- | ---: | " + " | ".join("---:" for _ in TIMERS) + " |")
        for row in report["fidelity"]:
            cells = []
            for name in TIMERS:
                err = row.get(f"{name}_err")
                if err is None:
                    cells.append("-")
                    continue
                mark = "" if within_target(err, row["profiler_us"]) else " x"
                cells.append(f"{err:+.1%}{mark}")
            print(f"| {row['kernel']} | {row['cache']} | {row['profiler_us']:.2f} | " + " | ".join(cells) + " |")
        print("\n(x: outside 3% / 0.2 us of kernel time)\n")
    s = report["sweep"]
    print(f"Sweep of {s['cases']} cases (kernels >= 20 us), 1% target: median harness wall time "
          f"{s['median_wall_ms']:.1f} ms/case for the {report.get('sweep_timer', 'default')} timer, do_bench {s['do_bench_median_wall_ms']:.1f} ms/case"
          + (f", profiler timer {report['sweep_profiler_median_wall_ms']:.1f} ms/case (median time ratio "
             f"profiler/default {report['sweep_profiler_vs_default']:.4f})" if "sweep_profiler_median_wall_ms" in report else "")
          + f"; target met {s['met']}/{s['cases']}. Repeat of the sweep: median |diff| {s['repeat_median_diff']:.2%}, "
          f"{s['repeat_within_1pct']}/{s['cases']} cases within 1%, max {s['repeat_max_diff']:.1%}.")


if __name__ == "__main__":
    main(sys.argv[1])
