"""The one process that writes: it receives every record, derives its metrics, hands it to the
writer, and at the end writes the exports, the gate's files and the exit status.

That process is the single process without xdist, the xdist controller, or rank 0 under torchrun;
no other process has a Controller. The terminal report reads a plain `RunSummary` of it.

    controller = Controller(env, gate, machine, calibration, hooks, command=["benches/"], workers=0)
    controller.add_record(record)          # each measured case, from any process
    controller.finish()                    # the last write, the exports, the gate's files
    status = controller.exit_status(status)
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pytest_opperf.catalog.registry import BACKENDS
from pytest_opperf.gate.report import run_report
from pytest_opperf.gate.session import GateSession
from pytest_opperf.hardware import metrics
from pytest_opperf.measure import clocks, contention, phases
from pytest_opperf.record import Record
from pytest_opperf.run import environment
from pytest_opperf.run.calibration import SessionCalibration
from pytest_opperf.run.env import RunEnv
from pytest_opperf.run.machine import Machine
from pytest_opperf.run.options import Settings
from pytest_opperf.store import benchjson, database
from pytest_opperf.store.results import StorageError
from pytest_opperf.store.writer import ResultsWriter

INTERNAL_ERROR = 3  # pytest.ExitCode.INTERNAL_ERROR: the tool did not finish its job


@dataclass(frozen=True)
class Hooks:
    """The user hooks the controller calls (hookspec.py), bound to the pytest config by the plugin."""

    update_record: Callable[[Record], None]
    machine_info: Callable[[dict], None]


@dataclass
class RunSummary:
    """What the terminal report shows of a run: plain values, read once at the end."""

    records: list
    notes: list
    written: list  # the writer's lines: rows written, rescued, why not
    failed_to_write: bool
    spec_name: str
    target_rel: float
    summary_rows: int
    columns: tuple
    calibrated: bool  # a calibration is loaded: the attainable columns have values
    calibration_lines: list = field(default_factory=list)
    profiler_start_s: Optional[float] = None


@dataclass
class RunHeader:
    """What pytest's report header shows of a run: plain values, read as the session starts."""

    device_line: str  # spec (reported name, torch device), timer, cache, target
    gate_lines: list
    db_path: Optional[Path]  # None: sample-only, no database
    rescue_path: Optional[Path]  # rows an earlier run could not store wait there (when it exists)
    calibration_lines: list
    warnings: list


