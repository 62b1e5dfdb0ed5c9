"""How long each case took before: the history that orders the cases and balances the shards.

Two sources, one shape ({test id: seconds}):

    recorded(results/<device>.db, before)   the rows of the results database: a case's seconds are
                                            its row's ended_unix_s - started_unix_s (set-up to
                                            record), the latest row of each test id that began
                                            before `before`
    from_file(FILE)                         --opperf-durations: pytest-split's .test_durations,
                                            a JSON object {node id: seconds}

`before` is the moment the session started (the controller's, handed to its xdist workers): rows
this session writes while it runs never change the history its processes read, so every worker,
and a worker that replaces a crashed one, computes the same order and the same shares.

>>> estimate(["a", "b", "c"], {"a": 2.0, "b": 4.0})
({'a': 2.0, 'b': 4.0, 'c': 3.0}, 1)
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from pytest_opperf import files
from pytest_opperf.store.results import ResultsError, open_results

NEEDED = ("test_id", "started_unix_s", "ended_unix_s")


class DurationsError(ValueError):
    """A durations file that cannot be used: 'file: reason'."""


def recorded(db_path: Path, before_unix_s: float) -> dict[str, float]:
    """Seconds per test id from a results database ({} without one, or one too old to say)."""
    try:
        results = open_results(db_path)
    except ResultsError:
        return {}
    latest: dict[str, tuple[float, float]] = {}  # test id -> (started, seconds)
    with results:
        try:
            for table in results.op_tables():
                if not set(NEEDED) <= set(results.columns(table)):
                    continue  # written before the phase columns: no wall time to read
                with results.reading():
                    found = results.db.execute(
                        f"select test_id, started_unix_s, ended_unix_s from [{table}] where test_id is not null "
                        "and started_unix_s < ? and ended_unix_s >= started_unix_s", [before_unix_s]).fetchall()
                for test_id, started, ended in found:
                    if test_id not in latest or started >= latest[test_id][0]:
                        latest[test_id] = (started, ended - started)
        except ResultsError:
            return {}  # a damaged file orders nothing; the writer names it when it writes
    return {test_id: seconds for test_id, (_, seconds) in latest.items()}


def from_file(path: Path) -> dict[str, float]:
    """A durations file's {node id: seconds}; DurationsError naming the file and what is wrong."""
    try:
        data = files.load_json(path)
    except files.FileError as exc:
        raise DurationsError(str(exc)) from None
    if not isinstance(data, dict):
        raise DurationsError(f"{path}: expected a JSON object {{test id: seconds}} (pytest-split's "
                             f".test_durations), got {type(data).__name__}")
    for test_id, seconds in data.items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise DurationsError(f"{path}: {test_id!r}: expected seconds >= 0, got {seconds!r}")
    return {test_id: float(seconds) for test_id, seconds in data.items()}


def estimate(ids: list[str], known: dict[str, float]) -> tuple[dict[str, float], int]:
    """Seconds for every id: its history, else the median of the whole history (the same figure in
    every process, whatever it collected); and how many were estimated. Without any history every
    id gets 1.0, so balancing by time balances the counts."""
    median = statistics.median(known.values()) if known else 1.0
    return {i: known.get(i, median) for i in ids}, sum(1 for i in ids if i not in known)
