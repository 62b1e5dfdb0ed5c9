"""Sharding: --opperf-shard=I/N keeps a deterministic share of the collected cases, balanced by time.

Every process weighs the collected test ids by their recorded seconds (run/durations.py: the
results database, or --opperf-durations=FILE) and deals them longest first, each to the share
with the least time so far (longest-processing-time-first; ties go to the lower share, and
equal times to the lower test id). A case without history weighs the median of those with one.
Each process computes the same shares from the same collection and the same history (no
coordination between hosts): together they are the whole set, with no case in two shares.
Without any history every case weighs the same, and the deal is today's count balance: sorted
ids dealt round-robin, so shares differ in size by at most one. Sharding applies after
-k/-m/--lf selection: N shards of `-k gemm` split the gemm cases.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pytest


def lpt(weights: dict[str, float], bins: int, sizes: Optional[Sequence[int]] = None) -> list[list[str]]:
    """Longest-processing-time-first: the ids, heaviest first (equal weights: by id), each into the
    bin with the least weight so far (ties: the lower bin); `sizes` caps how many ids a bin takes.

    >>> lpt({"a": 5, "b": 4, "c": 3, "d": 3, "e": 1}, 2)
    [['a', 'd'], ['b', 'c', 'e']]
    >>> lpt({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, 2)   # equal weights: round-robin of sorted ids
    [['a', 'c', 'e'], ['b', 'd']]
    """
    out: list[list[str]] = [[] for _ in range(bins)]
    load = [0.0] * bins
    for test_id in sorted(weights, key=lambda t: (-weights[t], t)):
        open_bins = [b for b in range(bins) if sizes is None or len(out[b]) < sizes[b]]
        b = min(open_bins, key=lambda i: (load[i], i))
        out[b].append(test_id)
        load[b] += weights[test_id]
    return out


def share(weights: dict[str, float], index: int, count: int) -> set[str]:
    """The ids of shard `index` of `count`, balanced by their weights (seconds)."""
    return set(lpt(weights, count)[index])


def apply(config: pytest.Config, items: list[pytest.Item], shard, weights: dict[str, float]) -> None:
    """Keep this shard's items (in their order); report the others as deselected.
    weights: seconds per test id of every item (durations.estimate)."""
    if shard is None:
        return
    index, count = shard
    mine = share(weights, index, count)
    kept = [item for item in items if item.nodeid in mine]
    dropped = [item for item in items if item.nodeid not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
