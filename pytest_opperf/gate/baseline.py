"""Baseline files: reference timings per device, read, validated, merged and written for review.

A baseline is a JSON file, one per device, written for review in a pull request: a header
(device, environment) and one case per line, sorted, so re-measuring one case changes one line::

    {
      "format": "pytest-opperf-baseline/1",
      "device": "h100",
      "environment": {
        "torch": "2.13.0",
        ...
      },
      "cases": [
        {"op": "gemm", "backend": "torch", "dtype_in": "bf16", "dtype_out": "bf16", "params": {"m": 4096, ...}, "time_us": 151.2, ...},
        ...
      ]
    }

A case is matched by its identity: op, backend, dtypes, parameters and knobs. What it was
measured with (backend version, timer, cache) is not part of the match: a difference there is
reported next to the verdict (a timer or cache difference makes the two times incomparable).
The verdict itself is gate/rules.py's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pytest_opperf import files
from pytest_opperf.files import short
from pytest_opperf.gate import noise as noise_model
from pytest_opperf.gate.drift import UNSTEADY
from pytest_opperf.case import Case
from pytest_opperf.record import Record, plain, significant

if TYPE_CHECKING:
    from pytest_opperf.store.results import ResultsDB

FORMAT = "pytest-opperf-baseline/1"
# Environment facts a baseline keeps; a difference is reported, never gated on. The host and the
# commit are left out: they change with every CI runner and would touch the file on every update.
ENV_FIELDS = ("device_reported", "accelerator", "driver", "cuda", "hip", "torch", "python", "plugin_version")
IDENTITY = ("op", "backend", "dtype_in", "dtype_out", "params", "knobs")
MEASUREMENT = ("time_us", "time_us_p95", "ci_rel", "cv", "samples", "runs")
CONTEXT = ("backend_version", "timer", "cache", "commit", "created_at")
FIELDS = IDENTITY + MEASUREMENT + CONTEXT


class BaselineError(Exception):
    """A baseline problem, phrased for the user: 'file: key: what was expected'."""

    def __init__(self, path: Any, key: str, message: str):
        self.path, self.key = str(path), key
        super().__init__(f"{self.path}: {key}: {message}" if key else f"{self.path}: {message}")


# --- cases -----------------------------------------------------------------------------------


def case_key(entry: dict) -> str:
    """The match key of a case: its identity as a canonical string.

    >>> case_key({"op": "add", "backend": "torch", "dtype_in": "fp32", "dtype_out": "fp32", "params": {"n": 4096.0}})
    '["add", "torch", "fp32", "fp32", [["n", 4096]], []]'
    """
    params = sorted((k, plain(v)) for k, v in entry["params"].items())
    knobs = sorted((k, plain(v)) for k, v in (entry.get("knobs") or {}).items())
    return json.dumps([entry["op"], entry["backend"], entry["dtype_in"], entry["dtype_out"], params, knobs])


def case_name(entry: dict) -> str:
    """What people read: the op and the case id pytest shows, e.g. 'gemm[torch-bf16-m=4096-n=4096-k=4096]'."""
    case = Case(entry["op"], entry["backend"], None, entry["dtype_in"], entry["dtype_out"],
                tuple(entry["params"].items()), tuple((entry.get("knobs") or {}).items()))
    return f"{entry['op']}[{case.id}]"


def _sort_key(entry: dict) -> tuple:
    # Numbers sort as numbers (n=4096 before n=16384) and apart from strings, so a new case lands
    # next to its neighbours and the file's diff stays local.
    def typed(v):
        return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))

    return (entry["op"], entry["backend"], entry["dtype_in"], entry["dtype_out"],
            tuple(typed(v) for v in entry["params"].values()),
            tuple((k, typed(v)) for k, v in sorted((entry.get("knobs") or {}).items())))


# --- the file --------------------------------------------------------------------------------


@dataclass
class Baseline:
    device: str
    environment: dict = field(default_factory=dict)
    entries: dict = field(default_factory=dict)  # case_key -> entry
    source: str = ""  # the file or database it came from, for messages
    reference: dict = field(default_factory=dict)  # the machine's reference kernels: gate.drift

    @classmethod
    def from_entries(cls, device: str, environment: dict, entries: list[dict], source: str = "",
                     reference: Optional[dict] = None) -> "Baseline":
        """Later entries of the same case replace earlier ones."""
        return cls(device, {k: environment.get(k) for k in ENV_FIELDS}, {case_key(e): e for e in entries}, source,
                   dict(reference or {}))

    @classmethod
    def load(cls, path: Path) -> "Baseline":
        """Read and validate a baseline file; every problem is a BaselineError naming the file and key."""
        path = Path(path)
        try:
            raw = files.load_json(path)
        except files.FileError as exc:
            raise BaselineError(path, "", exc.reason) from None
        if not isinstance(raw, dict):
            raise BaselineError(path, "", f"expected a JSON object with 'format', 'device', 'cases', got {type(raw).__name__}")
        unknown = sorted(set(raw) - {"format", "device", "environment", "reference", "cases"})
        if unknown:
            raise BaselineError(path, unknown[0], "unknown key; expected format, device, environment, reference, cases")
        if raw.get("format") != FORMAT:
            raise BaselineError(path, "format", f"expected {FORMAT!r}, got {short(raw.get('format'))}")
        device = raw.get("device")
        if not isinstance(device, str) or not device:
            raise BaselineError(path, "device", f"expected a device name, got {short(device)}")
        environment = raw.get("environment", {})
        if not isinstance(environment, dict):
            raise BaselineError(path, "environment", "expected an object of environment facts")
        reference = raw.get("reference", {})
        _check_reference(path, reference)
        cases = raw.get("cases")
        if not isinstance(cases, list):
            raise BaselineError(path, "cases", "expected a list of cases")
        entries: dict[str, dict] = {}
        where: dict[str, int] = {}
        for i, entry in enumerate(cases):
            _check_entry(path, f"cases[{i}]", entry)
            key = case_key(entry)
            if key in entries:
                raise BaselineError(path, f"cases[{i}]", f"{case_name(entry)} is given twice (also cases[{where[key]}])")
            entries[key], where[key] = entry, i
        return cls(device, environment, entries, str(path), reference)

    def merged(self, newer: "Baseline", keep: int = 1) -> "Baseline":
        """This baseline with newer's cases joining its own, and newer's environment.

        A case in both keeps the medians of its last `keep` runs (keep=1: newer's replaces it);
        its time_us becomes their median, the other fields are newer's. The machine reference
        keeps its last runs the same way.
        """
        entries = dict(self.entries)
        for key, entry in newer.entries.items():
            entries[key] = appended(self.entries.get(key), entry, keep)
        reference = appended_reference(self.reference, newer.reference, keep)
        return Baseline(newer.device, dict(newer.environment), entries, newer.source, reference)

    def dumps(self) -> str:
        """The file text: stable key order, one case per line, cases sorted by identity."""
        env = {k: self.environment.get(k) for k in ENV_FIELDS}
        cases = sorted(self.entries.values(), key=_sort_key)
        lines = ["{", f'  "format": {json.dumps(FORMAT)},', f'  "device": {json.dumps(self.device)},',
                 '  "environment": {']
        lines += [f"    {json.dumps(k)}: {json.dumps(v)}{',' if i < len(env) - 1 else ''}" for i, (k, v) in enumerate(env.items())]
        lines.append("  },")
        if self.reference:
            lines.append(f'  "reference": {json.dumps(self.reference)},')
        lines.append('  "cases": [')
        for i, entry in enumerate(cases):
            ordered = {k: entry[k] for k in FIELDS if k in entry}
            lines.append(f"    {json.dumps(ordered)}{',' if i < len(cases) - 1 else ''}")
        lines += ["  ]", "}"]
        return "\n".join(lines) + "\n"

    def save(self, path: Path) -> None:
        """Write atomically: a run killed mid-write leaves the previous file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.dumps(), encoding="utf-8")
        tmp.replace(path)


