"""Backfill: the replayed time of each mapped signature, from a results database into the profile.

A signature's row in the results database is the row of its op table with the signature's
parameters, its dtype as ``dtype_in`` and its backend; of several (other timers, cache states,
knobs or versions) the newest wins. The results database is only read.

Modes, as the seed's ``--update-mode``:
- ``all``: every mapped signature with a measured row takes that row's time (a newer replay
  replaces an older one);
- ``missing-only``: only signatures without a replayed time yet are filled.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from pytest_opperf.pipeline import profile
from pytest_opperf.pipeline.mapping import MAPPED
from pytest_opperf.pipeline.signature import ProfileError
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
    try:
        with open_results(results_db) as results:
            done, updates = _matched(rows, _Measured(results), mode)
    except ResultsError as exc:
        raise ProfileError(str(exc)) from None
    if updates:
        try:
            with sqlite3.connect(profile_db) as db:
                db.executemany(
                    "UPDATE signatures SET replayed_us = ?, replayed_backend = ?, replayed_timer = ?, "
                    "replayed_kernels = ?, replayed_run_id = ?, replayed_db = ?, replayed_at = ? WHERE id = ?",
                    updates)
            db.close()
        except sqlite3.Error as exc:
            raise ProfileError(f"{profile_db}: cannot write the replayed times ({exc})") from None
    done.filled = len(updates)
    return done


def _matched(signatures: list[dict], measured: "_Measured", mode: str) -> tuple[Backfilled, list[tuple]]:
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
        row = measured.row(sig["op"], json.loads(sig["params"]), sig["dtype"].partition("-")[0], sig["backend"])
        if row is None:
            done.not_measured.append(sig)
            continue
        updates.append((row["time_us"], row["backend"], row.get("timer"), row.get("kernels"), row.get("run_id"),
                        str(measured.results.path), row.get("created_at"), sig["id"]))
    return done, updates


class _Measured:
    """The newest row of an op table for a case (parameters, dtype, backend)."""

    def __init__(self, results: ResultsDB):
        self.results = results
        self.ops = set(results.op_tables())
        self.tables: dict[str, dict] = {}

    def row(self, op: str, params: dict, dtype: str, backend: str):
        if op not in self.ops:
            return None
        if op not in self.tables:
            table_params = self.results.params(op)
            index: dict[tuple, dict] = {}
            for r in self.results.rows(op):
                key = (*[r[p] for p in table_params], r["dtype_in"], r["backend"])
                if key not in index or (r.get("created_at") or "") > (index[key].get("created_at") or ""):
                    index[key] = r
            self.tables[op] = {"params": table_params, "index": index}
        entry = self.tables[op]
        if set(entry["params"]) != set(params):
            return None
        return entry["index"].get((*[params[p] for p in entry["params"]], dtype, backend))
