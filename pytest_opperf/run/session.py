"""The session object: resolved settings and device, the records of the run, the one writer.

Every process (controller and xdist workers) builds one in pytest_configure; only the
controller (or the single process without xdist) collects records and writes them.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf.catalog import dtypes as dtype_table
from pytest_opperf.catalog.registry import BACKENDS, DTypes, library_version
from pytest_opperf.gate import drift
from pytest_opperf.gate.baseline import Baseline, BaselineError, case_key, entry_from_record
from pytest_opperf.gate.rules import Gate, pct
from pytest_opperf.gate.noise import runs_of
from pytest_opperf.gate.runloop import combine
from pytest_opperf.gate.report import Comparison, run_report
from pytest_opperf.hardware import metrics
from pytest_opperf.hardware import specs as hardware
from pytest_opperf.measure import budget, clocks, devstate, phases, timing
from pytest_opperf.run import environment, options, xdist
from pytest_opperf.run.calibration import SessionCalibration
from pytest_opperf.case import Case
from pytest_opperf.store import benchjson
from pytest_opperf.store import database as storage


class OpperfSession:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.rootpath = config.rootpath
        self.settings = options.read(config)
        self.is_worker = hasattr(config, "workerinput")
        xdist.pin_this_worker(config)
        self.accelerator = hardware.detect_accelerator()
        self.spec, self.warnings = self._resolve_spec()
        self.device = self._torch_device()
        self.capability = self._capability()
        self._check_timer()
        self._monitor: Optional[devstate.Monitor] = None
        self._clock_warmer: Optional[clocks.ClockWarmer] = None
        self.placement = xdist.placement(config, self.device)  # worker, gpu, gpu_uuid of every row
        self._memory_budget: Optional[tuple] = None
        self.configs: dict = {}
        self.config_of: dict = {}  # Case -> the OpConfig it came from
        self.marks: set = set()
        self.records: list[dict] = []  # all of the run, for the summary
        self.pending: list[dict] = []  # neither in the database nor in the rescue file yet
        self.written = 0
        self.rescued = 0  # rows saved to the rescue file because the database would not take them
        self.store_errors: dict[str, None] = {}  # why rows were not written, each once, in order
        self.run_id = uuid.uuid4().hex[:16]
        self.started_at = _now()
        self.last_flush = time.monotonic()
        self._environment: Optional[dict] = None  # the runs row's fixed part, read at the first write
        self.threshold_of: dict = {}  # Case -> (max_regression, where it was set) from its config
        self.gate: Optional[Gate] = self._load_gate()
        self.baseline_to_update: Optional[Baseline] = self._load_save_target()
        self.comparison: Optional[Comparison] = None
        self.notes: list[str] = []  # for the summary: what the session end wrote or failed to write, and the like
        self.calibration = SessionCalibration(self)  # measured ceilings: loaded (or measured) at session start
        self.confirming: Optional[list] = None  # re-measuring a case: its earlier measurements (gate.runloop)
        self.reference_factor: Optional[float] = None  # this process's machine drift against the baseline
        self.references: list[dict] = []  # controller: each process's reference timings (start, end)
        self.profiler_start_s: Optional[float] = None  # what the profiler's start took before the first case

    # --- device ---------------------------------------------------------------------------

    def _resolve_spec(self) -> tuple[hardware.HardwareSpec, list[str]]:
        try:
            specs = hardware.load_specs(self.settings.hardware_file)
        except hardware.SpecError as exc:
            raise pytest.UsageError(f"--opperf-hardware: {exc}") from None
        acc, warnings = self.accelerator, []
        name = self.settings.device
        if name:
            if not hardware.valid_name(name.lower()):
                raise pytest.UsageError(
                    f"--device={name}: a device name is lower-case letters, digits, '.', '_' and '-' "
                    f"(it names results/<device>.db); known: {', '.join(sorted(specs))}")
            spec = specs.get(name.lower()) or hardware.resolve_alias(specs, name)
            if spec is None:
                raise pytest.UsageError(f"--device={name}: unknown device; known: {', '.join(sorted(specs))} "
                                        f"(add your own with --opperf-hardware=FILE)")
            if spec.backend != "cpu" and spec.backend != acc.type:
                raise pytest.UsageError(
                    f"--device={name}: {spec.name} runs on {spec.backend}, but this machine has "
                    f"{'no accelerator' if acc.type == 'cpu' else acc.type + ' (' + acc.reported_name + ')'}")
            detected = hardware.resolve_alias(specs, acc.reported_name) if acc.type != "cpu" else None
            if spec.backend != "cpu" and detected is not None and detected.name != spec.name:
                warnings.append(f"--device={spec.name} but the device reports {acc.reported_name!r} ({detected.name}): "
                                f"MFU/MBU use {spec.name}'s peaks")
            return spec, warnings
        if acc.type == "cpu":
            return specs["cpu"], warnings
        spec = hardware.resolve_alias(specs, acc.reported_name)
        if spec is None:
            spec = hardware.HardwareSpec(hardware.slug(acc.reported_name), title=acc.reported_name, backend=acc.type)
            warnings.append(f"no hardware spec for {acc.reported_name!r}: rows go to {spec.name}.db without MFU/MBU; "
                            f"add a spec with --opperf-hardware=FILE")
        return spec, warnings

    def _torch_device(self):
        import torch

        if self.spec.backend == "cpu":
            return torch.device("cpu")
        return torch.device(self.accelerator.type, torch.accelerator.current_device_index())

    def _capability(self) -> tuple:
        if self.device.type != "cuda":
            return (0, 0)
        import torch

        return torch.cuda.get_device_capability(self.device)

    def _check_timer(self) -> None:
        if self.settings.timer == "auto":
            return
        reason = timing.unsupported(self.settings.timer, self.device.type)
        if reason:
            raise pytest.UsageError(f"--opperf-timer={self.settings.timer}: {reason}, and this session runs on "
                                    f"{self.device.type}")

    def before_first_case(self, items: list) -> None:
        """Before this process's first case, when its cases are bench cases: one Triton cache
        directory for the whole sweep (pin_triton_cache), and the profiler's once-per-process start
        (timing.start_profiler). A failed start is noted in the summary and left to the first case's
        sampling, which meets it again and fails as that case."""
        if not any("bench" in getattr(item, "fixturenames", ()) for item in items):
            return  # not a sweep (a project's own tests with the plugin installed): nothing to do
        pin_triton_cache()
        try:
            self.profiler_start_s = timing.start_profiler(self.device.type, self.settings.timer)
        except Exception as exc:  # noqa: BLE001  (the cases report it)
            # In the summary: pytest's warning capture does not cover the run loop.
            self.notes.append(f"WARNING: starting the profiler before the first case failed "
                              f"({type(exc).__name__}: {exc}); the first case's sampling started it")

    def monitor(self) -> devstate.Monitor:
        """This process's device-state monitor (NVML), opened on first use."""
        if self._monitor is None:
            self._monitor = devstate.open_monitor(self.device)
        return self._monitor

    def clock_warmer(self) -> clocks.ClockWarmer:
        """This process's clock warm-up (--opperf-clock-warmup), made on first use."""
        if self._clock_warmer is None:
            self._clock_warmer = clocks.open_warmer(self.settings, self.device, self.monitor())
        return self._clock_warmer

    def cache_bytes(self) -> Optional[int]:
        if self.device.type == "cuda":
            import torch

            return torch.cuda.get_device_properties(self.device).L2_cache_size
        return int(self.spec.l2_mbytes * 1e6) if self.spec.l2_mbytes else None

    def memory_budget(self) -> tuple[Optional[float], str]:
        """(bytes a case may use or None, where the number comes from); read once, at first use."""
        if self._memory_budget is None:
            self._memory_budget = budget.device_budget(self.settings, self.device)
        return self._memory_budget

    @property
    def db_path(self) -> Path:
        path = (self.settings.results_dir / f"{self.spec.name}.db").resolve()
        if path.parent != self.settings.results_dir.resolve():
            raise pytest.UsageError(f"device name {self.spec.name!r} would leave the results directory")
        return path

    @property
    def rescue_path(self) -> Path:
        return storage.rescue_path(self.db_path)

    def dtypes_of(self, case: Case) -> DTypes:
        return _dtypes(case.dtype_in, case.dtype_out)

    # --- baseline -------------------------------------------------------------------------

    def _load_gate(self) -> Optional[Gate]:
        s = self.settings
        if s.report_md_file is not None and s.baseline_file is None:
            raise pytest.UsageError(f"--opperf-report-md={s.report_md_file}: reports a gate; give --opperf-baseline=FILE too")
        if s.baseline_file is None:
            return None
        return Gate(self._read_baseline(s.baseline_file, "--opperf-baseline"), s.gate_rule, s.max_regression)

    def _load_save_target(self) -> Optional[Baseline]:
        """The baseline a --opperf-save-baseline run merges into: checked now, before anything runs."""
        path = self.settings.save_baseline_file
        if path is None or not path.exists():
            return None
        return self._read_baseline(path, "--opperf-save-baseline")

    def _read_baseline(self, path: Path, flag: str) -> Baseline:
        try:
            baseline = Baseline.load(path)
        except BaselineError as exc:
            raise pytest.UsageError(f"{flag}: {exc}") from None
        if baseline.device != self.spec.name:
            # One file per device: another device's times would fail (or pass) every case for no reason.
            raise pytest.UsageError(f"{flag}={path}: the baseline is for device {baseline.device!r} but this run "
                                    f"measures {self.spec.name!r}; use {self.spec.name}'s baseline "
                                    f"(`opperf compare` compares devices)")
        return baseline

    def judge(self, case: Case, record: dict) -> Optional[dict]:
        """Worker side: the gate's verdict on a measured case, or None without a baseline."""
        if self.gate is None:
            return None
        scale = self.reference_factor if self.settings.normalize == "reference" else None
        verdict = self.gate.judge_record(record, self.threshold_of.get(case), scale)
        return verdict if self.confirming is None else combine(self.confirming, verdict)

    @property
    def input_seed(self) -> int:
        """The seed of the inputs: another one in each confirmation round, so re-measurements get fresh data."""
        return self.settings.seed + (len(self.confirming) * 1_000_003 if self.confirming else 0)

    def reference_timer(self) -> str:
        return self.settings.timer if self.settings.timer != "auto" else timing.default_timer(self.device.type)

    def set_reference(self, timings: dict) -> None:
        """A process that runs cases timed the reference kernels: the drift its next verdicts divide out."""
        if self.gate is not None:
            self.reference_factor = drift.factor(timings, self.gate.baseline.reference)

    def add_reference(self, reference: Optional[dict]) -> None:
        """Controller: one process's reference timings (its start and end)."""
        if reference:
            self.references.append(reference)

    def finish(self) -> None:
        """Controller, at the session's end: the last rows, the pytest-benchmark export, then the gate
        report, report files and baseline."""
        self.flush()
        s = self.settings
        if self.config.option.collectonly:
            return  # collecting measures nothing: no export, no verdicts, no baseline, no report
        if s.benchmark_json is not None:
            try:
                count = benchjson.write(s.benchmark_json, self.records, self.run_row(), self.rootpath)
                self.notes.append(f"{count} benchmarks written to {s.benchmark_json} (pytest-benchmark JSON)")
            except OSError as exc:
                self.notes.append(f"ERROR: cannot write {s.benchmark_json}: {exc}")
        if s.html_file is not None:
            from pytest_opperf.view.html import session_report  # the view layer, only when asked for

            gate = run_report(self.records, self.run_row(), None) if self.gate is not None else None
            stored = None if s.sample_only or self.rescued or self.pending else self.db_path
            self.notes.append(session_report(s.html_file, stored, gate, s.hardware_file))
        if not (self.gate or s.save_baseline_file or s.report_json_file):
            return
        run = self.run_row()
        if self.gate is not None:
            verdicts = [r["gate"] for r in self.records if r.get("gate")]
            machine = drift.summary(self.gate.baseline.reference, self.references, verdicts, s.max_regression,
                                    s.normalize)
            self.comparison = Comparison.build(self.gate.baseline, verdicts, s.gate_rule, s.max_regression,
                                               self.spec.name, run, machine)
        if s.save_baseline_file is not None:
            self._save_baseline(s.save_baseline_file, run)
        if s.report_json_file is not None:
            text = json.dumps(run_report(self.records, run, self.comparison), indent=2) + "\n"
            self._write(s.report_json_file, text, "JSON report")
        if self.comparison is not None:
            markdown = self.comparison.markdown() + "\n"
            if s.report_md_file is not None:
                self._write(s.report_md_file, markdown, "markdown report")
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                self._write(Path(summary), markdown, "markdown report", append=True)

    def _save_baseline(self, path: Path, run: dict) -> None:
        if not self.records:
            self.notes.append(f"baseline: nothing was measured; {path} left as it was")
            return
        entries = [entry_from_record(r, run.get("git_commit")) for r in self.records]
        reference = drift.baseline_entry([r.get("start") for r in self.references])
        old = self.baseline_to_update
        if old is not None and old.reference and set(old.entries) - {case_key(e) for e in entries}:
            # A refresh of some cases (-k) keeps the machine's reference: it describes the run that
            # measured the rest, and leaving the header alone keeps the file's diff to those cases.
            reference = {}
        fresh = Baseline.from_entries(self.spec.name, run, entries, str(path), reference)
        keep = self.settings.baseline_runs
        merged = self.baseline_to_update.merged(fresh, keep) if self.baseline_to_update else fresh
        kept = len(merged.entries) - len(fresh.entries)
        try:
            merged.save(path)
        except OSError as exc:
            self.notes.append(f"ERROR: baseline not written to {path}: {exc}")
            return
        runs = [len(runs_of(merged.entries[k])) for k in fresh.entries]
        held = f"{min(runs)}" if min(runs) == max(runs) else f"{min(runs)}-{max(runs)}"
        self.notes.append(f"baseline: {len(fresh.entries)} cases written to {path}"
                          + (f" ({kept} other cases kept)" if kept else "")
                          + f"; runs per case: {held} (keeping the last {keep})")

    def _write(self, path: Path, text: str, what: str, append: bool = False) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a" if append else "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            self.notes.append(f"ERROR: {what} not written to {path}: {exc}")
            return
        self.notes.append(f"{what} {'appended to' if append else 'written to'} {path}")

    # --- records --------------------------------------------------------------------------

    def add_record(self, record: dict) -> None:
        """Controller side: derive the metrics, keep the row, checkpoint now and then."""
        record = dict(record)
        record.update(metrics.derive(record["flops"], record["bytes"], record["time_us"], self.spec,
                                     record["peak_dtype"], record["peak_kind"]))
        record.update(self.calibration.attainable(record))
        record["run_id"] = self.run_id
        self.records.append(record)
        self.pending.append(record)
        if time.monotonic() - self.last_flush >= self.settings.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write the pending rows (a checkpoint, or the last write); what the database refuses is rescued.

        Each row ends in one place: rows saved to the rescue file leave `pending`, so a later
        checkpoint that succeeds does not write them again, and the rescue file holds exactly
        the rows the database lacks (restored by `opperf merge DB RESCUE`).
        """
        self.last_flush = time.monotonic()
        if self.settings.sample_only or not self.pending:
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
        for table, reason in result.refused.items():
            self._rescue([r for r in batch if r["op"] == table], run, reason)

    def _rescue(self, records: list[dict], run: dict, reason: str) -> None:
        self.store_errors[reason] = None
        try:
            storage.rescue(self.rescue_path, self.db_path, reason, run, records)
        except OSError as exc:
            # Nowhere to put them now: the next checkpoint tries the database, then this file, again.
            self.store_errors[f"{self.rescue_path}: cannot write the rescue file: {exc}"] = None
            self.pending = records + self.pending
            return
        self.rescued += len(records)

    @property
    def store_failed(self) -> bool:
        """Some measured rows are not in the database: rescued, or (both files failing) still pending."""
        return not self.settings.sample_only and bool(self.rescued or self.pending)

    def exit_status(self, status: int) -> int:
        """The session's exit status once the rows are written: a run whose rows are not all in the
        database fails, as pytest's INTERNAL_ERROR (README: 'The database')."""
        if self.store_failed and status in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return pytest.ExitCode.INTERNAL_ERROR
        return status

    def run_row(self) -> dict:
        libraries = {}
        for record in self.records:
            library = BACKENDS[(record["op"], record["backend"])].library if (record["op"], record["backend"]) in BACKENDS else record["backend"]
            libraries[library] = record["backend_version"]
        if self._environment is None:
            # Read once: it runs git and NVML, and a run row is written at every checkpoint
            # (before every case when --opperf-timeout is set).
            self._environment = environment.describe(self.rootpath, self.spec, self.accelerator, {},
                                                     list(self.config.invocation_params.args))
        row = {"run_id": self.run_id, "started_at": self.started_at, "ended_at": _now(), **self._environment}
        row["started_unix_s"] = phases.LOADED_UNIX_S  # where `opperf timeline` starts the session's lanes
        row["libraries"] = json.dumps(libraries, sort_keys=True)
        row["workers"] = self._worker_count()
        row["settings"] = _settings_text(self.settings)
        row.update(clocks.run_columns(self.records))
        row.update(self.calibration.run_fields())
        return row

    def _worker_count(self) -> int:
        n = getattr(self.config.option, "numprocesses", None)
        return int(n) if isinstance(n, int) else 0

    # --- terminal -------------------------------------------------------------------------

    def header(self) -> list[str]:
        s = self.settings
        lines = [f"opperf: device {self.spec.name} ({self.accelerator.reported_name}, torch {self.device}), "
                 f"timer {s.timer}, cache {s.cache}, target {s.target_rel:.2%} within {s.budget_s:g}s/case"]
        if self.gate is not None:
            lines.append(f"opperf: gate: {len(self.gate.baseline.entries)} cases in {self.gate.baseline.source}, "
                         f"rule {s.gate_rule}, max regression {pct(s.max_regression)} unless a config sets its own")
            lines.append(f"opperf: gate: confirm {s.confirm} (re-measurements of a case that looks regressed), "
                         f"normalize {s.normalize}")
        if s.sample_only:
            lines.append("opperf: sample-only: no database is written")
        else:
            lines.append(f"opperf: rows -> {self.db_path}")
            if self.rescue_path.exists():
                lines.append(f"opperf: warning: {self.rescue_path} holds rows that an earlier run could not "
                             f"store: restore them with `opperf merge {self.db_path} {self.rescue_path}`, then "
                             f"delete it")
        lines += [f"opperf: {line}" for line in self.calibration.lines]
        return lines + [f"opperf: warning: {w}" for w in self.warnings]

    def summary(self, write) -> None:
        for note in self.notes:
            write(f"opperf: {note}")
        if not self.records and not self.store_errors:
            return
        limit = self.settings.summary_rows
        rows = self.records[:limit] if limit else []
        attained = self.calibration.current is not None  # aMFU, aMBU: against the measured ceilings
        if rows:
            write(f"{'case':<60} {'time_us':>10} {'GFLOP/s':>10} {'GB/s':>9} {'MFU':>6} {'MBU':>6} "
                  + (f"{'aMFU':>6} {'aMBU':>6} " if attained else "") + f"{'CV':>6}  flags")
            for r in rows:
                flags = []
                if r["unstable"]:
                    flags.append("unstable")
                if not r["target_met"]:
                    flags.append("target-missed")
                if r.get("throttled"):
                    flags.append(f"throttled({r['throttle_reasons']})")
                name = r["test_id"].split("::")[-1]
                write(f"{name[:60]:<60} {r['time_us']:>10.2f} {_num(r['gflops'], 10, 1)} {_num(r['gbytes_per_s'], 9, 1)} "
                      f"{_pct(r['mfu'])} {_pct(r['mbu'])} "
                      + (f"{_pct(r.get('mfu_attainable'))} {_pct(r.get('mbu_attainable'))} " if attained else "")
                      + f"{r['cv']:>6.3f}  {' '.join(flags)}")
            if len(self.records) > limit:
                write(f"... {len(self.records) - limit} more rows (--opperf-summary=N shows more)")
        unstable = sum(1 for r in self.records if r["unstable"])
        missed = sum(1 for r in self.records if not r["target_met"])
        throttled = sum(1 for r in self.records if r.get("throttled"))
        tail = [f"{len(self.records)} cases measured"]
        if unstable:
            tail.append(f"{unstable} unstable (CV > 0.15)")
        if missed:
            tail.append(f"{missed} missed the {self.settings.target_rel:.1%} target within the budget")
        if throttled:
            tail.append(f"{throttled} throttled (clocks held down during the case: see throttle_reasons)")
        write("opperf: " + ", ".join(tail))
        for line in self.calibration.summary_lines():
            write(f"opperf: {line}")
        harness = phases.summary_line(self.records, phases.LOADED_UNIX_S, self.profiler_start_s)
        if harness:
            write(f"opperf: {harness}")
        if self.settings.sample_only:
            write("opperf: sample-only: nothing written")
            return
        if self.written or not self.store_errors:
            write(f"opperf: {self.written} rows written to {self.db_path} (run {self.run_id})")
        for reason in self.store_errors:
            first, *rest = reason.splitlines()
            write(f"opperf: ERROR: {first}")
            for line in rest:
                write(f"opperf: {line}")
        if self.rescued:
            write(f"opperf: ERROR: {self.rescued} rows are not in the database: they were saved to "
                  f"{self.rescue_path}; once fixed, restore them with: opperf merge {self.db_path} {self.rescue_path}")
        if self.pending:
            write(f"opperf: ERROR: {len(self.pending)} rows were lost: neither the database nor the rescue file "
                  f"could be written")

    def gate_summary(self, write) -> None:
        """The gate's table: cases that are not the same as their baseline, then the verdict line."""
        for line in self.comparison.lines(self.settings.summary_rows):
            write(line, red=line.startswith("gate: FAILED"), bold=line.startswith("gate:"))


