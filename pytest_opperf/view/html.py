"""`opperf html` and `--opperf-html`: one self-contained HTML file of one or more databases.

The file opens from disk with no server and no network: plots are inline SVG, the styles and the
few lines of JavaScript (click a column to sort, type in the box to filter rows) are in the page.
Per database: its runs and their environments, then per op the summary of `opperf report`, the
roofline, lines and speedup plots and every row. With two databases or more, device-vs-device
plots of their common ops; with a gate JSON report (--opperf-report-json), its verdicts.

>>> write(Path("report.html"), [Path("results/h100.db")], gate=load_gate(Path("gate.json")))  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import html
import re
from pathlib import Path
from typing import Optional

from pytest_opperf import files
from pytest_opperf.version import __version__
from pytest_opperf.gate.rules import pct
from pytest_opperf.gate.report import REPORT_FORMAT
from pytest_opperf.view import plots
from pytest_opperf.view.cases import check_blind
from pytest_opperf.view.source import OpTable, Results, ViewError, case_id, sort_key
from pytest_opperf.view.summary import OpSummary, runs_section
from pytest_opperf.view.text import Section, fmt, render_html

# The columns of an op's rows table after its case id and parameters, in this order.
ROW_COLUMNS = ("dtype_in", "dtype_out", "backend", "backend_version", "knobs", "timer", "cache", "time_us",
               "time_us_p95", "cv", "ci_rel", "samples", "outliers", "gflops", "gbytes_per_s", "mfu", "mbu", "median_drift",
               "unstable", "throttled", "contended", "target_met", "check_floor", "created_at")
GATE_COLUMNS = ("case", "verdict", "p50_us", "baseline_p50_us", "ratio", "max_regression", "noise_rel", "notes")


def load_gate(path: Path) -> dict:
    """A gate report written by --opperf-report-json, checked to be one."""
    try:
        report = files.load_json(Path(path))
    except files.FileError as exc:
        raise ViewError(f"--gate={path}: cannot read a JSON report: {exc.reason}") from None
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise ViewError(f"--gate={path}: not a report of --opperf-report-json (expected \"format\": "
                        f"\"{REPORT_FORMAT}\")")
    return report


def session_report(path: Path, database: Optional[Path], gate: Optional[dict], hardware: Optional[Path]) -> str:
    """--opperf-html at the session's end: the report of the run's database (None: the run stored
    nothing). Returns the line for the terminal summary; never raises, the rows are stored already."""
    from pytest_opperf.hardware.specs import SpecError, load_specs

    if database is None or not database.is_file():
        return f"HTML report not written to {path}: this run stored no database"
    try:
        write(path, [database], gate, load_specs(hardware))
    except (OSError, ViewError, SpecError) as exc:
        return f"ERROR: HTML report not written to {path}: {exc}"
    except Exception as exc:  # a plotting library's failure must not turn a stored run into an INTERNALERROR
        return f"ERROR: HTML report not written to {path}: {type(exc).__name__}: {exc}"
    return f"HTML report of {database} written to {path}"


def write(path: Path, databases: list[Path], gate: Optional[dict] = None, specs: Optional[dict] = None,
          ops: Optional[list[str]] = None, title: Optional[str] = None) -> Path:
    """Render the report of `databases` and write it to `path` (its folder is created)."""
    text = build(databases, gate, specs, ops, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def build(databases: list[Path], gate: Optional[dict] = None, specs: Optional[dict] = None,
          ops: Optional[list[str]] = None, title: Optional[str] = None) -> str:
    if specs is None:
        from pytest_opperf.hardware.specs import load_specs

        specs = load_specs()
    opened = [Results.open(Path(p)) for p in databases]
    missing = [op for op in ops or [] if not any(op in r.tables for r in opened)]
    if missing:
        raise ViewError(f"--op={missing[0]}: no database given has a table {missing[0]!r}")
    try:
        plots.require_matplotlib()
        can_plot = True
    except ViewError:
        can_plot = False
    title = title or "opperf: " + ", ".join(r.path.name for r in opened)
    page = _Page(can_plot)
    page.add(f"<h1>{_e(title)}</h1>")
    page.add(f"<p class=meta>pytest-opperf {_e(__version__)}, written "
             f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} from "
             + ", ".join(f"<code>{_e(str(r.path))}</code> (device {_e(r.device)})" for r in opened) + "</p>")
    if not can_plot:
        page.add("<p class=warn>No plots: they need matplotlib (<code>pip install 'pytest-opperf[plot]'</code>).</p>")
    nav = page.placeholder()
    if gate is not None:
        page.section("gate", f"gate report: {gate.get('device')} at {(gate.get('commit') or '-')[:12]}")
        page.add(_gate_html(gate))
    for results, name in zip(opened, _unique_names(opened)):
        label = results.path.name if name == results.path.stem else f"{results.path.parent.name}/{results.path.name}"
        page.section(f"db-{name}", f"{label}: device {results.device}")
        rows: list[dict] = []
        tables = [results.table(op) for op in ([o for o in ops if o in results.tables] if ops else results.ops)]
        for table in tables:
            rows += table.rows
        page.add(render_html([_demote(runs_section(results, rows), 3)]).replace("<table>", "<table class=rows>", 1))
        for table in tables:
            page.section(f"{name}-{table.op}", f"{table.op} ({label})", level=3)
            if not table.rows:
                page.add("<p>no rows</p>")
                continue
            head, *summary = OpSummary.of(table).sections(limit=50)  # the heading is the page section's own
            page.add(f"<p>{len(table.rows)} rows; " + "; ".join(_e(n) for n in head.notes) + "</p>")
            page.add("<div class=cards>" + "".join(f"<div>{render_html([_demote(s, 4)])}</div>" for s in summary)
                     + "</div>")
            page.plots(_op_figures(table, specs) if can_plot else [])
            page.add(_rows_table(table, f"rows-{name}-{table.op}"))
    if len(opened) > 1 and can_plot:
        first = opened[0]
        for other, name in zip(opened[1:], _unique_names(opened)[1:]):
            page.section(f"devices-{name}", f"{other.path} against {first.path}")
            common = [op for op in first.tables if op in other.tables and (not ops or op in ops)]
            figures = []
            for op in common:
                figures.append(_figure(f"{op}: device against device",
                                       lambda op=op: plots.devices(first.table(op), other.table(op))))
            page.plots(figures)
            if not common:
                page.add("<p>no op in both</p>")
    nav.append(_nav(page.toc))
    return page.render(title)


def _unique_names(opened: list[Results]) -> list[str]:
    """The databases' stems for element ids, numbered where two share one (results/cpu.db, b/cpu.db)."""
    names: list[str] = []
    for results in opened:
        name, n = results.path.stem, 1
        while name in names:
            n += 1
            name = f"{results.path.stem}{n}"
        names.append(name)
    return names


