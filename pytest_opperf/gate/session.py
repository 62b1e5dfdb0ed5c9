"""The gate's part of a run: the baseline it judges against, the verdict on each measured case,
the machine's drift, and at the end the comparison, the reports and the refreshed baseline.

Every process that runs cases holds one (verdicts are made where the case ran); the controller's
also gathers each process's reference timings and writes the files. It knows nothing of pytest:
a bad baseline is a BaselineError, which the run turns into a usage error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from pytest_opperf.case import Case
from pytest_opperf.gate import drift
from pytest_opperf.gate.baseline import Baseline, BaselineError, case_key
from pytest_opperf.gate.noise import runs_of
from pytest_opperf.gate.report import Comparison, run_report
from pytest_opperf.gate.rules import Gate, pct
from pytest_opperf.record import Record

CONFIRM_SEED_STEP = 1_000_003  # each confirmation round draws other inputs


@dataclass(frozen=True)
class GateSettings:
    """The options the gate reads (docs/options.md: the gate)."""

    baseline_file: Optional[Path] = None  # --opperf-baseline
    save_baseline_file: Optional[Path] = None  # --opperf-save-baseline
    report_json_file: Optional[Path] = None
    report_md_file: Optional[Path] = None
    gate_rule: str = "ci"
    max_regression: float = 0.05
    inconclusive_fails: bool = False
    normalize: str = "off"
    confirm: int = 1
    baseline_runs: int = 5

    @classmethod
    def of(cls, settings) -> "GateSettings":
        """The gate's part of the run's settings (any object with these attributes)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


class GateSession:
    def __init__(self, settings: GateSettings, device_name: str):
        self.settings = settings
        self.device_name = device_name
        if settings.report_md_file is not None and settings.baseline_file is None:
            raise BaselineError(f"--opperf-report-md={settings.report_md_file}", "",
                                "reports a gate; give --opperf-baseline=FILE too")
        self.gate: Optional[Gate] = None
        if settings.baseline_file is not None:
            baseline = self._read(settings.baseline_file, "--opperf-baseline")
            self.gate = Gate(baseline, settings.gate_rule, settings.max_regression,
                             strict=settings.inconclusive_fails)
        save = settings.save_baseline_file
        # The baseline a --opperf-save-baseline run merges into: checked now, before anything runs.
        self.to_update: Optional[Baseline] = (self._read(save, "--opperf-save-baseline")
                                              if save is not None and save.exists() else None)
        self.threshold_of: dict = {}  # Case -> (max_regression, where it was set) from its config: set_threshold
        self.confirming: Optional[list] = None  # re-measuring a case: its earlier measurements (run/gateloop.py)
        self.reference_factor: Optional[float] = None  # this process's machine drift against the baseline
        self.factors: list = []  # this process's reference factors so far (start, then end)
        self.references: list[dict] = []  # controller: each process's reference timings (start, end)
        self.comparison: Optional[Comparison] = None

    def _read(self, path: Path, flag: str) -> Baseline:
        try:
            baseline = Baseline.load(path)
        except BaselineError as exc:
            raise BaselineError(flag, "", str(exc)) from None
        if baseline.device != self.device_name:
            # One file per device: another device's times would fail (or pass) every case for no reason.
            raise BaselineError(f"{flag}={path}", "", f"the baseline is for device {baseline.device!r} but this run "
                                f"measures {self.device_name!r}; use {self.device_name}'s baseline "
                                f"(`opperf compare` compares devices)")
        return baseline

    def set_threshold(self, case: Case, threshold: Optional[tuple]) -> None:
        """Collection: the case's own max_regression from its config, (fraction, where it was set)."""
        if threshold is not None:
            self.threshold_of[case] = threshold

    @property
    def active(self) -> bool:
        """The run judges its cases, or refreshes a baseline: the gate's run loop is needed."""
        return self.gate is not None or self.settings.save_baseline_file is not None

    @property
    def seed_offset(self) -> int:
        """Added to the inputs' seed: another one in each confirmation round, so re-measurements get fresh data."""
        return len(self.confirming) * CONFIRM_SEED_STEP if self.confirming else 0

    def judge(self, case: Case, record: dict) -> Optional[dict]:
        """The verdict on a measured case (where it ran), or None without a baseline."""
        if self.gate is None:
            return None
        scale = self.reference_factor if self.settings.normalize == "reference" else None
        moved = drift.uncertainty(self.factors, self.settings.normalize)
        unsteady = (self.gate.baseline.reference or {}).get(drift.UNSTEADY)
        unknown = (f"the baseline's reference kernels were timed on an unsteady machine ({unsteady}): this "
                   f"machine's speed against it is unknown" if unsteady else None)
        slower = drift.slowest(self.factors, self.settings.normalize)
        verdict = self.gate.judge_record(record, self.threshold_of.get(case), scale, moved, unknown, slower)
        return verdict if self.confirming is None else combine(self.confirming, verdict)

    def failure_message(self, verdict: dict) -> str:
        return self.gate.failure_message(verdict)

    def set_reference(self, timings: dict) -> None:
        """A process that runs cases timed the reference kernels: the drift its next verdicts divide out."""
        if self.gate is not None:
            self.reference_factor = drift.factor(timings, self.gate.baseline.reference)
            self.factors.append(self.reference_factor)

    def add_reference(self, reference: Optional[dict]) -> None:
        """Controller: one process's reference timings (its start and end)."""
        if reference:
            self.references.append(reference)

    def header_lines(self) -> list[str]:
        s = self.settings
        if self.gate is None:
            return []
        return [f"gate: {len(self.gate.baseline.entries)} cases in {self.gate.baseline.source}, rule {s.gate_rule}, "
                f"max regression {pct(s.max_regression)} unless a config sets its own",
                f"gate: confirm {s.confirm} (re-measurements of a case that looks regressed), normalize {s.normalize}, "
                f"inconclusive {'fail' if self.gate.strict else 'pass'}"]

    def finish(self, records: list[dict], run: dict) -> list[str]:
        """Controller, at the end: the comparison, the baseline and report files; notes for the summary."""
        s = self.settings
        notes: list[str] = []
        if not (self.gate or s.save_baseline_file or s.report_json_file):
            return notes
        if self.gate is not None:
            verdicts = [r["gate"] for r in records if r.get("gate")]
            machine = drift.summary(self.gate.baseline.reference, self.references, verdicts, s.max_regression,
                                    s.normalize)
            self.comparison = Comparison.build(self.gate.baseline, verdicts, s.gate_rule, s.max_regression,
                                               self.device_name, run, machine)
        if s.save_baseline_file is not None:
            notes.append(self._save_baseline(s.save_baseline_file, records, run))
        if s.report_json_file is not None:
            text = json.dumps(run_report(records, run, self.comparison), indent=2) + "\n"
            notes.append(write_text(s.report_json_file, text, "JSON report"))
        if self.comparison is not None:
            markdown = self.comparison.markdown() + "\n"
            if s.report_md_file is not None:
                notes.append(write_text(s.report_md_file, markdown, "markdown report"))
            summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if summary:
                notes.append(write_text(Path(summary), markdown, "markdown report", append=True))
        return notes

    def _save_baseline(self, path: Path, records: list[dict], run: dict) -> str:
        if not records:
            return f"baseline: nothing was measured; {path} left as it was"
        # A contended row timed the neighbours too: said, so that a baseline is taken again on a quiet machine.
        contended = sum(1 for r in records if r.get("contended"))
        warning = (f"; WARNING: {contended} of them contended (other processes competed for the machine): take the "
                   f"baseline on a quiet machine" if contended else "")
        entries = [Record(r).to_baseline_entry(run.get("git_commit")) for r in records]
        reference = drift.baseline_entry(self.references)
        unsteady = reference.get(drift.UNSTEADY)
        old = self.to_update
        if old is not None and old.reference and set(old.entries) - {case_key(e) for e in entries}:
            # A refresh of some cases (-k) keeps the machine's reference: it describes the run that
            # measured the rest, and leaving the header alone keeps the file's diff to those cases.
            reference = {}
        fresh = Baseline.from_entries(self.device_name, run, entries, str(path), reference)
        keep = self.settings.baseline_runs
        merged = old.merged(fresh, keep) if old else fresh
        if unsteady:
            kept_old = merged.reference and not merged.reference.get(drift.UNSTEADY)
            warning += (f"; WARNING: the machine was unsteady ({unsteady}): "
                        + ("the baseline keeps its earlier reference timings" if kept_old else
                           "its reference timings are marked unsteady, and runs against it will not compare the "
                           "machine with them; save it again on a quiet machine"))
        kept = len(merged.entries) - len(fresh.entries)
        try:
            merged.save(path)
        except OSError as exc:
            return f"ERROR: baseline not written to {path}: {exc}"
        runs = [len(runs_of(merged.entries[k])) for k in fresh.entries]
        held = f"{min(runs)}" if min(runs) == max(runs) else f"{min(runs)}-{max(runs)}"
        return (f"baseline: {len(fresh.entries)} cases written to {path}"
                + (f" ({kept} other cases kept)" if kept else "")
                + f"; runs per case: {held} (keeping the last {keep})" + warning)


