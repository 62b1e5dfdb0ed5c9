"""The order xdist hands the cases out in: the longest first, by the times recorded before.

Under -n, pytest-xdist's controller hands each worker the cases in the order of the workers'
collection (the items after pytest_collection_modifyitems), so the workers arrange them here
before xdist sees them. Longest-processing-time-first is what a dynamic dispatcher needs to
end all workers together: a long case started last keeps one worker busy while the others
idle. Each of xdist's strategies gets the order that gives it that:

    load       its first hand-out gives every worker a block of consecutive cases (a quarter of
               its share, --maxschedchunk at most); those blocks are balanced by time, the rest
               follow longest first, handed to whichever worker runs short
    worksteal  the collection is split into one consecutive block per worker: the blocks are
               balanced by time, each longest first (a thief takes the short end)
    loadscope, loadfile, loadgroup
               whole scopes (module or class, file, xdist_group) go to a worker: scopes by their
               summed time, longest first, and within a scope its cases longest first
    each       every worker runs every case: the order stays

Only -n reorders by time: a serial run keeps the collection order (but for its collective
cases, which run after the kernel cases: run/collective.py), as does a sweep without history
(run/durations.py). Cases without history weigh the median of the recorded ones. The
controller hands its workers the moment the session began and the --dist mode (a worker's own
option reads "no"), so every worker reads the same history and sorts the same way: xdist
refuses workers whose collections differ.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from pytest_opperf.case import shape_of
from pytest_opperf.run import durations, shard
from pytest_opperf.run.xdist_schedule import is_collective_id

WORKERINPUT_KEY = "opperf_schedule"  # in workerinput: {"before_unix_s", "dist", "maxschedchunk"}
SCOPED = ("loadscope", "loadfile", "loadgroup")


def longest_first(weights: dict[str, float], ids: list[str]) -> list[str]:
    """The ids by weight, heaviest first; equal weights keep their order.

    >>> longest_first({"a": 1, "b": 3, "c": 1}, ["a", "b", "c"])
    ['b', 'a', 'c']
    """
    return sorted(ids, key=lambda i: -weights[i])


def _blocks(weights: dict[str, float], ids: list[str], sizes: list[int]) -> list[str]:
    """ids split into consecutive blocks of `sizes`, the blocks balanced by weight, each longest first."""
    bins = shard.lpt({i: weights[i] for i in ids}, len(sizes), sizes)
    return [i for b in bins for i in longest_first(weights, b)]


def _load(weights: dict[str, float], ids: list[str], workers: int, maxschedchunk: Optional[int]) -> list[str]:
    ordered = longest_first(weights, ids)
    if len(ordered) < 2 * workers:
        return ordered  # xdist deals them one at a time, round-robin: longest first is balanced
    chunk = max(min(len(ordered) // workers // 4, maxschedchunk or len(ordered)), 2)  # xdist 3's first hand-out
    head = ordered[:chunk * workers]
    return _blocks(weights, head, [chunk] * workers) + ordered[chunk * workers:]


def _worksteal(weights: dict[str, float], ids: list[str], workers: int) -> list[str]:
    sizes, left = [], len(ids)
    for i in range(workers):  # xdist's split: each idle worker gets the rest over the workers left
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return _blocks(weights, ids, sizes)


def scope_of(dist: str) -> Callable[[str], str]:
    """xdist's work unit of a test id under a scoped --dist mode."""
    def loadscope(nodeid: str) -> str:
        return nodeid.rsplit("::", 1)[0]

    def loadgroup(nodeid: str) -> str:
        return nodeid.split("@")[-1] if nodeid.rfind("@") > nodeid.rfind("]") else loadscope(nodeid)

    return {"loadfile": lambda nodeid: nodeid.split("::", 1)[0], "loadgroup": loadgroup}.get(dist, loadscope)


def _scoped(weights: dict[str, float], ids: list[str], dist: str) -> list[str]:
    scope = scope_of(dist)
    units: dict[str, list[str]] = {}
    for i in ids:
        units.setdefault(scope(i), []).append(i)
    totals = {name: sum(weights[i] for i in unit) for name, unit in units.items()}
    return [i for name in longest_first(totals, list(units)) for i in longest_first(weights, units[name])]


def order(weights: dict[str, float], ids: list[str], dist: str, workers: int,
          maxschedchunk: Optional[int] = None) -> list[str]:
    """The order in which xdist's `dist` strategy hands `ids` to `workers` longest first.

    >>> order({"a": 1, "b": 9, "c": 5, "d": 5}, ["a", "b", "c", "d"], "worksteal", 2)
    ['b', 'a', 'c', 'd']
    """
    if dist == "each" or workers < 1:
        return list(ids)
    if dist == "worksteal":
        return _worksteal(weights, ids, workers)
    if dist in SCOPED:
        return _scoped(weights, ids, dist)
    return _load(weights, ids, workers, maxschedchunk)