def appended(old: Optional[dict], new: dict, keep: int) -> dict:
    """new, carrying the medians of old's last runs when it measured the same way.

    A different timer, cache state or backend version starts the history afresh: runs measured
    otherwise say nothing about this run's noise. The same measurement read twice (`opperf
    baseline` on an unchanged database) is not a second run.
    """
    if old is None or keep <= 1 or any(old.get(f) != new.get(f) for f in ("timer", "cache", "backend_version")):
        return _single(new)
    same = old.get("created_at") is not None and old.get("created_at") == new.get("created_at")
    history = noise_model.runs_of(old)[:-1] if same else noise_model.runs_of(old)
    runs = (history + [new["time_us"]])[-keep:]
    if len(runs) == 1:
        return _single(new)
    return {**new, "runs": runs, "time_us": significant(noise_model.reference_time(runs), 6)}


def _single(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "runs"}


def appended_reference(old: dict, new: dict, keep: int) -> dict:
    """The reference kernels' times with new's appended (same timer), or new's alone. An unsteady
    reading (marked UNSTEADY) never joins or replaces steady ones: the old are kept as they are;
    a steady reading replaces an unsteady one."""
    if not new or (new.get(UNSTEADY) and old and not old.get(UNSTEADY)):
        return dict(old)
    if not old or keep <= 1 or old.get("timer") != new.get("timer") or old.get(UNSTEADY):
        return dict(new)
    out = {"timer": new["timer"]}
    for name, times in new.items():
        if name != "timer":
            out[name] = (list(old.get(name) or []) + list(times))[-keep:]
    return out