class Controller:
    def __init__(self, env: RunEnv, gate: GateSession, machine: Machine, calibration: SessionCalibration,
                 hooks: Hooks, command: list, workers: int):
        self.env = env
        self.gate = gate
        self.machine = machine
        self.calibration = calibration
        self.hooks = hooks
        self.command = command
        self.workers = workers
        self.started_at = _now()
        self.records: list[Record] = []  # all of the run, for the summary and the reports
        self.notes: list[str] = []  # for the summary: what the session end wrote or failed to write
        settings = env.settings
        self.writer = ResultsWriter(env.db_path, self.run_row, settings.flush_interval_s,
                                    enabled=not settings.sample_only)
        self._environment: Optional[dict] = None  # the runs row's fixed part, read at the first write
        self.started = False  # start() ran

    @property
    def settings(self) -> Settings:
        return self.env.settings

    def start(self, busy_cores: Callable[[], Optional[float]] = contention.busy_cores,
              workers_started: bool = False) -> None:
        """Before any case (once): how busy the machine is (`busy_cores` reads the cores other
        processes keep busy; workers_started: xdist's workers run already, this process's children),
        and the device's calibration."""
        if self.started:
            return
        self.started = True
        self.machine.look(busy_cores, workers_started)
        self.calibration.start()

    def add_record(self, record: dict) -> None:
        """Derive the metrics, keep the row, hand it to the writer."""
        record = Record(record)
        record.update(metrics.derive(record["flops"], record["bytes"], record["time_us"], self.env.device.spec,
                                     record["peak_dtype"], record["peak_kind"]))
        record.update(self.calibration.attainable(record))
        record["run_id"] = self.env.run_id
        self.hooks.update_record(record)
        self.records.append(record)
        self.writer.add(record)

    def mark_check_failed(self, failure: dict) -> None:
        """A case failed its functional check: its stored rows stop counting as current (the history stays)."""
        if not self.writer.enabled:
            return
        try:
            database.mark_check_failed(self.env.db_path, self.env.run_id, failure)
        except StorageError as exc:
            self.notes.append(f"WARNING: the rows of a case whose check failed were not marked: {exc}")

    def flush(self) -> None:
        """A checkpoint now: every row measured so far into the database (or the rescue file)."""
        self.writer.flush()

    def finish(self, collectonly: bool = False) -> None:
        """At the session's end: the last rows, the pytest-benchmark export, then the gate's
        comparison, report files and baseline (the HTML report is the view's: plugin.py)."""
        self.writer.close()
        if collectonly:
            return  # collecting measures nothing: no export, no verdicts, no baseline, no report
        path = self.settings.benchmark_json
        if path is not None:
            try:
                count = benchjson.write(path, self.records, self.run_row(), self.env.rootpath)
                self.notes.append(f"{count} benchmarks written to {path} (pytest-benchmark JSON)")
            except OSError as exc:
                self.notes.append(f"ERROR: cannot write {path}: {exc}")
        self.notes.extend(self.gate.finish(self.records, self.run_row()))

    def exit_status(self, status: int) -> int:
        """The exit status once the rows are written: a run whose rows are not all stored fails, and
        so does one whose report or baseline file could not be written (pytest's INTERNAL_ERROR, 3,
        where it would have passed or failed tests: the tool did not finish its job)."""
        status = self.writer.exit_status(status)
        if any(note.startswith("ERROR:") for note in self.notes) and status in (0, 1):
            return INTERNAL_ERROR
        return status

    def gate_report(self) -> Optional[dict]:
        """The gate's report of this run's records (None without a baseline), for the HTML page."""
        return run_report(self.records, self.run_row(), None) if self.gate.gate is not None else None

    def stored_db(self) -> Optional[Path]:
        """The database holding every row of the run, or None (sample-only, rows rescued or pending)."""
        w = self.writer
        return None if self.settings.sample_only or w.rescued or w.pending else self.env.db_path

    def header(self) -> RunHeader:
        s, device = self.settings, self.env.device
        line = (f"device {device.spec.name} ({device.accelerator.reported_name}, torch {device.torch}), "
                f"timer {s.timer}, cache {s.cache}, target {s.target_rel:.2%} within {s.budget_s:g}s/case "
                f"({s.collective_budget_s:g}s/collective case)")
        return RunHeader(line, self.gate.header_lines(), None if s.sample_only else self.env.db_path,
                         None if s.sample_only else self.writer.rescue_path, list(self.calibration.lines),
                         list(device.warnings))

    def summary(self) -> RunSummary:
        s = self.settings
        return RunSummary(
            records=self.records, notes=self.machine.notes + self.notes,
            written=self.writer.summary_lines(self.env.run_id), failed_to_write=bool(self.writer.errors),
            spec_name=self.env.device.spec.name, target_rel=s.target_rel, summary_rows=s.summary_rows,
            columns=tuple(s.columns or ()), calibrated=self.calibration.current is not None,
            calibration_lines=self.calibration.summary_lines(), profiler_start_s=self.machine.profiler_start_s)

    def run_row(self) -> dict:
        """The runs table's row of this session, as of now (written with every checkpoint)."""
        env = self.env
        if self._environment is None:
            # Read once: it runs git and NVML, and a run row is written at every checkpoint.
            self._environment = environment.describe(env.rootpath, env.device.spec, env.device.accelerator, {},
                                                     list(self.command))
            self.hooks.machine_info(self._environment)
        row = {"run_id": env.run_id, "started_at": self.started_at, "ended_at": _now(), **self._environment}
        row["started_unix_s"] = phases.LOADED_UNIX_S  # where `opperf timeline` starts the session's lanes
        row["libraries"] = json.dumps(self._libraries(), sort_keys=True)
        row["workers"] = self.workers
        row["settings"] = settings_text(self.settings)
        row["threads"] = self.machine.run_threads()
        busy = self.machine.busy_at_start
        row["busy_cores_at_start"] = None if busy is None else round(busy, 2)
        row.update(clocks.run_columns(self.records))
        row.update(self.calibration.run_fields())
        return row

    def _libraries(self) -> dict:
        libraries = {}
        for record in self.records:
            registered = BACKENDS.get((record["op"], record["backend"]))
            libraries[registered.library if registered else record["backend"]] = record["backend_version"]
        return libraries


def settings_text(s: Settings) -> str:
    """The runs row's `settings`: how the run measured, in one line."""
    text = (f"timer={s.timer} cache={s.cache} kernel_names={'auto' if s.kernel_names else 'off'} "
            f"target={s.target_rel} min_samples={s.min_samples} "
            f"max_samples={s.max_samples} budget_s={s.budget_s} collective_budget_s={s.collective_budget_s} "
            f"warmup_s={'auto' if s.warmup_s is None else s.warmup_s} seed={s.seed} "
            f"clock_warmup={s.clock_warmup_s or ('auto' if s.clock_warmup_auto else 'off')}")
    if s.shard is not None:
        text += f" shard={s.shard[0]}/{s.shard[1]}"
    return text


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