def write_text(path: Path, text: str, what: str, append: bool = False) -> str:
    """Write a report file; the summary's note on it (an ERROR line when it could not be written)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if append else "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        return f"ERROR: {what} not written to {path}: {exc}"
    return f"{what} {'appended to' if append else 'written to'} {path}"


def summary_of(verdict: dict, when: str) -> dict:
    """One measurement as the report lists it."""
    return {"when": when, "time_us": verdict["time_us"], "ratio": verdict["ratio"], "verdict": verdict["verdict"],
            "fails": verdict.get("fails", verdict["verdict"] == "regressed")}


def combine(earlier: list[dict], verdict: dict) -> dict:
    """The verdict of a re-measurement, carrying the measurements before it.

    >>> first = {"when": "in its turn", "time_us": 130.0, "ratio": 1.3, "verdict": "regressed"}
    >>> v = combine([first], {"time_us": 101.0, "ratio": 1.01, "verdict": "same", "notes": ""})
    >>> v["confirm"], v["notes"]
    ('cleared', 'not confirmed: 1.300x in its turn, 1.010x (same) re-measured at the end with fresh inputs')
    """
    now = summary_of(verdict, "re-measured at the end")
    measurements = [*earlier, now]
    confirmed = verdict.get("fails", verdict["verdict"] == "regressed")
    steps = ", ".join(f"{m['ratio']:.3f}x" + ("" if confirmed or m is not now else f" ({m['verdict']})")
                      + (f" {m['when']}" if m is measurements[0] or m is now else "") for m in measurements)
    text = ("confirmed: " if confirmed else "not confirmed: ") + steps + " with fresh inputs"
    notes = "; ".join(n for n in (verdict.get("notes"), text) if n)
    return {**verdict, "measurements": measurements, "confirm": "confirmed" if confirmed else "cleared",
            "notes": notes}