def shapes_in_order(weights: dict[str, float], ids: list[str], by_id: dict, dist: str, workers: int,
                    maxschedchunk: Optional[int] = None) -> list[str]:
    """order() over shapes (a shape's backends, side by side since collect.group_shapes): each
    shape weighs its cases' summed time and keeps its cases together, in collection order, so that
    a worker runs them one after another and one reference output serves them (check.LastReference).
    Scoped modes hand out whole scopes already: they order cases as order() does.
    """
    if dist in SCOPED or dist == "each":
        return order(weights, ids, dist, workers, maxschedchunk)
    shapes: dict[str, list[str]] = {}
    for i in ids:
        shapes.setdefault(shape_of(by_id[i]) or i, []).append(i)
    totals = {key: sum(weights[i] for i in members) for key, members in shapes.items()}
    return [i for key in order(totals, list(shapes), dist, workers, maxschedchunk) for i in shapes[key]]


class Schedule:
    """Hooks: the history of the session's cases, its shard and the order its workers hand out."""

    def __init__(self, config: pytest.Config, db_path: Callable[[], Path], durations_file: Optional[Path],
                 shard_of: Optional[tuple]):
        self.config = config
        self._db_path = db_path  # read when the history is: an xdist controller opens its session late
        self.durations_file = durations_file
        self.shard_of = shard_of
        given = getattr(config, "workerinput", {}).get(WORKERINPUT_KEY)
        self.given = given or {"before_unix_s": time.time(), "dist": getattr(config.option, "dist", "no"),
                               "maxschedchunk": getattr(config.option, "maxschedchunk", None)}
        self._history: Optional[dict[str, float]] = None
        self.line: Optional[str] = None  # what this process says after collection

    @property
    def history(self) -> dict[str, float]:
        """Seconds per test id, read once: the durations file, else the results database."""
        if self._history is None:
            if self.durations_file is not None:
                try:
                    self._history = durations.from_file(self.durations_file)
                except durations.DurationsError as exc:
                    raise pytest.UsageError(f"--opperf-durations: {exc}") from None
            else:
                self._history = durations.recorded(self.db_path, self.given["before_unix_s"])
        return self._history

    @property
    def db_path(self) -> Path:
        return self._db_path()

    def source(self) -> str:
        return str(self.durations_file or self.db_path)

    def arrange(self, items: list[pytest.Item]) -> None:
        """This process's share of the items (--opperf-shard), in the order its workers take them."""
        if self.shard_of is None and not hasattr(self.config, "workerinput"):
            return  # a serial run keeps its collection order and reads no history
        ids = [item.nodeid for item in items]
        weights, guessed = durations.estimate(ids, self.history)
        shard.apply(self.config, items, self.shard_of, weights)
        self.line = self._line(weights, [item.nodeid for item in items], guessed)
        workerinput = getattr(self.config, "workerinput", None)
        if workerinput is None or not self.history:
            return
        by_id = {item.nodeid: item for item in items}
        # Collective cases are held back for one worker at the end (run/xdist_schedule.py): xdist's
        # hand-out sees the kernel cases alone, so only they are balanced.
        held = [i for i in by_id if is_collective_id(i)]
        kept = set(held)
        ids = shapes_in_order(weights, [i for i in by_id if i not in kept], by_id, self.given["dist"],
                              workerinput.get("workercount", 1), self.given["maxschedchunk"])
        items[:] = [by_id[i] for i in ids + held]

    def _line(self, weights: dict[str, float], kept: list[str], guessed: int, whole: bool = True) -> Optional[str]:
        """The shard's line: its cases and their expected seconds (whole: weights cover the whole
        collection, not only this share, so the sweep's total is known too)."""
        if self.shard_of is None:
            return None
        index, count = self.shard_of
        of = f" of {len(weights)}" if whole else ""
        if guessed == len(weights):
            return f"opperf: shard {index}/{count}: {len(kept)}{of} cases (no recorded times: balanced by count)"
        mine = sum(weights[i] for i in kept)
        total = f" of {sum(weights.values()):.1f} s" if whole else ""
        how = f"{len(weights) - guessed}{of} timed by {self.source()}" + (", the others at the median" if guessed else "")
        return f"opperf: shard {index}/{count}: {len(kept)}{of} cases, expected {mine:.1f} s{total} ({how})"

    # --- the hooks -------------------------------------------------------------------------------

    def pytest_report_collectionfinish(self, config: pytest.Config) -> Optional[str]:
        return self.line  # a serial run (or a worker, whose lines nobody prints)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[WORKERINPUT_KEY] = dict(self.given)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        # The controller collects nothing: it says the shard's line from the first worker's ids.
        if self.shard_of is None or self.line is not None:
            return
        weights, guessed = durations.estimate(list(ids), self.history)
        self.line = self._line(weights, list(ids), guessed, whole=False)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(self.line)
