"""Run-to-run noise: how far the median of one more run may fall from the baseline's runs.

The within-run confidence interval of a median says how well one session pinned it down; it
says nothing about the next session, where clocks, temperature, memory placement and
neighbours differ. A baseline case therefore keeps the medians of its last runs (`runs`,
oldest first; `--opperf-baseline-runs`), and the gate allows a new run's median to fall
anywhere in their 95% prediction interval:

    allowance = t(0.975, k - 1) * s * sqrt(1 + 1/k) / median(runs)

with k runs and s their sample standard deviation (normal theory for one new draw from the
same distribution). Under MIN_RUNS runs the spread cannot be estimated usefully (with two
runs, t = 12.7), so the allowance is what is known of the device kind instead: FIRST_RUNS, the
largest process-to-process change of unchanged code measured on such a device (docs/gate.md
cites the runs), or the two runs' own difference if larger. A slowdown beyond it fails
like any other, after its re-measurement: a one-run baseline is how most teams start, and a
gate that lets a 2x slowdown through is trusted and wrong. What a busy machine does to a
measurement is told apart by the contention probe and the reference kernels (rules.doubt), not
by the allowance.

>>> round(prediction_rel([100.0, 101.0, 99.0]), 6)   # t(2) = 4.303, s = 1: 4.303 * 1 * sqrt(4/3) / 100
0.049687
>>> run_allowance({"time_us": 100.0, "timer": "cuda_event"})
(0.25, 'one run in the baseline: run-to-run allowance 25% (the default of a GPU or other accelerator) until it holds 3')
>>> run_allowance({"time_us": 100.0, "runs": [70.0, 130.0], "timer": "cpu"})[0]  # their own difference: 60%
0.6
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

MIN_RUNS = 3
# The run-to-run allowance of a baseline of fewer than MIN_RUNS runs, by the kind of device its
# timer ran on; each the largest process-to-process change of unchanged code measured here, with
# room (docs/gate.md cites the runs):
# - accelerator: an H100's 342 rows timed again in a process of their own read 1.155x at most
#   (a torch_compile kernel that compiles to one of two variants), the rest within 6% (2026-11-24);
# - cpu: on a 2-core VM, 10 quiet sessions of unchanged code read 0.62-1.23x of a one-run baseline
#   in 40 judgements (2026-11-26): a VM's neighbours move its medians that far without showing in /proc.
FIRST_RUNS = {"accelerator": 0.25, "cpu": 0.50}
KIND_NAMES = {"accelerator": "a GPU or other accelerator", "cpu": "a CPU"}
MAX_RUNS = 30  # --opperf-baseline-runs at most: the t table below covers the degrees of freedom

# Two-sided 95% quantiles of Student's t by degrees of freedom (any statistics table).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045)
T975_LARGE = 2.042  # 30 degrees of freedom: a file edited by hand to hold more runs is judged a bit wider


def t975(dof: int) -> float:
    return T975[dof - 1] if dof <= len(T975) else T975_LARGE


def runs_of(entry: dict) -> list[float]:
    """The medians of a baseline case's runs, oldest first (a case saved once has just its time)."""
    return list(entry.get("runs") or [entry["time_us"]])


def reference_time(runs: Sequence[float]) -> float:
    """The time a new run is compared with: the median of the runs (one odd run does not move it)."""
    return float(statistics.median(runs))


def prediction_rel(runs: Sequence[float]) -> Optional[float]:
    """Half-width of the 95% prediction interval of one more run, relative to the runs' median."""
    k = len(runs)
    if k < MIN_RUNS:
        return None
    s = statistics.stdev(runs)
    return t975(k - 1) * s * math.sqrt(1 + 1 / k) / reference_time(runs)


def device_kind(entry: dict) -> str:
    """cpu when the case was timed by the CPU timer, else accelerator."""
    return "cpu" if entry.get("timer") == "cpu" else "accelerator"


def run_allowance(entry: dict) -> tuple[float, str]:
    """(the run-to-run allowance of a baseline case, relative; how it was set, for the notes)."""
    runs = runs_of(entry)
    spread = prediction_rel(runs)
    if spread is not None:
        return spread, f"run-to-run allowance {spread:.1%} from {len(runs)} baseline runs"
    kind = device_kind(entry)
    allowance, how = FIRST_RUNS[kind], f"the default of {KIND_NAMES[kind]}"
    if len(runs) > 1:
        apart = (max(runs) - min(runs)) / reference_time(runs)
        if apart > allowance:
            allowance, how = apart, f"the difference between its {len(runs)} runs"
    count = "one run" if len(runs) == 1 else f"{len(runs)} runs"
    return allowance, (f"{count} in the baseline: run-to-run allowance {allowance:.0%} ({how}) until it holds "
                       f"{MIN_RUNS}")
