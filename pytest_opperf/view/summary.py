"""`opperf report`: what a results database says, per op, for a person.

Per op: its cases, the best and worst MFU/MBU (and throughputs) with the case, which backend is
fastest on each shape and how often each wins, the unstable, throttled and target-missed rows;
and once, the runs that wrote them (device, torch, driver, commit, date).

>>> results = Results.open(Path("results/cpu.db"))             # doctest: +SKIP
>>> print(render_text(report(results, ["gemm"])))               # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from pytest_opperf.view import cases, fit, significance
from pytest_opperf.view.fit import Column
from pytest_opperf.view.overview import overview_section
from pytest_opperf.view.source import OpTable, Results, ViewError, best_by_shape, case_id, sort_key
from pytest_opperf.view.text import CEILING_NOTE, Section, fmt, fmt_of_ceiling, fmt_pct, numeric

# (column, label, format): the extremes listed per op. MFU/MBU need the device's peaks; the
# throughputs are there for devices without (a CPU), where MFU/MBU stay empty.
EXTREMES = (("mfu", "MFU", fmt_pct), ("mbu", "MBU", fmt_pct),
            ("gflops", "GFLOP/s", fmt), ("gbytes_per_s", "GB/s", fmt))
# Against the device's measured ceilings (`opperf calibrate`): empty until it has a calibration.
ATTAINABLE = (("mfu_attainable", "attainable MFU", fmt_of_ceiling),
              ("mbu_attainable", "attainable MBU", fmt_of_ceiling))


@dataclass
class Win:
    shape: str
    winner: str
    time_us: float
    runner_up: Optional[str] = None
    runner_up_us: Optional[float] = None
    not_significant: Optional[str] = None  # why the two may not differ (significance.why_not)

    @property
    def speedup(self) -> Optional[float]:
        return None if self.runner_up_us is None else self.runner_up_us / self.time_us


@dataclass
class OpSummary:
    op: str
    table: OpTable
    backends: Counter = field(default_factory=Counter)  # backend -> rows
    wins: list[Win] = field(default_factory=list)  # shapes run by two backends or more

    @classmethod
    def of(cls, table: OpTable) -> "OpSummary":
        summary = cls(table.op, table, Counter(r["backend"] for r in table.rows))
        summary.wins = fastest_per_shape(table)
        return summary

    @property
    def win_counts(self) -> Counter:
        """Wins by backend: only the shapes where the fastest is significantly faster."""
        return Counter(w.winner for w in self.wins if not w.not_significant)

    def extreme(self, column: str) -> Optional[tuple[dict, dict]]:
        """(best row, worst row) by `column`, or None when no row has it."""
        rows = [r for r in self.table.rows if r.get(column) is not None]
        if not rows:
            return None
        return max(rows, key=lambda r: r[column]), min(rows, key=lambda r: r[column])

    def flagged(self, column: str) -> list[dict]:
        return sorted((r for r in self.table.rows if r.get(column)), key=lambda r: sort_key(r, self.table.params))

    def sections(self, limit: int = 20, columns: Optional[list[str]] = None,
                 shared: Optional["SharedNotes"] = None) -> list[Section]:
        """The op's sections: what ran, the per-case table, best and worst, fastest backends, flags.
        Notes that other ops would repeat go to `shared`, said once for all of them (without it, in a
        last section of this op's)."""
        own = shared is None
        shared = SharedNotes() if own else shared
        t, params = self.table, self.table.params
        dtypes = sorted({r["dtype_in"] if r["dtype_in"] == r["dtype_out"] else f"{r['dtype_in']}-{r['dtype_out']}"
                         for r in t.rows})
        backends = ", ".join(f"{b} ({n})" for b, n in sorted(self.backends.items()))
        devices = sorted({r["device"] for r in t.rows})
        head = Section(f"{self.op}: {len(t.rows)} cases on {', '.join(devices)}", level=2, notes=[
            f"backends: {backends}", f"dtypes: {', '.join(dtypes)}", f"parameters: {', '.join(params)}"])
        out = [head, self._cases_section(limit, columns), self._extremes_section(shared),
               self._wins_section(limit, shared), self._flags_section(limit, shared)]
        if own:
            out.append(shared.section())
        return [s for s in out if s is not None]

    def _cases_section(self, limit: int, columns: Optional[list[str]]) -> Section:
        """One line a case (view/cases.py): its shape, backend, time, utilisation, CV and flags."""
        params = self.table.params
        rows = sorted(self.table.rows, key=lambda r: sort_key(r, params))
        shown = [{**r, "test_id": None, "case": case_id(r, params, backend=False)} for r in rows[:limit]]
        table = cases.case_table(shown, list(columns or cases.REPORT_DEFAULT), chosen=columns is not None)
        s = Section(f"{self.op}: cases", [c.header for c in table.columns],
                    [[row[c.name] for c in table.columns] for row in table.rows], columns=table.columns,
                    colours=table.colours, hint="--columns picks the columns, --width full shows them all")
        if len(rows) > limit:
            s.notes.append(f"... {len(rows) - limit} more cases (--limit N shows more)")
        return s

    def _extremes_section(self, shared: "SharedNotes") -> Section:
        s = Section(f"{self.op}: best and worst", ["metric", "best", "case", "worst", "case"])
        missing, uncalibrated = [], []
        for column, label, form in EXTREMES + ATTAINABLE:
            pair = self.extreme(column)
            if pair is None:
                (uncalibrated if (column, label, form) in ATTAINABLE else missing).append(label)
                continue
            best, worst = pair
            s.rows.append([label, form(best[column]), case_id(best, self.table.params),
                           form(worst[column]), case_id(worst, self.table.params)])
        if missing:
            devices = ", ".join(sorted({r["device"] for r in self.table.rows}))
            shared.add(f"{', '.join(missing)}: not computed for any row of {{ops}} (the hardware spec of "
                       f"{devices} has no peak for them: see `opperf devices`)", self.op)
        if any((r.get(c) or 0) > 1.0 for r in self.table.rows for c, _, _ in ATTAINABLE):
            shared.add(CEILING_NOTE.replace("{", "{{").replace("}", "}}") + " (rows of {ops})", self.op)
        if uncalibrated:
            shared.add(f"{', '.join(uncalibrated)}: no row of {{ops}} was held against measured ceilings (run "
                       f"`opperf calibrate`, or the sweep with --opperf-calibrate=missing)", self.op)
        return s

    def _wins_section(self, limit: int, shared: "SharedNotes") -> Optional[Section]:
        s = Section(f"{self.op}: fastest backend per shape",
                    ["shape", "fastest", "time_us", "next", "next time_us", "speedup"])
        if len(self.backends) < 2:
            shared.add("one backend ran for {ops}: no fastest backend to name", self.op)
            return None
        if not self.wins:
            shared.add("no shape of {ops} was run by two backends", self.op)
            return None
        for w in self.wins[:limit]:
            fastest = w.winner if not w.not_significant else significance.verdict_text(w.not_significant)
            s.rows.append([w.shape, fastest, fmt(w.time_us), w.runner_up or "-", fmt(w.runner_up_us),
                           significance.ratio_text(w.speedup, w.not_significant)])
        if len(self.wins) > limit:
            s.notes.append(f"... {len(self.wins) - limit} more shapes (--limit N shows more)")
        counts = self.win_counts
        ties = sum(1 for w in self.wins if w.not_significant == significance.OVERLAP)
        unjudged = sum(1 for w in self.wins if w.not_significant) - ties
        s.notes.append("wins: " + ", ".join(f"{b} {counts.get(b, 0)}" for b in sorted(self.backends,
                                                                                     key=lambda b: -counts.get(b, 0)))
                       + f" (of {len(self.wins)} shapes run by two backends or more"
                       + (f"; {ties} with no significant difference" if ties else "")
                       + (f"; {unjudged} that cannot be judged" if unjudged else "") + ")")
        if ties or unjudged:
            s.notes.append(significance.NOTE)
        return s

    def _flags_section(self, limit: int, shared: "SharedNotes") -> Optional[Section]:
        params = self.table.params
        s = Section(f"{self.op}: unstable, throttled, contended and check-floor rows", ["case", "flag", "cv", "detail"])
        unstable, throttled = self.flagged("unstable"), self.flagged("throttled")
        contended = self.flagged("contended")
        blind = [r for r in self.table.rows if cases.check_blind(r)]
        missed = [r for r in self.table.rows if r.get("target_met") == 0]
        for r in unstable:
            s.rows.append([case_id(r, params), "unstable", fmt(r["cv"], 3), unstable_detail(r)])
        for r in throttled:
            s.rows.append([case_id(r, params), "throttled", fmt(r["cv"], 3), r.get("throttle_reasons") or ""])
        for r in contended:
            s.rows.append([case_id(r, params), "contended", fmt(r["cv"], 3), r.get("contention") or ""])
        for r in sorted(blind, key=lambda r: sort_key(r, params)):
            s.rows.append([case_id(r, params), "check-floor", fmt(r["cv"], 3),
                           f"its check surely catches a scale error only from {r['check_floor']:.2%}: a kernel "
                           f"1% off could pass"])
        if len(s.rows) > limit:
            s.notes.append(f"... {len(s.rows) - limit} more")
            s.rows = s.rows[:limit]
        if not unstable and not throttled and not contended and not blind:
            shared.add("no unstable (a median that moved between the halves of its samples), throttled, contended "
                       "or check-floor (above 1%) rows in {ops}",
                       self.op)
        if contended:
            s.notes.append(f"{len(contended)} of {len(self.table.rows)} rows contended: measured while other processes "
                           f"competed for the machine, their times are not the kernel's alone")
        if missed:
            s.notes.append(f"{len(missed)} rows missed their precision target within the time budget (target_met = 0)")
        return s if s.rows or s.notes else None


class SharedNotes:
    """Notes that several ops share, said once naming the ops: a template with {ops} -> the ops."""

    def __init__(self) -> None:
        self.ops: dict[str, list[str]] = {}

    def add(self, template: str, op: str) -> None:
        self.ops.setdefault(template, []).append(op)

    def section(self) -> Optional[Section]:
        if not self.ops:
            return None
        return Section("notes", level=2, notes=[t.format(ops=", ".join(ops)) for t, ops in self.ops.items()])


def unstable_detail(row: dict) -> str:
    """The flags table's detail of an unstable row: how far its median moved, over how many samples.

    >>> unstable_detail({"median_drift": 0.081, "samples": 120}), unstable_detail({"samples": 40})
    ('median moved +8.1% between the halves of 120 samples', '40 samples')
    """
    if row.get("median_drift") is None:  # a row written before the drift column
        return f"{row['samples']} samples"
    return f"median moved {row['median_drift']:+.1%} between the halves of {row['samples']} samples"


def fastest_per_shape(table: OpTable) -> list[Win]:
    """Per shape run by two backends or more: the fastest backend (its best row over knobs and
    versions) and the next one, in shape order."""
    wins = []
    for per_backend in best_by_shape(table).values():
        if len(per_backend) >= 2:
            first, second = sorted(per_backend.values(), key=lambda r: r["time_us"])[:2]
            wins.append(Win(case_id(first, table.params, backend=False), first["backend"], first["time_us"],
                            second["backend"], second["time_us"], significance.why_not(first, second)))
    return wins


def runs_section(results: Results, rows: list[dict]) -> Section:
    """The environment of every run that wrote these rows."""
    s = Section(f"runs in {results.path.name}", ["run_id", "date", "device", "torch", "driver", "cuda",
                                                 "git commit", "host"], level=2)
    runs = results.runs_of(rows)
    for run in runs:
        commit = (run.get("git_commit") or "")[:12]
        if commit and run.get("git_dirty"):
            commit += " (dirty)"
        s.rows.append([run["run_id"], (run.get("started_at") or "")[:19].replace("T", " "), fmt(run.get("device")),
                       fmt(run.get("torch")), fmt(run.get("driver")), fmt(run.get("cuda")), commit or "-",
                       fmt(run.get("host"))])
    if not runs:
        s.notes.append("no runs recorded for these rows")
    for run in runs:
        if run.get("calibration_stale"):
            s.notes.append(f"run {run['run_id']}: its calibration {run.get('calibration_id')} was stale "
                           f"({run['calibration_stale']}): its attainable MFU/MBU are held against it anyway")
    return s


def ceilings_section(results: Results) -> Optional[Section]:
    """The newest calibration of each device in the database, beside the datasheet; None without one."""
    from pytest_opperf.store import ceilings
    from pytest_opperf.store.database import StorageError

    try:
        rows = ceilings.all_rows(results.path)
    except StorageError:
        return None
    newest = {}
    for row in rows:  # oldest first: the last calibration of a device wins
        newest[row["device"]] = row["calibration_id"]
    rows = [r for r in rows if newest.get(r["device"]) == r["calibration_id"]]
    if not rows:
        return None
    s = Section(f"measured ceilings in {results.path.name}",
                ["device", "quantity", "dtype", "shape", "measured", "datasheet", "ratio", "date"], level=2)
    for r in rows:
        if r["quantity"] == "launch":
            got, sheet = f"{fmt(r['time_us'], 3)} us", "-"
        elif r.get("tflops") is not None:
            got, sheet = f"{fmt(r['tflops'])} TFLOP/s", fmt(r.get("datasheet_tflops"))
        else:
            got, sheet = f"{fmt(r.get('gbytes_per_s'))} GB/s", fmt(r.get("datasheet_gbytes_per_s"))
        s.rows.append([r["device"], r["quantity"], r["dtype"] or "-", r["shape"], got, sheet, fmt_pct(r.get("ratio")),
                       (r.get("created_at") or "")[:19].replace("T", " ")])
    s.notes.append("attainable MFU/MBU hold rows against these: MFU against the matrix or vector ceiling of the "
                   "row's dtype, MBU against the better of copy and read")
    return s


def report(results: Results, ops: Optional[list[str]] = None, limit: int = 20,
           columns: Optional[list[str]] = None) -> list[Section]:
    """The sections of `opperf report`: per op, the notes they share (once), then the runs behind
    all of them. columns: the per-case tables' (view/cases.py names; None: the default)."""
    sections: list[Section] = []
    rows: list[dict] = []
    shared = SharedNotes()
    tables = [results.table(op) for op in results.pick(ops)]
    if len(tables) > 1:  # a report of several ops opens with what it holds
        sections.append(overview_section(tables, results.path.name))
    for table in tables:
        rows += table.rows
        if table.rows:
            sections += OpSummary.of(table).sections(limit, columns, shared)
        else:
            sections.append(Section(f"{table.op}: no rows", level=2))
    notes = shared.section()
    if notes is not None:
        sections.append(notes)
    measured = ceilings_section(results)
    if measured is not None:
        sections.append(measured)
    sections.append(runs_section(results, rows))
    return sections


# Long or per-run columns the rows view leaves out (`opperf export` has them all).
ROWS_HIDDEN = {"run_id", "created_at", "test_id", "kernels", "peak_dtype", "peak_kind", "knobs", "device"}


# In a narrow terminal the rows view keeps these longest (then the op's parameters, then the rest).
ROWS_FIRST = ("backend", "dtype_in", "dtype_out", "time_us", "cv", "gflops", "gbytes_per_s", "mfu", "mbu",
              "unstable", "samples")


def rows_section(table: OpTable, limit: int = 50, columns: Optional[list[str]] = None) -> Section:
    """`opperf report DB --op OP --rows`: the stored rows, as they are, in the order written; in
    `columns` (stored column names) when given, else every column that has a value."""
    shown = table.rows[:limit]
    if columns is not None:
        try:
            columns = fit.pick(table.columns, ",".join(columns), "--columns", f"the columns of {table.op}")
        except ValueError as exc:
            raise ViewError(str(exc)) from None
    else:
        # Columns empty in every row shown (the GPU's clocks on a CPU) would only widen the table.
        columns = [c for c in table.columns if c not in ROWS_HIDDEN and any(r[c] not in (None, "") for r in shown)]
    cells = [[fmt(row[c]) for c in columns] for row in shown]
    keep = {c: 100 - i for i, c in enumerate([*table.params, *ROWS_FIRST])}
    fitted = []
    for i, c in enumerate(columns):
        text = not all(numeric(r[i]) for r in cells if r[i] not in ("", "-"))
        fitted.append(Column(c, c, right=not text, keep=keep.get(c, -i), shrink=int(text), min_width=8))
    s = Section(f"{table.op}: {len(table.rows)} rows in {table.source.name}", columns, cells, level=2,
                columns=fitted, hint="--columns picks the columns, --width full shows them all")
    if len(table.rows) > limit:
        s.notes.append(f"... {len(table.rows) - limit} more rows (--limit N shows more)")
    return s