def _nav(toc: list[tuple[str, str, int]]) -> str:
    """A line per database (and the gate), its ops' links after it."""
    items: list[str] = []
    for anchor, text, level in toc:
        link = f"<a href='#{anchor}'>{_e(text)}</a>"
        if level == 2 or not items:
            items.append(link + (" &mdash;" if level == 2 else ""))
        else:
            items[-1] += " " + link
    return "<nav><b>Contents</b><ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul></nav>"


class _Page:
    def __init__(self, can_plot: bool):
        self.parts: list = []
        self.toc: list[tuple[str, str, int]] = []
        self.can_plot = can_plot

    def add(self, text: str) -> None:
        self.parts.append(text)

    def placeholder(self) -> list:
        slot: list = []
        self.parts.append(slot)
        return slot

    def section(self, anchor: str, text: str, level: int = 2) -> None:
        anchor = re.sub(r"[^A-Za-z0-9_-]+", "-", anchor)
        self.toc.append((anchor, text, level))
        self.add(f"<h{level} id='{anchor}'>{_e(text)}</h{level}>")

    def plots(self, figures: list[str]) -> None:
        if figures:
            self.add("<div class=plots>" + "".join(figures) + "</div>")

    def render(self, title: str) -> str:
        body = "\n".join("\n".join(p) if isinstance(p, list) else p for p in self.parts)
        return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
                f"<meta name=viewport content='width=device-width, initial-scale=1'>"
                f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n"
                f"<script>{SCRIPT}</script>\n</body></html>\n")


