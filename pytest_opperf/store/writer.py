"""The one writer of a run: checkpoints into the results database, the rescue file for rows it
refuses, and what that means for the run's exit status.

Only the controlling process (or the single process without xdist) has one. Each row ends in one
place: rows saved to the rescue file leave `pending`, so a later checkpoint that succeeds does not
write them again, and the rescue file holds exactly the rows the database lacks (restored by
`opperf merge DB RESCUE`).
"""

from __future__ import annotations

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
        self.pending: list[dict] = []  # neither in the database nor in the rescue file yet
        self.written = 0
        self.rescued = 0  # rows saved to the rescue file because the database would not take them
        self.errors: dict[str, None] = {}  # why rows were not written, each once, in order
        self.migrated: dict[str, list] = {}  # table -> columns the writes added to it (an older table)
        self.last_flush = time.monotonic()

    @property
    def rescue_path(self) -> Path:
        return storage.rescue_path(self.db_path)

    def add(self, record: dict) -> None:
        """Keep a row; write the pending ones when the last checkpoint is flush_interval_s old."""
        self.pending.append(record)
        if time.monotonic() - self.last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write the pending rows (a checkpoint, or the last write); what the database refuses is rescued."""
        self.last_flush = time.monotonic()
        if not self.enabled or not self.pending:
            return
        batch, self.pending = self.pending, []
        run = self.run_row()
        try:
            result = storage.write(self.db_path, run, batch)
        except Exception as exc:  # keep measuring: these rows go to the rescue file, the run fails at its end
            reason = (str(exc) if isinstance(exc, storage.StorageError)
                      else f"{self.db_path}: {type(exc).__name__}: {exc}")
            self._rescue(batch, run, reason)
            return
        self.written += result.rows
        for table, columns in result.migrated.items():
            self.migrated.setdefault(table, []).extend(columns)
        for table, reason in result.refused.items():
            self._rescue([r for r in batch if r["op"] == table], run, reason)

    def _rescue(self, records: list[dict], run: dict, reason: str) -> None:
        self.errors[reason] = None
        try:
            storage.rescue(self.rescue_path, self.db_path, reason, run, records)
        except OSError as exc:
            # Nowhere to put them now: the next checkpoint tries the database, then this file, again.
            self.errors[f"{self.rescue_path}: cannot write the rescue file: {exc}"] = None
            self.pending = records + self.pending
            return
        self.rescued += len(records)

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
        if self.rescued:
            lines.append(f"ERROR: {self.rescued} rows are not in the database: they were saved to "
                         f"{self.rescue_path}; once fixed, restore them with: opperf merge {self.db_path} "
                         f"{self.rescue_path}")
        if self.pending:
            lines.append(f"ERROR: {len(self.pending)} rows were lost: neither the database nor the rescue file "
                         f"could be written")
        return lines
