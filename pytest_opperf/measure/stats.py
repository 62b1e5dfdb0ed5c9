"""Sample statistics and the rule that decides when to stop sampling.

>>> s = Stats([1.0, 2.0, 3.0, 4.0, 100.0])
>>> s.median, s.mean, round(s.p95, 2)
(3.0, 22.0, 80.8)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

UNSTABLE_CV = 0.15  # seed 002: a CV above this needs a look


class Stats:
    """Computed properties over timing samples (microseconds)."""

    def __init__(self, samples: Sequence[float]):
        if not samples:
            raise ValueError("no samples")
        self.data = sorted(float(x) for x in samples)

    @property
    def n(self) -> int:
        return len(self.data)

    @property
    def min(self) -> float:
        return self.data[0]

    @property
    def max(self) -> float:
        return self.data[-1]

    @cached_property
    def mean(self) -> float:
        return math.fsum(self.data) / self.n

    @cached_property
    def median(self) -> float:
        return percentile(self.data, 50.0)

    @cached_property
    def p95(self) -> float:
        return percentile(self.data, 95.0)

    @cached_property
    def std(self) -> float:
        """Sample standard deviation (n - 1); 0 for one sample."""
        if self.n < 2:
            return 0.0
        m = self.mean
        return math.sqrt(math.fsum((x - m) ** 2 for x in self.data) / (self.n - 1))

    @property
    def cv(self) -> float:
        return self.std / self.mean if self.mean > 0 else 0.0

    @cached_property
    def median_ci_rel(self) -> float:
        """Half-width of the ~95% confidence interval of the median, relative to the median.

        Distribution-free (order statistics): ranks n/2 -+ 1.96*sqrt(n)/2. Infinite while
        n is too small for the interval to exist (n < 8).
        """
        lo, hi = median_ci(self.data)
        if lo is None or self.median <= 0:
            return math.inf
        return (hi - lo) / 2.0 / self.median

    @property
    def unstable(self) -> bool:
        return self.cv > UNSTABLE_CV

    def fenced(self) -> tuple["Stats", int]:
        """(the samples within Tukey's far-out fences, how many lie outside them).

        The fences are 3 interquartile ranges beyond the quartiles (what Criterion.rs calls severe
        outliers): a sample there is an interruption (a rank descheduled, an interrupt), not the
        spread of the thing timed. Its statistics describe the steady state; the outside samples
        are counted, not blended in.

        >>> inside, out = Stats([10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 60.0]).fenced()
        >>> inside.n, out, round(inside.cv, 3)
        (6, 1, 0.014)
        """
        if self.n < 4:
            return self, 0
        q1, q3 = percentile(self.data, 25.0), percentile(self.data, 75.0)
        low, high = q1 - 3 * (q3 - q1), q3 + 3 * (q3 - q1)
        inside = [x for x in self.data if low <= x <= high]
        return Stats(inside), self.n - len(inside)


def percentile(sorted_data: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_data:
        raise ValueError("no data")
    pos = (len(sorted_data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_data) - 1)
    return sorted_data[lo] + (sorted_data[hi] - sorted_data[lo]) * (pos - lo)


def median_ci(sorted_data: Sequence[float], z: float = 1.96) -> tuple[Optional[float], Optional[float]]:
    """The order statistics bounding the median's ~95% CI, or (None, None) when n is too small.

    >>> median_ci([float(i) for i in range(1, 101)])   # ranks 50.5 -+ 9.8 -> 40 and 61
    (40.0, 61.0)
    """
    n = len(sorted_data)
    half = z * math.sqrt(n) / 2.0
    j = math.floor(n / 2.0 - half)  # 1-based ranks
    k = math.ceil(n / 2.0 + half) + 1
    if j < 1 or k > n:
        return None, None
    return sorted_data[j - 1], sorted_data[k - 1]


@dataclass(frozen=True)
class StoppingRule:
    """Sample until the median is known to target_rel, within a time budget.

    Stop when at least min_samples are in and the median's CI half-width is within
    target_rel, or when budget_s has been spent (and min_samples are in), or at
    max_samples. `met` tells whether the precision target was reached.
    """

    target_rel: float = 0.01
    min_samples: int = 10
    max_samples: int = 10_000
    budget_s: float = 1.0

    def __post_init__(self):
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(f"StoppingRule: need 1 <= min_samples <= max_samples, got {self.min_samples} and "
                             f"{self.max_samples}")

    def done(self, stats: Optional[Stats], elapsed_s: float) -> bool:
        if stats is None or stats.n < self.min_samples:
            return False
        return self.met(stats) or elapsed_s >= self.budget_s or stats.n >= self.max_samples

    def met(self, stats: Stats) -> bool:
        return stats.n >= self.min_samples and stats.median_ci_rel <= self.target_rel
