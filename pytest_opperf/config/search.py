"""A budgeted search of a knob grid too large to sweep: a seeded random sample of it.

    backends:
      triton:
        knobs: {BLOCK_SIZE: {min: 1024, max: 65536, mul: 2}, num_warps: [1, 2, 4, 8, 16, 32]}
        constraints: ["block_size >= n"]
        search: {samples: 12, seed: 0, budget: 30}

Per shape, the search draws distinct knob combinations uniformly from the grid (never listing
it: an index in the mixed-radix grid is drawn, then decoded), keeps those that satisfy the
backend's constraints, and stops at `samples` of them. The draw is seeded by the search's seed
and the shape, so the same config collects the same cases in every process and every run;
another seed is another sample. The cases are collected in the order drawn, so a `budget`
(seconds of this shape's cases, per process; its clock runs in run/budgets.py) that runs out
skips a random remainder, not the large blocks or the many warps.

Why random and not successive halving: collection happens before anything runs, so the set of
cases must be fixed up front (xdist workers and shards collect it on their own and must agree);
halving decides its later rounds from the earlier rounds' times, which pytest's collection cannot
express without running a session per round. And a case's sampling already stops adaptively on
its own precision target, which is what halving's short early rounds buy. Random search is as
good as a grid where a few knobs matter and the rest barely do (Bergstra and Bengio, JMLR 2012):
60 draws hit the best 5% of a space with probability 1 - 0.95**60 = 95%.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from pytest_opperf.files import short

METHODS = ("random",)
SEARCH_KEYS = {"method", "samples", "seed", "budget"}
# Distinct combinations tried per shape before giving up on finding `samples` allowed ones.
TRIES_PER_SAMPLE = 50


class SearchSpecError(ValueError):
    """A bad `search:` mapping; `field` is the key under it (".samples"), or "" for the mapping."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class RandomSearch:
    samples: int
    seed: int = 0
    budget_s: Optional[float] = None  # seconds of one shape's cases, per process; None: no limit
    method: str = "random"

    def sample(self, knobs: tuple, group: str, allowed: Callable[[tuple], bool]) -> Iterator[tuple]:
        """Up to `samples` distinct allowed knob combinations ((name, value), ...), in draw order.

        >>> list(RandomSearch(2, seed=1).sample((("b", (1, 2, 3)),), "g", lambda k: True))  # doctest: +SKIP
        [(('b', 3),), (('b', 1),)]
        """
        names = [k for k, _ in knobs]
        axes = [v for _, v in knobs]
        size = math.prod(len(v) for v in axes)
        rng = random.Random(zlib.crc32(f"{self.seed}/{group}".encode()))
        found = 0
        # random.sample on a range draws without listing it, even for 10**12 combinations.
        for index in rng.sample(range(size), min(size, self.samples * TRIES_PER_SAMPLE)):
            combo = tuple(zip(names, _decode(index, axes)))
            if allowed(combo):
                yield combo
                found += 1
                if found == self.samples:
                    return


def _decode(index: int, axes: list) -> list:
    """The index-th combination of the grid, the last knob varying fastest (itertools.product's order)."""
    values = []
    for axis in reversed(axes):
        index, i = divmod(index, len(axis))
        values.append(axis[i])
    return values[::-1]


def parse(spec: Any) -> Optional[RandomSearch]:
    """A backend's `search:` mapping, or None without one; SearchSpecError names the bad field."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise SearchSpecError("", f"expected a mapping {{samples: N, seed: S, budget: SECONDS}}, got {short(spec)}")
    unknown = sorted(set(map(str, spec)) - SEARCH_KEYS)
    if unknown:
        raise SearchSpecError(f".{unknown[0]}", f"unknown key; expected one of {sorted(SEARCH_KEYS)}")
    method = spec.get("method", "random")
    if method not in METHODS:
        raise SearchSpecError(".method", f"expected one of {list(METHODS)}, got {short(method)}")
    samples = spec.get("samples")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise SearchSpecError(".samples", f"expected the number of knob combinations to try per shape (an int >= 1), "
                                          f"got {short(samples)}")
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SearchSpecError(".seed", f"expected an int, got {short(seed)}")
    budget = spec.get("budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not 0 < budget < math.inf):
        raise SearchSpecError(".budget", f"expected seconds > 0, got {short(budget)}")
    return RandomSearch(samples, seed, None if budget is None else float(budget), method)