def _op_figures(table: OpTable, specs: dict) -> list[str]:
    figures = [_figure(f"roofline on {device}", lambda d=device: plots.roofline(
        table, specs.get(d), d, plots.measured_ceilings(table.source, d)))
               for device in table.distinct("device")]
    figures.append(_figure("lines over the swept parameter", lambda: plots.lines(table)))
    if len(table.distinct("backend")) > 1:
        figures.append(_figure("speedup", lambda: plots.speedup(table)))
    return figures


def _figure(caption: str, make) -> str:
    """An inline SVG figure, or the reason it could not be drawn."""
    try:
        svg = plots.svg(make())
    except ViewError as exc:
        return f"<figure class=missing><figcaption>{_e(caption)}: {_e(str(exc))}</figcaption></figure>"
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _demote(section: Section, level: int) -> Section:
    section.level = level
    return section


def _cell(value) -> str:
    """A cell: the stored value in data-v (what sorting uses, and what a test can compare), shown rounded."""
    raw = "" if value is None else repr(value) if isinstance(value, float) else str(value)
    shown = fmt(value)
    cls = " class=num" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    if isinstance(value, str) and len(value) > LONG_TEXT:
        cls = " class=long"  # a sentence (contention, throttle reasons) wraps inside its column
    return f"<td{cls} data-v='{_e(raw)}'>{_e(shown)}</td>"


LONG_TEXT = 40  # characters: a longer text cell wraps (td.long) rather than widening the table off the page


def _rows_table(table: OpTable, anchor: str) -> str:
    columns = [c for c in ROW_COLUMNS if c in table.columns]
    if "knobs" in columns and not any(r.get("knobs") for r in table.rows):
        columns.remove("knobs")
    head = ["case", *table.params, *columns]
    out = [f"<details open><summary>{len(table.rows)} rows of {_e(table.op)} (click a column's name to sort; "
           f"tinted rows are unstable, throttled or contended, or their check's floor is above 1%)</summary>",
           f"<input class=filter type=search data-table='{anchor}' placeholder='filter: words all in a row, "
           f"e.g. bf16 torch' aria-label='filter the rows of {_e(table.op)}'> <span class=count></span>",
           f"<div class=scroll><table class=rows id='{anchor}' data-op='{_e(table.op)}'><thead><tr>"
           + "".join(f"<th data-col='{_e(c)}'>{_e(c)}</th>" for c in head) + "</tr></thead><tbody>"]
    for row in sorted(table.rows, key=lambda r: sort_key(r, table.params)):
        flagged = row.get("unstable") or row.get("throttled") or row.get("contended") or check_blind(row)
        flags = " class=flagged" if flagged else ""
        out.append(f"<tr{flags}>" + f"<td data-v='{_e(case_id(row, table.params))}'>"
                   f"{_e(case_id(row, table.params))}</td>"
                   + "".join(_cell(row.get(c)) for c in [*table.params, *columns]) + "</tr>")
    out.append("</tbody></table></div></details>")
    return "\n".join(out)


