"""What a sweep prints in pytest's terminal: the header lines, the opperf summary (a table of the
cases, the counts, the harness line, what was written) and the gate's table.

Each function reads the session (run/session.py) and writes lines; nothing here changes it.
"""

from __future__ import annotations

import math
from typing import Callable

from pytest_opperf.measure import phases
from pytest_opperf.view.text import fmt_of_ceiling

UNSTABLE_CV = 0.15  # the `unstable` column's threshold (measure/stats.py), said in the counts line


def header(state) -> list[str]:
    """pytest's report header: device, timer, target; the gate; where rows go; calibration; warnings."""
    s = state.settings
    lines = [f"opperf: device {state.spec.name} ({state.accelerator.reported_name}, torch {state.device}), "
             f"timer {s.timer}, cache {s.cache}, target {s.target_rel:.2%} within {s.budget_s:g}s/case"]
    lines += [f"opperf: {line}" for line in state.gate.header_lines()]
    if s.sample_only:
        lines.append("opperf: sample-only: no database is written")
    else:
        rescue = state.writer.rescue_path
        lines.append(f"opperf: rows -> {state.db_path}")
        if rescue.exists():
            lines.append(f"opperf: warning: {rescue} holds rows that an earlier run could not store: restore "
                         f"them with `opperf merge {state.db_path} {rescue}`, then delete it")
    lines += [f"opperf: {line}" for line in state.calibration.lines]
    return lines + [f"opperf: warning: {w}" for w in state.ctx.warnings]


def summary(state, write: Callable) -> None:
    """The opperf section: notes, the table of the first --opperf-summary cases, counts, what was written."""
    for note in state.notes:
        write(f"opperf: {note}")
    records, writer = state.records, state.writer
    if not records and not writer.errors:
        return
    limit = state.settings.summary_rows
    _table(records[:limit] if limit else [], state.calibration.current is not None, write)
    if limit and len(records) > limit:
        write(f"... {len(records) - limit} more rows (--opperf-summary=N shows more)")
    write("opperf: " + counts(records, state.settings.target_rel))
    for line in state.calibration.summary_lines():
        write(f"opperf: {line}")
    harness = phases.summary_line(records, phases.LOADED_UNIX_S, state.profiler_start_s)
    if harness:
        write(f"opperf: {harness}")
    for line in writer.summary_lines(state.run_id):
        write(f"opperf: {line}")


def _table(rows: list, attained: bool, write: Callable) -> None:
    """One line a case: time, throughput, utilisation (aMFU/aMBU against measured ceilings), CV, flags."""
    if not rows:
        return
    write(f"{'case':<60} {'time_us':>10} {'GFLOP/s':>10} {'GB/s':>9} {'MFU':>6} {'MBU':>6} "
          + (f"{'aMFU':>6} {'aMBU':>6} " if attained else "") + f"{'CV':>6}  flags")
    for r in rows:
        name = r["test_id"].split("::")[-1]
        write(f"{name[:60]:<60} {r['time_us']:>10.2f} {_num(r['gflops'], 10, 1)} {_num(r['gbytes_per_s'], 9, 1)} "
              f"{_pct(r['mfu'])} {_pct(r['mbu'])} "
              + (f"{fmt_of_ceiling(r.get('mfu_attainable')):>6} {fmt_of_ceiling(r.get('mbu_attainable')):>6} "
                 if attained else "")
              + f"{r['cv']:>6.3f}  {' '.join(flags(r))}")


def flags(record: dict) -> list[str]:
    """What a reader should know before trusting a row's time."""
    out = []
    if record["unstable"]:
        out.append("unstable")
    if not record["target_met"]:
        out.append("target-missed")
    if record.get("throttled"):
        out.append(f"throttled({record['throttle_reasons']})")
    if record.get("contended"):
        out.append("contended")
    if max(record.get("mfu_attainable") or 0, record.get("mbu_attainable") or 0) > 1.0:
        out.append("above-ceiling(calibration suspect)")
    return out


def counts(records: list, target_rel: float) -> str:
    """'N cases measured, k unstable, ...': the summary's one line of counts."""
    unstable = sum(1 for r in records if r["unstable"])
    missed = sum(1 for r in records if not r["target_met"])
    throttled = sum(1 for r in records if r.get("throttled"))
    contended = sum(1 for r in records if r.get("contended"))
    tail = [f"{len(records)} cases measured"]
    if unstable:
        tail.append(f"{unstable} unstable (CV > {UNSTABLE_CV})")
    if missed:
        tail.append(f"{missed} missed the {target_rel:.1%} target within the budget")
    if throttled:
        tail.append(f"{throttled} throttled (clocks held down during the case: see throttle_reasons)")
    if contended:
        tail.append(f"{contended} contended (other processes competed for the machine: see contention)")
    return ", ".join(tail)


def html_report(state, path) -> str:
    """--opperf-html at the session's end: the report of the run's database; the summary's note on it."""
    from pytest_opperf.gate.report import run_report
    from pytest_opperf.view.html import session_report  # matplotlib and the page, only when asked for

    writer = state.writer
    gate = run_report(state.records, state.run_row(), None) if state.gate.gate is not None else None
    stored = None if state.settings.sample_only or writer.rescued or writer.pending else state.db_path
    return session_report(path, stored, gate, state.settings.hardware_file)


def gate_summary(comparison, summary_rows: int, write: Callable) -> None:
    """The gate's table: cases that are not the same as their baseline, then the verdict line."""
    for line in comparison.lines(summary_rows):
        write(line, red=line.startswith("gate: FAILED"), bold=line.startswith("gate:"))


def _num(value, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def _pct(value) -> str:
    return f"{'-':>6}" if value is None or math.isnan(value) else f"{value:>6.1%}"
