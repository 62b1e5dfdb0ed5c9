"""What a sweep prints in pytest's terminal: the header lines, the opperf summary (a table of the
cases, the counts, the harness line, what was written) and the gate's table.

Each function renders plain values the controller hands over (run/controller.py: RunHeader,
RunSummary) and writes lines; nothing here changes the run.
"""

from __future__ import annotations


from pathlib import Path
from typing import Callable, Optional

import pytest

from pytest_opperf.measure import phases
from pytest_opperf.measure.stats import UNSTABLE_DRIFT
from pytest_opperf.record import extra_info_of
from pytest_opperf.run.controller import RunHeader, RunSummary
from pytest_opperf.view import cases, fit


class Out:
    """Where the summary goes: a line writer, the width to fit (None: no limit) and the colour markup."""

    def __init__(self, write: Callable[[str], None], width: Optional[int] = None,
                 markup: Callable[[str, str], str] = lambda text, colour: text):
        self.write, self.width, self.markup = write, width, markup

    @classmethod
    def of(cls, config, settings) -> "Out":
        """pytest's terminal: its width on a terminal (or COLUMNS, or --opperf-width), its markup."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        tw = config.get_terminal_writer()
        width = fit.terminal_width(settings.width, bool(reporter.isatty()), lambda: tw.fullwidth)
        return cls(reporter.write_line, width, lambda text, colour: tw.markup(text, **{colour: True}))

    @classmethod
    def of_stream(cls, stream, requested: Optional[int] = 0) -> "Out":
        """A stream of the CLI: fitted on a terminal (fit.stream_width), coloured where wanted."""
        markup = fit.ansi if fit.colour_wanted(stream) else (lambda text, colour: text)
        return cls(lambda line: print(line, file=stream), fit.stream_width(stream, requested), markup)

    def line(self, text: str, indent: str = "") -> None:
        """A line of text, wrapped to the width (continuations indented)."""
        for part in fit.wrap(text, self.width, indent):
            self.write(part)

    def table(self, table: fit.Table) -> None:
        for line in table.lines(self.width):
            self.write(fit.paint(line, self.markup))


def fit_failure(report, width: Optional[int]) -> None:
    """A failed case's message (a functional check, the gate's regression: one long line each,
    from pytest.fail(..., pytrace=False)) wrapped to the width, as pytest prints it at the end; a
    traceback is left as it is."""
    if width is None:
        return
    if isinstance(report.longrepr, str):
        report.longrepr = "\n".join(wrapped(report.longrepr.splitlines(), width))
        return
    traceback = getattr(report.longrepr, "reprtraceback", None)
    if getattr(traceback, "style", None) == "value":  # pytest's form of a message without a traceback
        for entry in traceback.reprentries:
            if isinstance(getattr(entry, "lines", None), list):
                entry.lines[:] = wrapped(entry.lines, width)


def header(run: RunHeader, width: Optional[int] = None) -> list[str]:
    """pytest's report header: device, timer, target; the gate; where rows go; calibration; warnings."""
    lines = [f"opperf: {run.device_line}"]
    lines += [f"opperf: {line}" for line in run.gate_lines]
    if run.db_path is None:
        lines.append("opperf: sample-only: no database is written")
    else:
        rescue = run.rescue_path
        lines.append(f"opperf: rows -> {run.db_path}")
        if rescue is not None and rescue.exists():
            lines.append(f"opperf: warning: {rescue} holds rows that an earlier run could not store: restore "
                         f"them with `opperf merge {run.db_path} {rescue}`, then delete it")
    lines += [f"opperf: {line}" for line in run.calibration_lines]
    lines += [f"opperf: warning: {w}" for w in run.warnings]
    return wrapped(lines, width)


def wrapped(lines: list[str], width: Optional[int]) -> list[str]:
    return [part for line in lines for part in fit.wrap(line, width)]


def summary_columns(columns: tuple, attained: bool) -> tuple[list[str], bool]:
    """The summary's columns (--opperf-columns, else the default) and whether the user chose them;
    a UsageError naming the option and the columns for an unknown name."""
    if columns:
        try:
            return fit.pick(cases.NAMES, ",".join(columns), "--opperf-columns"), True
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return list(cases.SUMMARY_DEFAULT[:-2]) + (list(cases.ATTAINABLE) if attained else []) \
        + list(cases.SUMMARY_DEFAULT[-2:]), False


