"""The commands that read results databases: report, plot, html, best, export, datasette-metadata, timeline.

A database that cannot be read, or a question it cannot answer (ViewError), and a bad specs
file (SpecError) are one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from pytest_opperf.amounts import parse_width
from pytest_opperf.commands import CommandError, arg, command
from pytest_opperf.hardware.specs import SpecError, load_specs
from pytest_opperf.view import cases, fit
from pytest_opperf.view.source import Results, ViewError

ERRORS = (ViewError, SpecError)
DB = arg("db", type=Path)
DBS = arg("dbs", type=Path, nargs="+", metavar="DB")
MARKDOWN = arg("--markdown", action="store_true", help="print markdown instead of a terminal table")
ROOFLINE_HARDWARE = arg("--hardware", type=Path, help="extra specs file, as --opperf-hardware (roofline peaks)")
OUTPUT = arg("-o", "--output", type=Path, metavar="FILE", help="default: standard output")
WIDTH = arg("--width", default="auto", metavar="auto|full|N", help="the width tables fit (auto: the terminal's, or "
            "COLUMNS; no limit when the output is not a terminal; full: no limit)")


@command("report", help="summarise a results database, per op",
         description="Per op: cases, best and worst MFU/MBU (and GFLOP/s, GB/s) with the case, the fastest backend "
                     "per shape and the wins per backend, unstable, throttled and contended rows; then the runs (device, "
                     "torch, driver, commit, date).",
         args=[DB,
               arg("--op", action="append", help="only this op (repeatable; default: every op)"),
               arg("--limit", type=int, default=None, help="lines per table (default 20; with --rows, 50 rows)"),
               MARKDOWN,
               arg("--rows", action="store_true", help="print the op's stored rows instead of the summary"),
               arg("--columns", metavar="A,B,...", help="the per-case table's columns (case, backend, time_us, "
                   "util, cv, flags, ...: docs/cli.md lists them); with --rows, stored columns"),
               WIDTH],
         errors=ERRORS)
def _report(args: argparse.Namespace) -> int:
    from pytest_opperf.view import summary
    from pytest_opperf.view.text import print_sections

    results = Results.open(args.db)
    columns = _columns(args.columns) if args.columns is not None else None
    if args.rows:
        sections = [summary.rows_section(results.table(op), args.limit or 50, columns) for op in results.pick(args.op)]
    else:
        if columns is not None:
            columns = _pick(cases.NAMES, columns)
        sections = summary.report(results, args.op, args.limit or 20, columns)
    print_sections(sections, markdown=args.markdown, width=width(args.width))
    return 0


def _columns(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise CommandError(f"--columns={text}: name at least one column")
    return names


def _pick(available, names: list[str]) -> list[str]:
    try:
        return fit.pick(available, ",".join(names), "--columns")
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def width(text: str):
    """--width: amounts.parse_width's value, or a CommandError (exit 2)."""
    try:
        return parse_width(text, "--width")
    except ValueError as exc:
        raise CommandError(str(exc)) from None


@command("plot", help="draw figures of results (needs pytest-opperf[plot])",
         description="Write one figure per op (and device or database) to DIR: roofline (FLOP/s over FLOP/byte "
                     "under the device's roofs), lines (a line per backend over one swept parameter), speedup "
                     "(backend A over B per shape), devices (the second database over the first, per case in both).",
         args=[arg("dbs", type=Path, nargs="+", metavar="DB", help="a results database; two for --kind devices"),
               arg("--kind", default="roofline", help="roofline, lines, speedup or devices (default roofline)"),
               arg("--op", action="append", help="only this op (repeatable; default: every op that can be drawn)"),
               arg("-o", "--output", type=Path, default=Path("plots"), metavar="DIR", help="default: plots/"),
               arg("--format", default="png", help="png, svg or both: png,svg (default png)"),
               arg("--x", help="lines: the swept parameter (default: the one with the most values)"),
               arg("--y", default="time_us", help="lines: time_us, gflops, gbytes_per_s, mfu or mbu"),
               arg("--a", help="speedup: the backend whose speedup is shown (default: the first not --b)"),
               arg("--b", help="speedup: the backend compared against (default: torch)"),
               arg("--max-panels", type=int, default=12, help="lines: panels at most (default 12)"),
               arg("--max-cases", type=int, default=60, help="speedup, devices: bars at most (default 60)"),
               ROOFLINE_HARDWARE],
         errors=ERRORS, output_dirs=("output",))
def _plot(args: argparse.Namespace) -> int:
    from pytest_opperf.view.plots import plot_files

    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    written, skipped = plot_files(args.dbs, args.kind, args.op, args.output, formats, load_specs(args.hardware),
                                  x=args.x, y=args.y, a=args.a, b=args.b, max_panels=args.max_panels,
                                  max_cases=args.max_cases)
    for path in written:
        print(path)
    for reason in skipped:
        print(f"skipped {reason}")
    return 0


