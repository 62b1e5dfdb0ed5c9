"""Sharding: --opperf-shard=I/N keeps a deterministic, balanced share of the collected cases.

Every process sorts the collected test ids and deals them round-robin: shard I keeps ranks
I, I+N, I+2N, ... So each process computes the same shares from the same collection (no
coordination between hosts), the shares differ in size by at most one, and together they are
the whole set with no case in two shares. Dealing sorted ids also spreads neighbouring sizes
of a grid over the shards, so their run times balance too, where a hash would not even
balance the counts. Sharding applies after -k/-m/--lf selection: N shards of `-k gemm` split
the gemm cases.
"""

from __future__ import annotations

import pytest


def deal(nodeids: list[str], index: int, count: int) -> set[str]:
    """The ids of shard `index` of `count`.

    >>> sorted(deal(["c", "a", "b", "d", "e"], 1, 2))
    ['b', 'd']
    """
    return {nodeid for rank, nodeid in enumerate(sorted(set(nodeids))) if rank % count == index}


def apply(config: pytest.Config, items: list[pytest.Item], shard) -> None:
    """Keep this shard's items (in their order); report the others as deselected."""
    if shard is None:
        return
    index, count = shard
    mine = deal([item.nodeid for item in items], index, count)
    kept = [item for item in items if item.nodeid in mine]
    dropped = [item for item in items if item.nodeid not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