def _gate_html(gate: dict) -> str:
    summary = gate.get("gate") or {}
    cases = gate.get("cases") or []
    counts: dict = dict(summary.get("counts") or {})
    if not counts:
        for case in cases:
            counts[case.get("verdict") or "not judged"] = counts.get(case.get("verdict") or "not judged", 0) + 1
    failed = summary.get("failed", counts.get("regressed", 0) > 0)
    lines = [f"<p class={'fail' if failed else 'pass'}><b>{'FAILED' if failed else 'passed'}</b>: "
             + ", ".join(f"{n} {_e(v)}" for v, n in counts.items() if n) + "</p>"]
    if summary:
        lines.append(f"<p>baseline <code>{_e(str(summary.get('baseline')))}</code> (device "
                     f"{_e(str(summary.get('baseline_device')))}), rule {_e(str(summary.get('rule')))}, "
                     f"max regression {_e(pct(summary.get('max_regression') or 0))} by default</p>")
        for line in summary.get("environment_differences") or []:
            lines.append(f"<p class=warn>environment: {_e(line)}</p>")
    order = {"regressed": 0, "inconclusive": 1, "improved": 2, "noisy": 3, "incomparable": 4, "same": 5, "new": 6}
    ranked = sorted(cases, key=lambda c: (order.get(c.get("verdict"), 9), c.get("case") or ""))
    lines.append("<input class=filter type=search data-table='gate-cases' placeholder='filter: e.g. regressed'"
                 " aria-label='filter the gate cases'> <span class=count></span>")
    lines.append("<div class=scroll><table class=rows id='gate-cases'><thead><tr>"
                 + "".join(f"<th>{c}</th>" for c in GATE_COLUMNS) + "</tr></thead><tbody>")
    for case in ranked:
        verdict = case.get("verdict") or ""
        lines.append(f"<tr class='v-{_e(verdict)}'>" + "".join(_cell(case.get(c)) for c in GATE_COLUMNS) + "</tr>")
    lines.append("</tbody></table></div>")
    if summary.get("not_run"):
        lines.append(f"<p>in the baseline, not run: {len(summary['not_run'])}</p>")
    return "\n".join(lines)


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1500px;padding:0 1em;color:#1d1d1f}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h4{margin:1em 0 .3em}
code{background:#f3f3f3;padding:0 .25em}.meta{color:#555}.warn{color:#8a5a00}.fail{color:#b00020}.pass{color:#146c2e}
nav ul{list-style:none;padding:0}nav a{margin-right:.6em}
table{border-collapse:collapse;margin:.3em 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.15em .5em;text-align:left;white-space:nowrap}
th{background:#f0f0f0;position:sticky;top:0}table.rows th{cursor:pointer}
table.rows th[data-dir=up]::after{content:" \\25B2"}table.rows th[data-dir=down]::after{content:" \\25BC"}
td.num{text-align:right}td.long{white-space:normal;min-width:18em;max-width:36em;overflow-wrap:anywhere}tr.flagged td{background:#fff6e0}tr.v-regressed td{background:#fde8ea}tr.v-improved td{background:#e6f4ea}
.scroll{max-height:34em;overflow:auto;border:1px solid #eee}
.plots,.cards{display:flex;flex-wrap:wrap;gap:.5em 2em;align-items:flex-start}
figure{margin:0;border:1px solid #eee;padding:.3em;max-width:100%}figure svg{max-width:100%;height:auto}
figcaption{font-size:.9em;color:#555}figure.missing{color:#8a5a00;border-style:dashed}
ul.notes{margin:.2em 0;color:#444}input.filter{margin:.4em 0;width:24em;padding:.2em}.count{color:#555}
"""

SCRIPT = """
document.querySelectorAll("table.rows").forEach(function (table) {
  var body = table.tBodies[0];
  table.querySelectorAll("th").forEach(function (th, i) {
    th.addEventListener("click", function () {
      var up = th.dataset.dir !== "up";
      table.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
      th.dataset.dir = up ? "up" : "down";
      var value = function (row) { var c = row.cells[i]; return c.dataset.v !== undefined ? c.dataset.v : c.textContent; };
      Array.from(body.rows).sort(function (a, b) {
        var x = value(a), y = value(b), nx = parseFloat(x), ny = parseFloat(y);
        var order = (x === "") - (y === "") || (!isNaN(nx) && !isNaN(ny) ? nx - ny : x.localeCompare(y));
        return up || x === "" || y === "" ? order : -order;
      }).forEach(function (row) { body.appendChild(row); });
    });
  });
});
document.querySelectorAll("input.filter").forEach(function (box) {
  var body = document.getElementById(box.dataset.table).tBodies[0], count = box.nextElementSibling;
  box.addEventListener("input", function () {
    var words = box.value.toLowerCase().split(/\\s+/).filter(Boolean), shown = 0;
    Array.from(body.rows).forEach(function (row) {
      var text = row.textContent.toLowerCase();
      row.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
      shown += row.hidden ? 0 : 1;
    });
    count.textContent = words.length ? shown + " of " + body.rows.length + " rows" : "";
  });
});
"""
