"""The one writer of a run: checkpoints into the results database, the rescue file for rows it
refuses, and what that means for the run's exit status.

Only the controlling process (or the single process without xdist) has one. Each row ends in one
place: rows saved to the rescue file leave `pending`, so a later checkpoint that succeeds does not
write them again, and the rescue file holds exactly the rows the database lacks (restored by
`opperf merge DB RESCUE`).

The rescue file goes beside the database; where that cannot be written (a read-only or full
results folder), to the working directory, then to the temp directory, and the summary names
each file that holds rows with the command that restores them. `add` and `flush` hold a lock:
the session's timer thread (run/shutdown.py) checkpoints while the main thread adds rows, and a
signal's hard bound closes the writer from that thread. Each write opens its own connection.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from pytest_opperf.store import database as storage

# pytest's ExitCode values (the store knows nothing of pytest; the codes are its public contract).
EXIT_OK, EXIT_TESTS_FAILED, EXIT_INTERNAL_ERROR = 0, 1, 3


class ResultsWriter:
    """Rows in, checkpoints out: `add` keeps a row and writes when a checkpoint is due, `flush` writes."""

    def __init__(self, db_path: Path, run_row: Callable[[], dict], flush_interval_s: float, enabled: bool = True):
        self.db_path = db_path
        self.run_row = run_row  # the runs row as of now: written with every checkpoint
        self.flush_interval_s = flush_interval_s
        self.enabled = enabled  # False: --opperf-sample-only, nothing is written
        self.pending: list[dict] = []  # neither in the database nor in a rescue file yet
        self.written = 0
        self.rescued_to: dict[Path, int] = {}  # rescue file -> rows saved there (the database would not take them)
        self.errors: dict[str, None] = {}  # why rows were not written, each once, in order
        self.migrated: dict[str, list] = {}  # table -> columns the writes added to it (an older table)
        self.last_flush = time.monotonic()
        self.last_add = self.last_flush  # when the main thread last handed over a row
        self.closed = False  # the last write happened: the run's row has its ended_at
        self._lock = threading.RLock()

    @property
    def rescue_path(self) -> Path:
        return storage.rescue_path(self.db_path)

    @property
    def rescued(self) -> int:
        return sum(self.rescued_to.values())

    def rescue_places(self, run_id: str) -> list[Path]:
        """Where rescued rows go, in order: beside the database, the working directory, the temp
        directory (shared by every project on the machine: that file's name carries the run)."""
        name = self.rescue_path.name
        places = [self.rescue_path, Path(os.getcwd()) / name,
                  Path(tempfile.gettempdir()) / f"opperf-{run_id}-{name}"]
        return list(dict.fromkeys(p.absolute() for p in places))

    def add(self, record: dict) -> None:
        """Keep a row; write the pending ones when the last checkpoint is flush_interval_s old."""
        with self._lock:
            self.pending.append(record)
            self.last_add = time.monotonic()
            if self.last_add - self.last_flush >= self.flush_interval_s:
                self.flush()

    def flush_if_stalled(self) -> None:
        """The timer thread's checkpoint: only when no row has arrived for flush_interval_s (a case
        runs long or hangs) and rows wait. While rows keep arriving, `add` writes between cases, so
        the thread never writes during a case's timing in an ordinary sweep."""
        with self._lock:
            now = time.monotonic()
            if self.pending and now - self.last_add >= self.flush_interval_s \
                    and now - self.last_flush >= self.flush_interval_s:
                self.flush()

    def flush(self) -> None:
        """Write the pending rows (a checkpoint, or the last write); what the database refuses is rescued."""
        with self._lock:
            self.last_flush = time.monotonic()
            if not self.enabled or not self.pending:
                return
            batch, self.pending = self.pending, []
            self._write(batch)

    def close(self) -> None:
        """The last write: the pending rows, and the run's row with its ended_at even when no row is
        pending (a run that stored something). Later calls do nothing."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self.enabled and (self.pending or self.written or self.rescued):
                batch, self.pending = self.pending, []
                self._write(batch)

    def _write(self, batch: list[dict]) -> None:
        run = self.run_row()
        try:
            result = storage.write(self.db_path, run, batch)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Interrupted mid-write (KeyboardInterrupt: SIGINT, SIGTERM): the transaction rolled
                # back, so the rows go back to pending for the session's last write. Rows whose
                # commit had just finished are written again: an upsert, so once.
                self.pending = batch + self.pending
                raise  # keep measuring: these rows go to the rescue file, the run fails at its end
            reason = (str(exc) if isinstance(exc, storage.StorageError)
                      else f"{self.db_path}: {type(exc).__name__}: {exc}")
            if batch:
                self._rescue(batch, run, reason)
            else:
                self.errors[reason] = None
            return
        self.written += result.rows
        for table, columns in result.migrated.items():
            self.migrated.setdefault(table, []).extend(columns)
        for table, reason in result.refused.items():
            self._rescue([r for r in batch if r["op"] == table], run, reason)

    def _rescue(self, records: list[dict], run: dict, reason: str) -> None:
        self.errors[reason] = None
        for place in self.rescue_places(str(run.get("run_id", "run"))):
            try:
                storage.rescue(place, self.db_path, reason, run, records)
            except OSError as exc:
                self.errors[f"{place}: cannot write the rescue file: {exc}"] = None
                continue
            self.rescued_to[place] = self.rescued_to.get(place, 0) + len(records)
            return
        # Nowhere to put them now: the next checkpoint tries the database, then each place, again.
        self.pending = records + self.pending

    @property
    def failed(self) -> bool:
        """Some measured rows are not in the database: rescued, or (both files failing) still pending."""
        return self.enabled and bool(self.rescued or self.pending)

    def exit_status(self, status: int) -> int:
        """The session's exit status once the rows are written: a run whose rows are not all in the
        database fails as pytest's INTERNAL_ERROR, where it would have passed or failed tests."""
        return EXIT_INTERNAL_ERROR if self.failed and status in (EXIT_OK, EXIT_TESTS_FAILED) else status

    def summary_lines(self, run_id: str) -> list[str]:
        """What was written, and for rows that were not: why, where they are, how to restore them."""
        if not self.enabled:
            return ["sample-only: nothing written"]
        lines = []
        if self.written or not self.errors:
            lines.append(f"{self.written} rows written to {self.db_path} (run {run_id})")
        lines += [storage.migration_note(self.db_path, table, columns) for table, columns in self.migrated.items()]
        for reason in self.errors:
            first, *rest = reason.splitlines()
            lines += [f"ERROR: {first}", *rest]
        for place, count in self.rescued_to.items():
            lines.append(f"ERROR: {count} rows are not in the database: they were saved to "
                         f"{place}; once fixed, restore them with: opperf merge {self.db_path} {place}")
        if self.pending:
            lines.append(f"ERROR: {len(self.pending)} rows were lost: neither the database nor a rescue file "
                         f"(beside it, in the working directory, in the temp directory) could be written")
        return lines
