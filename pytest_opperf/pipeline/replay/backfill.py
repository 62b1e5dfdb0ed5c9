"""Backfill: the replayed time of each mapped signature, from a results database into the profile.

A signature's row in the results database is one that carries the signature's id and its
import's token in ``extra_info`` (the replay run tags them: see tag.py) and was measured in the
cache state chosen for the signature (the profile's ``cache`` column). Rows are never joined to
signatures by their parameters: a row of another profile, run by hand, or in another cache state
is not the signature's replay. Of several tagged rows of a signature (the replay run again),
the newest is its time. The results database is only read.

Modes, as the seed's ``--update-mode``:
- ``all``: every mapped signature with a tagged row takes that row's time (a newer replay
  replaces an older one);
- ``missing-only``: only signatures without a replayed time yet are filled.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from pytest_opperf.pipeline.mapping import profile
from pytest_opperf.pipeline.mapping.rules import MAPPED
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.record import extra_info_of
from pytest_opperf.store.results import ResultsDB, ResultsError, open_results

MODES = ("all", "missing-only")


@dataclass
class Backfilled:
    filled: int = 0
    kept: int = 0  # missing-only: already had a replayed time
    not_measured: list = field(default_factory=list)  # mapped, but no row in the results database
    unmapped: int = 0
    unreplayable: int = 0


def backfill(profile_db: Path, results_db: Path, mode: str = "all") -> Backfilled:
    if mode not in MODES:
        raise ProfileError(f"--mode={mode}: expected {' or '.join(MODES)}")
    rows = profile.load(profile_db)
    token = profile.import_token(profile_db)
    try:
        with open_results(results_db) as results:
            done, updates = _matched(rows, _Tagged(results, token), mode)
    except ResultsError as exc:
        raise ProfileError(str(exc)) from None
    if updates:
        try:
            with sqlite3.connect(profile_db) as db:
                db.executemany(
                    "UPDATE signatures SET replayed_us = ?, replayed_backend = ?, replayed_timer = ?, "
                    "replayed_kernels = ?, replayed_run_id = ?, replayed_db = ?, replayed_at = ? WHERE id = ?",
                    updates)
                profile.upgrade(db)  # the in-sequence time over the isolated one, where opperf sequence ran first
                db.execute("UPDATE signatures SET context_factor = sequence_us / replayed_us "
                           "WHERE sequence_us IS NOT NULL AND replayed_us > 0")
            db.close()
        except sqlite3.Error as exc:
            raise ProfileError(f"{profile_db}: cannot write the replayed times ({exc})") from None
    done.filled = len(updates)
    return done


def _matched(signatures: list[dict], measured: "_Tagged", mode: str) -> tuple[Backfilled, list[tuple]]:
    """What backfill() found, and the UPDATE parameters of the signatures it fills."""
    done = Backfilled()
    updates = []
    for sig in signatures:
        if sig["status"] != MAPPED:
            done.unmapped += sig["status"] == "unmapped"
            done.unreplayable += sig["status"] == "unreplayable"
            continue
        if mode == "missing-only" and sig["replayed_us"] is not None:
            done.kept += 1
            continue
        row = measured.row(sig["op"], sig["id"], sig.get("cache") or "cold")
        if row is None:
            done.not_measured.append(sig)
            continue
        updates.append((row["time_us"], row["backend"], row.get("timer"), row.get("kernels"), row.get("run_id"),
                        str(measured.results.path), row.get("created_at"), sig["id"]))
    return done, updates


class _Tagged:
    """The newest row of an op table tagged with a signature's id and the import's token."""

    def __init__(self, results: ResultsDB, token: str):
        self.results = results
        self.token = token
        self.ops = set(results.op_tables())
        self.tables: dict[str, dict] = {}

    def row(self, op: str, sig_id: int, cache: str):
        return self.index(op).get((sig_id, cache))

    def index(self, op: str) -> dict:
        """(signature id, cache state) -> the newest row of OP's table tagged with it."""
        if op not in self.ops:
            return {}
        if op not in self.tables:
            index: dict[tuple, dict] = {}
            for r in self.results.rows(op):
                for tagged in _signatures(r.get("extra_info"), self.token):
                    key = (tagged, r.get("cache"))
                    if key not in index or (r.get("created_at") or "") > (index[key].get("created_at") or ""):
                        index[key] = r
            self.tables[op] = index
        return self.tables[op]


def replayed_by_state(profile_db: Path, results_db: Path) -> dict[int, dict[str, float]]:
    """Per mapped signature with tagged rows: its newest replayed time (us) in each cache state it
    ran in, the chosen one and any other (a replay run again with --opperf-cache=hot or cold).
    What the model's sum would be under another cache rule; the database is only read."""
    rows = profile.load(profile_db)
    token = profile.import_token(profile_db)
    out: dict[int, dict[str, float]] = {}
    try:
        with open_results(results_db) as results:
            tagged = _Tagged(results, token)
            mapped = {sig["id"]: sig["op"] for sig in rows if sig["status"] == MAPPED}
            for op in set(mapped.values()):
                for (sig_id, cache), row in tagged.index(op).items():
                    if mapped.get(sig_id) == op and cache:
                        out.setdefault(sig_id, {})[cache] = row["time_us"]
    except ResultsError as exc:
        raise ProfileError(str(exc)) from None
    return out


def _signatures(extra_info, token: str) -> list:
    """The signature ids a row's extra_info tags it with for this import; [] for any other row."""
    info = extra_info_of(extra_info)
    if info.get("profile") != token:
        return []
    return [i for i in info.get("signatures") or [] if isinstance(i, int)]
