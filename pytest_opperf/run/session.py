"""The session: wires the parts of a run together and holds what they share.

Every process (controller and xdist workers) builds one in pytest_configure, from the options:
the device (run/device.py), what collection learnt (run/collect.py), the gate (gate/session.py),
the calibration (run/calibration.py) and, in the controller, the writer (store/writer.py). The
controller (or the single process without xdist) receives every record, derives its metrics and
hands it to the writer; the terminal report (view/terminal.py) reads the session at the end.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import uuid
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf.case import Case
from pytest_opperf.catalog import dtypes as dtype_table
from pytest_opperf.catalog.registry import BACKENDS, DTypes, library_version
from pytest_opperf.gate.baseline import BaselineError
from pytest_opperf.gate.session import GateSession
from pytest_opperf.hardware import metrics
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.measure import clocks, contention, devstate, phases, timers
from pytest_opperf.files import unwritable
from pytest_opperf.record import Record
from pytest_opperf.run import device as device_context
from pytest_opperf.run.activity import Activity
from pytest_opperf.run import environment, options, xdist
from pytest_opperf.run.calibration import SessionCalibration
from pytest_opperf.run.collect import Collected
from pytest_opperf.store import benchjson
from pytest_opperf.store.writer import ResultsWriter

SESSION_KEY = pytest.StashKey["OpperfSession"]()


def state_of(config: pytest.Config) -> "OpperfSession":
    """The session of a pytest run (made in pytest_configure)."""
    return config.stash[SESSION_KEY]


class OpperfSession:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.rootpath = config.rootpath
        self.settings = options.read(config)
        self.is_worker = hasattr(config, "workerinput")
        xdist.pin_this_worker(config)
        try:
            self.ctx = device_context.resolve(self.settings.device, self.settings.hardware_file)
            self.gate = GateSession(self.settings, self.ctx.spec.name)
        except (hardware.SpecError, BaselineError) as exc:
            raise pytest.UsageError(str(exc)) from None
        self._check_timer()
        self.placement = xdist.placement(config, self.device)  # worker, gpu, gpu_uuid of every row
        self.collected = Collected()
        self.run_id = uuid.uuid4().hex[:16]
        self.started_at = _now()
        self.records: list[Record] = []  # all of the run, for the summary and the reports
        self.notes: list[str] = []  # for the summary: what the session end wrote or failed to write
        self.writer = ResultsWriter(self.db_path, self.run_row, self.settings.flush_interval_s,
                                    enabled=not self.settings.sample_only)
        self._environment: Optional[dict] = None  # the runs row's fixed part, read at the first write
        self.calibration = SessionCalibration(self)  # measured ceilings: loaded (or measured) at session start
        self.profiler_start_s: Optional[float] = None  # what the profiler's start took before the first case
        self.activity = Activity(xdist.status_file(config))  # the running case's phase, for the progress line
        self.busy_at_start: Optional[float] = None  # cores other processes kept busy as the run began
        self.threads: Optional[int] = None  # torch's intra-op threads of the cases (set before the first)
        if not self.is_worker and not config.option.collectonly:
            self._check_outputs()

    def _check_outputs(self) -> None:
        """Before the first case: every file the run will write can be written (a usage error
        naming the path, not rows or a report lost at the end of a long sweep)."""
        s = self.settings
        if not s.sample_only:
            problem = unwritable(self.db_path)
            if problem:
                raise pytest.UsageError(f"{self.db_path}: cannot write the results database: {problem} "
                                        f"(choose another directory with --opperf-results=DIR)")
        for flag, path in (("--opperf-benchmark-json", s.benchmark_json), ("--opperf-save-baseline",
                           s.save_baseline_file), ("--opperf-report-json", s.report_json_file),
                           ("--opperf-report-md", s.report_md_file), ("--opperf-html", s.html_file)):
            problem = unwritable(path) if path is not None else None
            if problem:
                raise pytest.UsageError(f"{flag}={path}: cannot write it: {problem}")

    # --- the device (run/device.py) ----------------------------------------------------------

    @property
    def device(self):
        """The torch device the cases run on."""
        return self.ctx.torch

    @property
    def spec(self) -> hardware.HardwareSpec:
        return self.ctx.spec

    @property
    def accelerator(self) -> hardware.Accelerator:
        return self.ctx.accelerator

    @property
    def capability(self) -> tuple:
        return self.ctx.capability

    def monitor(self) -> devstate.Monitor:
        return self.ctx.monitor()

    def contention_probe(self) -> contention.Probe:
        return self.ctx.contention_probe()

    def clock_warmer(self) -> clocks.ClockWarmer:
        return self.ctx.clock_warmer(self.settings)

    def cache_bytes(self) -> Optional[int]:
        return self.ctx.cache_bytes()

    def memory_budget(self) -> tuple[Optional[float], str]:
        return self.ctx.memory_budget(self.settings)

    def _check_timer(self) -> None:
        if self.settings.timer == "auto":
            return
        reason = timers.unsupported(self.settings.timer, self.device.type)
        if reason:
            raise pytest.UsageError(f"--opperf-timer={self.settings.timer}: {reason}, and this session runs on "
                                    f"{self.device.type}")

    def reference_timer(self) -> str:
        """The timer of the gate's reference kernels: the run's, or the device's default."""
        return self.settings.timer if self.settings.timer != "auto" else timers.default_timer(self.device.type)

    @property
    def db_path(self) -> Path:
        path = (self.settings.results_dir / f"{self.spec.name}.db").resolve()
        if path.parent != self.settings.results_dir.resolve():
            raise pytest.UsageError(f"device name {self.spec.name!r} would leave the results directory")
        return path

    # --- cases -------------------------------------------------------------------------------

    def dtypes_of(self, case: Case) -> DTypes:
        return _dtypes(case.dtype_in, case.dtype_out)

    @property
    def input_seed(self) -> int:
        """The seed of the inputs (fresh in each of the gate's confirmation rounds)."""
        return self.settings.seed + self.gate.seed_offset

    # --- the machine at the start (measure/contention.py) --------------------------------------

    def look_at_machine(self) -> None:
        """Controller, as the session starts (before xdist starts workers): how busy the machine is.
        A busy one gets a warning in the header; the runs row keeps the figure and the threads."""
        if self.config.option.collectonly or not self.settings.contention:
            return
        self.busy_at_start = contention.busy_cores()
        cores = len(contention.allowed_cpus())
        seen = []
        if self.busy_at_start is not None and round(self.busy_at_start) >= 1:
            threads = self.threads_for(self.busy_at_start)
            seen.append(f"other processes kept {self.busy_at_start:.1f} of {cores} cores busy"
                        + (f" (intra-op threads: {threads})" if self.device.type == "cpu" else ""))
        listed = self.monitor().compute_pids() if self.device.type != "cpu" else None
        gpu = [pid for pid in listed or [] if pid != os.getpid()]  # this process holds no context yet, or its own
        if gpu:
            util = self.monitor().utilization()
            seen.append(f"{len(gpu)} other process{'es' if len(gpu) > 1 else ''} on the GPU (pid "
                        f"{', '.join(map(str, gpu[:5]))})" + (f", utilisation {util}%" if util is not None else ""))
        if seen:
            self.ctx.warnings.append(f"the machine is busy at the start: {'; '.join(seen)}; rows measured under "
                                     f"contention are flagged `contended` (docs/timing.md)")

    def threads_for(self, busy: Optional[float]) -> int:
        """The intra-op threads of this run's cases: --opperf-threads, else on a CPU at most the cores
        left free by `busy`, shared among xdist workers (contention.free_threads); else (another device,
        --opperf-contention=off) torch's."""
        import torch

        if self.settings.threads is not None:
            return self.settings.threads
        if self.device.type != "cpu" or not self.settings.contention:
            return torch.get_num_threads()
        workers = getattr(self.config, "workerinput", {}).get("workercount")
        if workers is None:
            n = getattr(self.config.option, "numprocesses", None)
            workers = n if isinstance(n, int) and n > 0 else 1
        return contention.free_threads(len(contention.allowed_cpus()), busy, torch.get_num_threads(), workers)

    def _set_threads(self) -> None:
        import torch

        if (self.busy_at_start is None and self.settings.threads is None and self.settings.contention
                and self.device.type == "cpu"):
            self.busy_at_start = contention.busy_cores()  # an xdist worker: its own look, its siblings included
        self.threads = self.threads_for(self.busy_at_start)
        if self.threads != torch.get_num_threads():
            torch.set_num_threads(self.threads)

    def before_first_case(self, items: list) -> None:
        """Before this process's first case, when its cases are bench cases: torch's intra-op threads
        (threads_for), one Triton cache directory for the whole sweep (pin_triton_cache), and the
        profiler's once-per-process start (timers.start_profiler). A failed start is noted in the
        summary and left to the first case's sampling, which meets it again and fails as that case."""
        if not any("bench" in getattr(item, "fixturenames", ()) for item in items):
            return  # not a sweep (a project's own tests with the plugin installed): nothing to do
        self._set_threads()
        pin_triton_cache()
        try:
            self.profiler_start_s = timers.start_profiler(self.device.type, self.settings.timer)
        except Exception as exc:  # noqa: BLE001  (the cases report it)
            # In the summary: pytest's warning capture does not cover the run loop.
            self.notes.append(f"WARNING: starting the profiler before the first case failed "
                              f"({type(exc).__name__}: {exc}); the first case's sampling started it")

    # --- the controller: records in, files out ------------------------------------------------

    def add_record(self, record: dict) -> None:
        """Controller side: derive the metrics, keep the row, hand it to the writer."""
        record = Record(record)
        record.update(metrics.derive(record["flops"], record["bytes"], record["time_us"], self.spec,
                                     record["peak_dtype"], record["peak_kind"]))
        record.update(self.calibration.attainable(record))
        record["run_id"] = self.run_id
        self.config.hook.pytest_opperf_update_record(config=self.config, record=record)
        self.records.append(record)
        self.writer.add(record)

    def flush(self) -> None:
        """A checkpoint now: every row measured so far into the database (or the rescue file)."""
        self.writer.flush()

    def finish(self) -> None:
        """Controller, at the session's end: the last rows, the pytest-benchmark export, then the
        gate's comparison, report files and baseline (the HTML report is the view's: plugin.py)."""
        self.writer.close()
        s = self.settings
        if self.config.option.collectonly:
            return  # collecting measures nothing: no export, no verdicts, no baseline, no report
        if s.benchmark_json is not None:
            try:
                count = benchjson.write(s.benchmark_json, self.records, self.run_row(), self.rootpath)
                self.notes.append(f"{count} benchmarks written to {s.benchmark_json} (pytest-benchmark JSON)")
            except OSError as exc:
                self.notes.append(f"ERROR: cannot write {s.benchmark_json}: {exc}")
        self.notes.extend(self.gate.finish(self.records, self.run_row()))

    def exit_status(self, status: int) -> int:
        """The exit status once the rows are written: a run whose rows are not all stored fails, and
        so does one whose report or baseline file could not be written (pytest's INTERNAL_ERROR, 3,
        where it would have passed or failed tests: the tool did not finish its job)."""
        status = self.writer.exit_status(status)
        if any(note.startswith("ERROR:") for note in self.notes) and status in (0, 1):
            return pytest.ExitCode.INTERNAL_ERROR
        return status

    def run_row(self) -> dict:
        """The runs table's row of this session, as of now (written with every checkpoint)."""
        if self._environment is None:
            # Read once: it runs git and NVML, and a run row is written at every checkpoint.
            self._environment = environment.describe(self.rootpath, self.spec, self.accelerator, {},
                                                     list(self.config.invocation_params.args))
            self.config.hook.pytest_opperf_machine_info(config=self.config, info=self._environment)
        row = {"run_id": self.run_id, "started_at": self.started_at, "ended_at": _now(), **self._environment}
        row["started_unix_s"] = phases.LOADED_UNIX_S  # where `opperf timeline` starts the session's lanes
        row["libraries"] = json.dumps(self._libraries(), sort_keys=True)
        n = getattr(self.config.option, "numprocesses", None)
        row["workers"] = int(n) if isinstance(n, int) else 0
        row["settings"] = _settings_text(self.settings)
        row["threads"] = self.threads if self.threads is not None else self.threads_for(self.busy_at_start)
        row["busy_cores_at_start"] = None if self.busy_at_start is None else round(self.busy_at_start, 2)
        row.update(clocks.run_columns(self.records))
        row.update(self.calibration.run_fields())
        return row

    def _libraries(self) -> dict:
        libraries = {}
        for record in self.records:
            registered = BACKENDS.get((record["op"], record["backend"]))
            libraries[registered.library if registered else record["backend"]] = record["backend_version"]
        return libraries