def summary(run: RunSummary, out: Out) -> None:
    """The opperf section: notes, the table of the first --opperf-summary cases, counts, what was written."""
    for note in run.notes:
        out.line(f"opperf: {note}")
    records = run.records
    if not records and not run.failed_to_write:
        return
    limit = run.summary_rows
    if limit and records:
        names, chosen = summary_columns(run.columns, run.calibrated)
        shown = records[:limit]
        out.table(cases.case_table(shown, names, chosen))
        if len(records) > limit:
            out.line(f"... {len(records) - limit} more rows (--opperf-summary=N shows more)")
        if not chosen:
            note = not_computed(cases.empty_columns(shown, names), run.spec_name)
            if note:
                out.line(f"opperf: {note}")
    out.line("opperf: " + counts(records, run.target_rel))
    for line in run.calibration_lines:
        out.line(f"opperf: {line}")
    harness = phases.summary_line(records, phases.LOADED_UNIX_S, run.profiler_start_s)
    if harness:
        out.line(f"opperf: {harness}")
    for line in run.written:
        out.line(f"opperf: {line}")


def not_computed(columns: list[str], device: str) -> Optional[str]:
    """One note for the columns the table left out because no case has a value in them."""
    if not columns:
        return None
    labels = ", ".join(cases.COLUMNS[c][0].header for c in columns)
    peaks = {"mfu", "mbu", "util", "mfu_attainable", "mbu_attainable"}
    why = (f" (the hardware spec of {device} has no peak for these dtypes: see `opperf devices`)"
           if set(columns) & peaks else "")
    return f"{labels}: not computed for any case, left out{why}"


def counts(records: list, target_rel: float) -> str:
    """'N cases measured, k unstable, ...': the summary's one line of counts.

    >>> print(counts([{"unstable": 1, "target_met": 1, "outliers": 0, "samples": 100},
    ...               {"unstable": 0, "target_met": 1, "outliers": 10, "samples": 100}], 0.01))
    2 cases measured, 1 unstable (the median moved over 3% between the samples' halves), 1 with outliers (10.0% of their samples, not in cv)
    """
    unstable = sum(1 for r in records if r["unstable"])
    missed = sum(1 for r in records if not r["target_met"])
    throttled = sum(1 for r in records if r.get("throttled"))
    contended = sum(1 for r in records if r.get("contended"))
    tail = [f"{len(records)} cases measured"]
    if unstable:
        tail.append(f"{unstable} unstable (the median moved over {UNSTABLE_DRIFT:.0%} between the samples' halves)")
    stalled = [r for r in records if r.get("outliers")]
    if stalled:
        share = sum(r["outliers"] for r in stalled) / sum(r["samples"] for r in stalled)
        tail.append(f"{len(stalled)} with outliers ({share:.1%} of their samples, not in cv)")
    if missed:
        tail.append(f"{missed} missed the {target_rel:.1%} target within the budget")
    if throttled:
        tail.append(f"{throttled} throttled (clocks held down during the case: see throttle_reasons)")
    if contended:
        tail.append(f"{contended} contended (other processes competed for the machine: see contention)")
    python_loops = sum(1 for r in records
                       if r.get("backend") == "nccl" and extra_info_of(r.get("extra_info")).get("loop_driver") == "python")
    if python_loops:
        tail.append(f"{python_loops} nccl loop rows called NCCL from a Python loop, slower than nccl-tests' C loop "
                    f"(no C compiler built the backend's loop: set CC; docs/collectives.md)")
    return ", ".join(tail)



def html_report(path: Path, stored: Optional[Path], gate: Optional[dict], hardware_file: Optional[Path]) -> str:
    """--opperf-html at the session's end: the report of the run's database (`stored`: None when not
    every row is in it) and the gate's report; the summary's note on it."""
    from pytest_opperf.view.html import session_report  # matplotlib and the page, only when asked for

    return session_report(path, stored, gate, hardware_file)


def gate_summary(comparison, summary_rows: int, out: Out, show_same: bool = False) -> None:
    """The gate's table (cases that are not the same as their baseline), fitted; the verdict line
    in bold (red when the gate failed); every other line wrapped to the width."""
    table: list[str] = []

    def render(rows: list[dict]) -> list[str]:
        table.extend(fit.paint(line, out.markup) for line in cases.verdict_table(rows).lines(out.width))
        return list(table)

    for line in comparison.lines(summary_rows, show_same, table=render):
        if table and line is table[0]:
            out.write(table.pop(0))
            continue
        for part in fit.wrap(line, out.width):
            if line.startswith("gate:"):
                part = out.markup(part, "bold")
                part = out.markup(part, "red") if line.startswith("gate: FAILED") else part
            out.write(part)