def _settings_text(s) -> str:
    text = (f"timer={s.timer} cache={s.cache} kernel_names={'auto' if s.kernel_names else 'off'} "
            f"target={s.target_rel} min_samples={s.min_samples} "
            f"max_samples={s.max_samples} budget_s={s.budget_s} warmup_s={s.warmup_s} seed={s.seed} "
            f"clock_warmup={s.clock_warmup_s or ('auto' if s.clock_warmup_auto else 'off')}")
    if s.shard is not None:
        text += f" shard={s.shard[0]}/{s.shard[1]}"
    return text


def _num(value, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def _pct(value) -> str:
    return f"{'-':>6}" if value is None or math.isnan(value) else f"{value:>6.1%}"


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
    process, where the variable is unset. Every Triton kernel compiled after that in the sweep
    (ours, liger's, a user's) is looked up there, not where its first run compiled it: on an H100
    (2026-11-23), with both caches filled, a new specialisation of our rmsnorm took 107-114 ms
    after a torch.compile call against 1-2 ms without one (docs/benchmarks.md). Pinned before
    the first case, Triton and Inductor keep one directory. Triton's rule for its default:
    $TRITON_HOME, else the home directory, then .triton/cache.
    """
    environ = os.environ if environ is None else environ
    if environ.get("TRITON_CACHE_DIR"):
        return None
    home = environ.get("TRITON_HOME") or os.path.expanduser("~/")
    path = os.path.join(home, ".triton", "cache")
    environ["TRITON_CACHE_DIR"] = path
    return path