def _settings_text(s) -> str:
    text = (f"timer={s.timer} cache={s.cache} kernel_names={'auto' if s.kernel_names else 'off'} "
            f"target={s.target_rel} min_samples={s.min_samples} "
            f"max_samples={s.max_samples} budget_s={s.budget_s} warmup_s={s.warmup_s} seed={s.seed} "
            f"clock_warmup={s.clock_warmup_s or ('auto' if s.clock_warmup_auto else 'off')}")
    if s.shard is not None:
        text += f" shard={s.shard[0]}/{s.shard[1]}"
    return text


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=None)
def _dtypes(dtype_in: str, dtype_out: str) -> DTypes:
    return DTypes(dtype_table.lookup(dtype_in), dtype_table.lookup(dtype_out))


def installed_version(case: Case) -> str:
    return str(library_version(BACKENDS[(case.op, case.backend)].library) or "unknown")


def pin_triton_cache(environ: Optional[dict] = None) -> Optional[str]:
    """Set TRITON_CACHE_DIR, where it is unset, to the directory Triton uses by default; the
    directory set, or None when the variable was set already.

    Inductor points TRITON_CACHE_DIR at its own directory when it builds its first kernel of a
    process, where the variable is unset, and every Triton kernel compiled after that in the sweep
    (ours, liger's, a user's) is then looked up there and compiled again, a hundred milliseconds
    and more each on an H100. Pinned before the first case, Triton and Inductor keep one directory.
    Triton's rule for its default: $TRITON_HOME, else the home directory, then .triton/cache.
    """
    environ = os.environ if environ is None else environ
    if environ.get("TRITON_CACHE_DIR"):
        return None
    home = environ.get("TRITON_HOME") or os.path.expanduser("~/")
    path = os.path.join(home, ".triton", "cache")
    environ["TRITON_CACHE_DIR"] = path
    return path
