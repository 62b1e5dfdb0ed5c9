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

# A row is unstable when its median does not reproduce. Within one case, the proxy is the drift:
# the second half's median over the first's (the samples in the order taken), less 1. The bound is
# the acceptance's: two runs of a row are compared at 3% (DESIGN.md, "Beyond one machine"), and the
# halves are two repeats of the case within the run. Chance alone moves them apart by about
# 2.5 cv / sqrt(n) (each half's median has a standard error of 1.25 std / sqrt(n / 2)): 0.5% for a
# kernel's 100 samples at cv 0.02, far inside 3%; a short, wide stream (10 samples, cv 0.15: 12%)
# is flagged by chance, and rightly, as its median would not reproduce within 3% either.
UNSTABLE_DRIFT = 0.03
MIN_DRIFT_SAMPLES = 4  # halves of 2 samples at least; fewer: no drift (NULL), never unstable
MIN_FENCE_REL = 0.25  # the far-out fences stand at least this share of the median beyond the quartiles


class Stats:
    """Computed properties over timing samples (microseconds)."""

    def __init__(self, samples: Sequence[float]):
        """samples: in the order taken (drift reads that order); `data` holds them sorted."""
        if not samples:
            raise ValueError("no samples")
        self.ordered = [float(x) for x in samples]
        self.data = sorted(self.ordered)

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
        """std / mean of every sample (a row's `cv` is steady.cv: without the outliers)."""
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

    @cached_property
    def fences(self) -> tuple[float, float]:
        """Tukey's far-out fences: 3 interquartile ranges beyond the quartiles (what Criterion.rs
        calls severe outliers). A sample beyond them is an interruption (a process group's
        watchdog, a rank descheduled, an interrupt), not the spread of the thing timed. With fewer
        than 4 samples there are no quartiles to speak of: no fences. The fences stand at least
        MIN_FENCE_REL of the median beyond the quartiles: a timer of coarse resolution (CUDA events,
        0.5 us) can give most samples one value, an interquartile range of 0, and every sample one
        tick away would be an "interruption".

        >>> Stats([2.5] * 8 + [3.0] * 2).outliers, Stats([2.5] * 8 + [30.0] * 2).outliers
        (0, 2)
        """
        if self.n < 4:
            return -math.inf, math.inf
        q1, q3 = percentile(self.data, 25.0), percentile(self.data, 75.0)
        reach = max(3 * (q3 - q1), MIN_FENCE_REL * self.median)
        return q1 - reach, q3 + reach

    @cached_property
    def steady(self) -> "Stats":
        """The samples within the fences: the steady state, whose cv is a row's `cv`. The others are
        counted apart (outliers, outlier_share, outlier_us), not blended in.

        >>> s = Stats([10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 60.0])
        >>> s.steady.n, s.outliers, round(s.steady.cv, 3), round(s.cv, 2)
        (6, 1, 0.014, 1.1)
        """
        low, high = self.fences
        return Stats([x for x in self.ordered if low <= x <= high])

    @property
    def outliers(self) -> int:
        """How many samples lie beyond the fences."""
        return self.n - self.steady.n

    @property
    def outlier_share(self) -> float:
        """The outliers' fraction of the samples."""
        return self.outliers / self.n

    @cached_property
    def outlier_us(self) -> Optional[float]:
        """The outliers' typical size: the median of their distance from the median, microseconds
        (positive: slower); None without outliers.

        >>> Stats([10.0] * 9 + [23.0]).outlier_us
        13.0
        """
        low, high = self.fences
        outside = sorted(x - self.median for x in self.data if not low <= x <= high)
        return percentile(outside, 50.0) if outside else None

    @cached_property
    def drift(self) -> Optional[float]:
        """The median of the later half of the samples (in the order taken) over the earlier half's,
        less 1 (the middle sample of an odd count in neither); None under MIN_DRIFT_SAMPLES.

        >>> round(Stats([10.0] * 50 + [11.0] * 50).drift, 3), Stats([10.0, 12.0] * 50).drift
        (0.1, 0.0)
        """
        if self.n < MIN_DRIFT_SAMPLES:
            return None
        half = self.n // 2
        first = percentile(sorted(self.ordered[:half]), 50.0)
        second = percentile(sorted(self.ordered[-half:]), 50.0)
        return second / first - 1.0 if first > 0 else None

    @property
    def unstable(self) -> bool:
        """The median does not reproduce: is_unstable(drift)."""
        return is_unstable(self.drift)


def is_unstable(drift: Optional[float]) -> bool:
    """The one definition of a row's `unstable`: its halves' medians differ beyond UNSTABLE_DRIFT.

    >>> is_unstable(0.1), is_unstable(-0.031), is_unstable(0.03), is_unstable(None)
    (True, True, False, False)
    """
    return drift is not None and abs(drift) > UNSTABLE_DRIFT


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
