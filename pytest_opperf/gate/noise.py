"""Run-to-run noise: how far the median of one more run may fall from the baseline's runs.

The within-run confidence interval of a median says how well one session pinned it down; it
says nothing about the next session, where clocks, temperature, memory placement and
neighbours differ. A baseline case therefore keeps the medians of its last runs (`runs`,
oldest first; `--opperf-baseline-runs`), and the gate allows a new run's median to fall
anywhere in their 95% prediction interval:

    allowance = t(0.975, k - 1) * s * sqrt(1 + 1/k) / median(runs)

with k runs and s their sample standard deviation (normal theory for one new draw from the
same distribution). Under MIN_RUNS runs the spread cannot be estimated usefully (with two
runs, t = 12.7), so the allowance is SINGLE_RUN_FACTOR times the case's threshold, and a slowdown
beyond it is still not failed but inconclusive (unknown_noise): on a busy machine unchanged code
reads 1.5x its one-run baseline, and a team's first CI runs must not be red for that.

>>> round(prediction_rel([100.0, 101.0, 99.0]), 6)   # t(2) = 4.303, s = 1: 4.303 * 1 * sqrt(4/3) / 100
0.049687
>>> run_allowance({"time_us": 100.0}, 0.05)
(0.1, 'one run in the baseline: allowance twice the threshold until it holds 3')
>>> print(unknown_noise({"time_us": 100.0, "runs": [99.0, 101.0]}))
2 runs in the baseline: too few to tell a slowdown from the machine's run-to-run noise (save 3 or more)
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

MIN_RUNS = 3
SINGLE_RUN_FACTOR = 2.0
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


def run_allowance(entry: dict, threshold: float) -> tuple[float, str]:
    """(the run-to-run allowance of a baseline case, relative; how it was set, for the notes)."""
    runs = runs_of(entry)
    spread = prediction_rel(runs)
    if spread is None:
        count = "one run" if len(runs) == 1 else f"{len(runs)} runs"
        return SINGLE_RUN_FACTOR * threshold, (f"{count} in the baseline: allowance twice the threshold until it "
                                               f"holds {MIN_RUNS}")
    return spread, f"run-to-run allowance {spread:.1%} from {len(runs)} baseline runs"


def unknown_noise(entry: dict) -> Optional[str]:
    """Why a slowdown against this baseline case cannot be judged: it holds fewer than MIN_RUNS
    runs, so nothing says how far this machine's medians wander between sessions; None otherwise."""
    runs = runs_of(entry)
    if len(runs) >= MIN_RUNS:
        return None
    count = "one run" if len(runs) == 1 else f"{len(runs)} runs"
    return (f"{count} in the baseline: too few to tell a slowdown from the machine's run-to-run noise "
            f"(save {MIN_RUNS} or more)")