@command("html", help="write a self-contained HTML report of databases",
         description="One HTML file, no server, no network: per database its runs, per op the summary, plots "
                     "(inline SVG) and a sortable, filterable table of the rows; the gate's verdicts with --gate.",
         args=[DBS,
               arg("-o", "--output", type=Path, default=Path("report.html"), help="default: report.html"),
               arg("--gate", type=Path, metavar="REPORT.json", help="a report of --opperf-report-json"),
               arg("--op", action="append", help="only this op (repeatable)"),
               arg("--title", help="the page's title"),
               ROOFLINE_HARDWARE],
         errors=ERRORS, outputs=("output",))
def _html(args: argparse.Namespace) -> int:
    from pytest_opperf.view import html

    gate = html.load_gate(args.gate) if args.gate else None
    path = html.write(args.output, args.dbs, gate, load_specs(args.hardware), args.op, args.title)
    print(f"opperf html: {path} ({path.stat().st_size // 1024} KiB)")
    return 0


@command("best", help="per shape, the fastest knobs of a tuning sweep; export them for the kernels",
         description="For every backend that ran knobs and every shape: the fastest knob set, its time, the "
                     "runner-up and the margin over it, the default (the row without knobs) and the speedup over "
                     "it. --export writes the winners as the JSON table our Triton kernels read (--opperf-tuned, "
                     "OPPERF_TUNED).",
         args=[DB,
               arg("--op", action="append", help="only this op (repeatable; default: every op that ran knobs)"),
               arg("--backend", help="only this backend"),
               arg("--timer", help="only rows of this timer"),
               arg("--cache", help="only rows of this cache state (cold or hot)"),
               arg("--export", type=Path, metavar="FILE.json", help="write the tuned-knobs table to FILE.json"),
               arg("--limit", type=int, default=50, help="shapes per op (default 50)"),
               MARKDOWN],
         errors=ERRORS, outputs=("export",))
def _best(args: argparse.Namespace) -> int:
    from pytest_opperf.view import best
    from pytest_opperf.view.text import print_sections

    results = Results.open(args.db)
    filters = {"backend": args.backend, "timer": args.timer, "cache": args.cache}
    print_sections(best.sections(results, args.op, limit=args.limit, **filters), markdown=args.markdown)
    if args.export is not None:
        data = best.export(results, args.op, **filters)
        best.write_export(args.export, data)
        shapes = sum(len(t["shapes"]) for t in data["tables"].values())
        print(f"opperf best: {shapes} shapes of {', '.join(data['tables'])} written to {args.export}")
    return 0


@command("export", help="an op's rows as CSV or JSON",
         args=[DB,
               arg("--op", required=True),
               arg("--format", default="csv", help="csv (with a header), json (a list of row objects), or hcom "
                                                   "(a collective in seed 001's hcom_*.csv columns)"),
               OUTPUT],
         errors=ERRORS, outputs=("output",))
def _export(args: argparse.Namespace) -> int:
    from pytest_opperf.view.export import export

    _emit(export(Results.open(args.db), args.op, args.format), args.output)
    return 0


@command("datasette-metadata", help="Datasette metadata: column descriptions, units, facets",
         description="Write metadata for `datasette DB... -m FILE` (Datasette is not needed to write it).",
         args=[DBS, OUTPUT], errors=ERRORS, outputs=("output",))
def _datasette_metadata(args: argparse.Namespace) -> int:
    from pytest_opperf.view.datasette import metadata

    _emit(json.dumps(metadata([Results.open(p) for p in args.dbs]), indent=2) + "\n", args.output)
    return 0


def _emit(text: str, output: Optional[Path]) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"{output}", file=sys.stderr)


@command("timeline", help="draw a swimlane of a sweep: which case ran when, where, and its phases",
         description="One lane per xdist worker and GPU, one bar per case of one run, split into its phases "
                     "(set-up, inputs, check, warm-up, device state, sampling, timed-call check, record), from the "
                     "rows' started_unix_s, ended_unix_s and phase_*_ms columns.",
         args=[DB,
               arg("-o", "--output", type=Path, default=Path("timeline.html"), metavar="FILE",
                   help="FILE.html (self-contained) or FILE.png (needs pytest-opperf[plot]); default timeline.html"),
               arg("--run", metavar="RUN_ID", help="the run to draw (default: the latest with timed rows)")],
         errors=ERRORS, outputs=("output",))
def _timeline(args: argparse.Namespace) -> int:
    from pytest_opperf.view import timeline

    sweep = timeline.load(args.db, args.run)
    path = timeline.write(sweep, args.output)
    print(f"opperf timeline: {path} ({len(sweep.bars)} cases, {len(sweep.lanes)} lanes, {sweep.span_s:.1f} s)")
    return 0