def _check_reference(path: Path, reference: Any) -> None:
    if not isinstance(reference, dict):
        raise BaselineError(path, "reference", "expected an object: the timer and the reference kernels' times")
    for name, value in reference.items():
        if name in ("timer", UNSTEADY):
            if not isinstance(value, str):
                what = "a timer name" if name == "timer" else "why the reference timings are unsteady (text)"
                raise BaselineError(path, f"reference.{name}", f"expected {what}, got {short(value)}")
        elif not isinstance(value, list) or not value or not all(_number(v) and v > 0 for v in value):
            raise BaselineError(path, f"reference.{name}", f"expected a list of times in microseconds (> 0), got {short(value)}")
    if reference and "timer" not in reference:
        raise BaselineError(path, "reference.timer", "missing: the timer the reference kernels were timed with")


def _check_entry(path: Path, key: str, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise BaselineError(path, key, f"expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise BaselineError(path, f"{key}.{unknown[0]}", f"unknown key; expected some of {list(FIELDS)}")
    for name in ("op", "backend", "dtype_in", "dtype_out"):
        if not isinstance(entry.get(name), str) or not entry[name]:
            raise BaselineError(path, f"{key}.{name}", f"expected a name, got {short(entry.get(name))}")
    for name in ("params", "knobs"):
        value = entry.get(name, {})
        if not isinstance(value, dict) or not all(_scalar(v) for v in value.values()):
            raise BaselineError(path, f"{key}.{name}", "expected an object of name -> number or string")
    if "params" not in entry:
        raise BaselineError(path, f"{key}.params", "missing: the case's parameters")
    time_us = entry.get("time_us")
    if not _number(time_us) or not time_us > 0:
        raise BaselineError(path, f"{key}.time_us", f"expected the median time in microseconds (a number > 0), got {short(time_us)}")
    for name in ("time_us_p95", "ci_rel", "cv"):
        value = entry.get(name)
        if value is not None and (not _number(value) or value < 0):
            raise BaselineError(path, f"{key}.{name}", f"expected a number >= 0 or null, got {short(value)}")
    runs = entry.get("runs")
    if runs is not None and (not isinstance(runs, list) or not runs or not all(_number(r) and r > 0 for r in runs)):
        raise BaselineError(path, f"{key}.runs", f"expected a list of run medians in microseconds (> 0), got {short(runs)}")
    samples = entry.get("samples")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
        raise BaselineError(path, f"{key}.samples", f"expected an integer >= 1 or null, got {short(samples)}")
    for name in CONTEXT:
        if entry.get(name) is not None and not isinstance(entry[name], str):
            raise BaselineError(path, f"{key}.{name}", f"expected a string or null, got {short(entry[name])}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


# --- from a results database -----------------------------------------------------------------


def from_database(path: Path, ops: Optional[list[str]] = None) -> Baseline:
    """A baseline of the latest row of every case in a results database (optionally some ops only)."""
    from pytest_opperf.store.results import ResultsError, open_results

    path = Path(path)
    try:
        with open_results(path) as results:
            entries, latest_run = _entries_of(results, ops)
    except ResultsError as exc:
        raise BaselineError(path, "", exc.reason) from None
    if not entries:
        raise BaselineError(path, "", "has no measured cases" + (f" of op(s) {ops}" if ops else ""))
    latest_run = latest_run or {}
    device = latest_run.get("device") or path.stem
    return Baseline.from_entries(device, latest_run, entries, str(path))


def _entries_of(results: "ResultsDB", ops: Optional[list[str]]) -> tuple[list[dict], Optional[dict]]:
    """The baseline entries of an open results database's op tables, and the latest run that wrote one."""
    tables = results.op_tables()
    missing = sorted(set(ops or []) - set(tables))
    if missing:
        raise BaselineError(results.path, "", f"no table for op {missing[0]!r} (tables: {tables})")
    runs = {r["run_id"]: r for r in results.runs()}
    entries, latest_run = [], None
    for table in [t for t in tables if ops is None or t in ops]:
        params = results.params(table)
        # Oldest first: a later row of the same case (another backend version or timer) wins.
        for row in results.rows(table, order_by=("created_at", "rowid")):
            record = Record.from_row(table, params, row)
            run = runs.get(record.get("run_id")) or {}
            entries.append(record.to_baseline_entry(run.get("git_commit")))
            if run and (latest_run is None or run["started_at"] > latest_run["started_at"]):
                latest_run = run
    return entries, latest_run


def load_any(path: Path) -> Baseline:
    """A baseline file or a results database, told apart by content."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise BaselineError(path, "", f"cannot read: {exc.strerror}") from None
    if head.startswith(b"SQLite format 3"):
        return from_database(path)
    if head.lstrip()[:1] not in (b"{", b""):  # a baseline is a JSON object; say so before its parser does
        raise BaselineError(path, "", "neither a results database (SQLite) nor a baseline file (JSON)")
    return Baseline.load(path)
