"""The `opperf` command: look at what the plugin knows and what it stored.

    opperf version                   the plugin's version
    opperf devices                   the hardware specs (name, peaks, bandwidth, source)
    opperf report results/cpu.db     per op: cases, best/worst MFU/MBU, fastest backend per shape, flags, runs
    opperf plot results/cpu.db --kind roofline|lines|speedup|devices     figures (the [plot] extra)
    opperf html results/cpu.db -o report.html      one self-contained HTML report
    opperf best results/cpu.db --op rmsnorm --export tuned.json   the fastest knobs per shape
    opperf export results/cpu.db --op gemm --format csv|json|hcom     an op's rows
    opperf datasette-metadata results/cpu.db -o metadata.json     for `datasette DB -m metadata.json`
    opperf merge all.db s0.db s1.db  merge per-shard databases: newest row per key wins, runs kept
    opperf merge results/cpu.db results/cpu.rescue.jsonl   restore the rows a run could not store
    opperf baseline results/cpu.db -o baselines/cpu.json     a baseline file from a database
    opperf compare A B               B against A (databases or baseline files): the gate's table
    opperf catalog --markdown        the built-in ops, backends and formulas as README's table
    opperf calibrate                 measure this device's ceilings (bandwidth, GEMM, FMA, launch) into its database
    opperf timeline results/cpu.db -o timeline.html   a swimlane of a sweep: cases per worker/GPU, their phases
    opperf import trace.json -o profile.db --configs replay/   a profile -> signatures -> replay configs
    opperf shapes --target-models dsv3,qwen3-32b --tp 1,8      cases: configs from model configs
    opperf backfill profile.db results/h100.db                 replayed times into the profile
    opperf replay-report profile.db -o reports/                profiled vs replayed, by share
    opperf lookup gemm m=4096 n=4096 k=4096 --db results/h100.db   measured, interpolated or roofline
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from pytest_opperf import __version__


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="opperf", description="pytest-opperf: operator performance in pytest. "
                                     "Benchmarks run with `pytest benches/`; this command inspects specs and results.")
    parser.add_argument("--version", action="version", version=f"pytest-opperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the plugin version")
    p_dev = sub.add_parser("devices", help="list the hardware specs")
    p_dev.add_argument("--hardware", type=Path, help="extra specs file, as --opperf-hardware")
    p_rep = sub.add_parser("report", help="summarise a results database, per op",
                           description="Per op: cases, best and worst MFU/MBU (and GFLOP/s, GB/s) with the case, "
                                       "the fastest backend per shape and the wins per backend, unstable and "
                                       "throttled rows; then the runs (device, torch, driver, commit, date).")
    p_rep.add_argument("db", type=Path)
    p_rep.add_argument("--op", action="append", help="only this op (repeatable; default: every op)")
    p_rep.add_argument("--limit", type=int, default=None,
                       help="lines per table (default 20; with --rows, 50 rows)")
    p_rep.add_argument("--markdown", action="store_true", help="print markdown instead of a terminal table")
    p_rep.add_argument("--rows", action="store_true", help="print the op's stored rows instead of the summary")
    p_plot = sub.add_parser("plot", help="draw figures of results (needs pytest-opperf[plot])",
                            description="Write one figure per op (and device or database) to DIR: roofline "
                                        "(FLOP/s over FLOP/byte under the device's roofs), lines (a line per "
                                        "backend over one swept parameter), speedup (backend A over B per shape), "
                                        "devices (the second database over the first, per case in both).")
    p_plot.add_argument("dbs", type=Path, nargs="+", metavar="DB", help="a results database; two for --kind devices")
    p_plot.add_argument("--kind", default="roofline", help="roofline, lines, speedup or devices (default roofline)")
    p_plot.add_argument("--op", action="append", help="only this op (repeatable; default: every op that can be drawn)")
    p_plot.add_argument("-o", "--output", type=Path, default=Path("plots"), metavar="DIR", help="default: plots/")
    p_plot.add_argument("--format", default="png", help="png, svg or both: png,svg (default png)")
    p_plot.add_argument("--x", help="lines: the swept parameter (default: the one with the most values)")
    p_plot.add_argument("--y", default="time_us", help="lines: time_us, gflops, gbytes_per_s, mfu or mbu")
    p_plot.add_argument("--a", help="speedup: the backend whose speedup is shown (default: the first not --b)")
    p_plot.add_argument("--b", help="speedup: the backend compared against (default: torch)")
    p_plot.add_argument("--max-panels", type=int, default=12, help="lines: panels at most (default 12)")
    p_plot.add_argument("--max-cases", type=int, default=60, help="speedup, devices: bars at most (default 60)")
    p_plot.add_argument("--hardware", type=Path, help="extra specs file, as --opperf-hardware (roofline peaks)")
    p_html = sub.add_parser("html", help="write a self-contained HTML report of databases",
                            description="One HTML file, no server, no network: per database its runs, per op "
                                        "the summary, plots (inline SVG) and a sortable, filterable table of "
                                        "the rows; the gate's verdicts with --gate.")
    p_html.add_argument("dbs", type=Path, nargs="+", metavar="DB")
    p_html.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="default: report.html")
    p_html.add_argument("--gate", type=Path, metavar="REPORT.json", help="a report of --opperf-report-json")
    p_html.add_argument("--op", action="append", help="only this op (repeatable)")
    p_html.add_argument("--title", help="the page's title")
    p_html.add_argument("--hardware", type=Path, help="extra specs file, as --opperf-hardware (roofline peaks)")
    p_best = sub.add_parser("best", help="per shape, the fastest knobs of a tuning sweep; export them for the kernels",
                            description="For every backend that ran knobs and every shape: the fastest knob set, "
                                        "its time, the runner-up and the margin over it, the default (the row "
                                        "without knobs) and the speedup over it. --export writes the winners as "
                                        "the JSON table our Triton kernels read (--opperf-tuned, OPPERF_TUNED).")
    p_best.add_argument("db", type=Path)
    p_best.add_argument("--op", action="append", help="only this op (repeatable; default: every op that ran knobs)")
    p_best.add_argument("--backend", help="only this backend")
    p_best.add_argument("--timer", help="only rows of this timer")
    p_best.add_argument("--cache", help="only rows of this cache state (cold or hot)")
    p_best.add_argument("--export", type=Path, metavar="FILE.json", help="write the tuned-knobs table to FILE.json")
    p_best.add_argument("--limit", type=int, default=50, help="shapes per op (default 50)")
    p_best.add_argument("--markdown", action="store_true", help="print markdown instead of a terminal table")
    p_exp = sub.add_parser("export", help="an op's rows as CSV or JSON")
    p_exp.add_argument("db", type=Path)
    p_exp.add_argument("--op", required=True)
    p_exp.add_argument("--format", default="csv", help="csv (with a header), json (a list of row objects), or hcom "
                                                        "(a collective in seed 001's hcom_*.csv columns)")
    p_exp.add_argument("-o", "--output", type=Path, metavar="FILE", help="default: standard output")
    p_meta = sub.add_parser("datasette-metadata", help="Datasette metadata: column descriptions, units, facets",
                            description="Write metadata for `datasette DB... -m FILE` (Datasette is not needed "
                                        "to write it).")
    p_meta.add_argument("dbs", type=Path, nargs="+", metavar="DB")
    p_meta.add_argument("-o", "--output", type=Path, metavar="FILE", help="default: standard output")
    p_merge = sub.add_parser("merge", help="merge result databases and rescue files into one",
                             description="Merge result databases (e.g. one per --opperf-shard) and rescue files "
                             "(results/<device>.rescue.jsonl: the rows a run could not store) into OUT, which may "
                             "already exist (the device's database itself): on each op's unique key the newest "
                             "row (created_at) wins, every run is kept, all in one transaction after integrity "
                             "checks.")
    p_merge.add_argument("out", type=Path, metavar="OUT.db")
    p_merge.add_argument("inputs", type=Path, nargs="+", metavar="IN",
                         help="a result database, or a rescue file (*.jsonl, or recognised by its first line)")
    p_base = sub.add_parser("baseline", help="write a baseline file from a database's latest rows",
                            description="Take the latest row of every case in DB and write them into the baseline "
                                        "FILE; cases already in FILE and not in DB (or not in --op) are kept.")
    p_base.add_argument("db", type=Path)
    p_base.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="baseline file (JSON)")
    p_base.add_argument("--op", action="append", help="only this op's cases (repeatable)")
    p_base.add_argument("--runs", type=int, default=1, metavar="N",
                        help="keep the last N runs of each case already in FILE (default 1: replace it)")
    p_cmp = sub.add_parser("compare", help="compare B against A: databases or baseline files",
                           description="Judge every case of B against the same case in A with the gate's rule; "
                                       "exit status 1 when a case of B regressed.")
    p_cmp.add_argument("a", type=Path, help="the reference: a results database or a baseline file")
    p_cmp.add_argument("b", type=Path, help="the one compared: a results database or a baseline file")
    p_cmp.add_argument("--max-regression", default="5%", help="threshold, as --opperf-max-regression (default 5%%)")
    p_cmp.add_argument("--rule", default="ci", help="as --opperf-gate-rule: ci, spread or threshold (default ci)")
    p_cmp.add_argument("--all", action="store_true", help="list the unchanged cases too")
    p_cmp.add_argument("--markdown", action="store_true", help="print the markdown report instead of the table")
    p_cat = sub.add_parser("catalog", help="list the built-in ops, their backends and formulas",
                           description="The built-in ops: family, parameters, backends, FLOP and byte formulas.")
    p_cat.add_argument("--markdown", action="store_true", help="print README's markdown table")
    p_cat.add_argument("--readme", type=Path, metavar="FILE",
                       help="rewrite the table between <!-- catalog --> and <!-- /catalog --> in FILE")
    from pytest_opperf.run import calibration

    calibration.add_parser(sub)
    p_tl = sub.add_parser("timeline", help="draw a swimlane of a sweep: which case ran when, where, and its phases",
                          description="One lane per xdist worker and GPU, one bar per case of one run, split into "
                                      "its phases (set-up, inputs, check, warm-up, device state, sampling, "
                                      "timed-call check, record), from the rows' started_unix_s, ended_unix_s "
                                      "and phase_*_ms columns.")
    p_tl.add_argument("db", type=Path)
    p_tl.add_argument("-o", "--output", type=Path, default=Path("timeline.html"), metavar="FILE",
                      help="FILE.html (self-contained) or FILE.png (needs pytest-opperf[plot]); default timeline.html")
    p_tl.add_argument("--run", metavar="RUN_ID", help="the run to draw (default: the latest with timed rows)")
    _add_pipeline_parsers(sub)
    args = parser.parse_args(argv)

    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "devices":
        return _devices(args.hardware)
    if args.command in _VIEW_COMMANDS:
        return _view(args)
    if args.command == "merge":
        return _merge(args.out, args.inputs)
    if args.command == "baseline":
        return _baseline(args.db, args.output, args.op, args.runs)
    if args.command == "compare":
        return _compare(args.a, args.b, args.max_regression, args.rule, args.all, args.markdown)
    if args.command == "catalog":
        return _catalog(args.markdown, args.readme)
    if args.command == "calibrate":
        return calibration.command(args)
    if args.command in _PIPELINE_COMMANDS:
        from pytest_opperf.pipeline import commands

        return commands.run(args)
    parser.print_help()
    return 0


_PIPELINE_COMMANDS = ("import", "shapes", "backfill", "replay-report", "lookup")


def _add_pipeline_parsers(sub) -> None:
    """The seed-001 pipeline: profile -> signatures -> replay configs -> backfill -> report; lookup."""
    p_imp = sub.add_parser("import", help="import a profile (torch.profiler trace, kernel_details.csv) as signatures",
                           description="Read a torch.profiler Chrome trace (recorded with record_shapes=True) or "
                                       "Ascend kernel_details*.csv files (a file or a directory), aggregate the "
                                       "calls by signature, map them to catalogue ops and write a profile database.")
    p_imp.add_argument("path", type=Path, help="a trace .json/.json.gz, a kernel_details*.csv, or a directory of them")
    p_imp.add_argument("-o", "--output", type=Path, default=Path("profile.db"), help="default: profile.db")
    p_imp.add_argument("--configs", type=Path, metavar="DIR", help="also write the replay configs (one per op) here")
    p_imp.add_argument("--mapping", type=Path, action="append", metavar="FILE",
                       help="extra mapping rules, tried before the built-in ones (repeatable)")
    p_imp.add_argument("--source", default="auto", help="auto, torch.profiler or ascend (default auto: by the path)")
    p_imp.add_argument("--force", action="store_true", help="replace an existing OUTPUT")
    p_shp = sub.add_parser("shapes", help="write cases: configs of the catalogue ops from model configs",
                           description="Every catalogue case one layer of each model runs, per TP size, batch, "
                                       "sequence length and phase, as one cases: config per op.")
    p_shp.add_argument("--target-models", required=True, metavar="NAMES", help="comma-separated: dsv3,qwen3-32b")
    p_shp.add_argument("--tp", default="1", help="TP sizes, comma-separated (default 1)")
    p_shp.add_argument("--batch", default="1", help="batch sizes (sequences), comma-separated (default 1)")
    p_shp.add_argument("--seq", default="2048", help="prefill lengths / decode context lengths (default 2048)")
    p_shp.add_argument("--phases", default="prefill,decode", help="prefill, decode or both (default both)")
    p_shp.add_argument("--dtype", default="bf16", help="the cases' dtype (default bf16)")
    p_shp.add_argument("--rows", type=int, default=0, help="at most N cases per op, sampled with --seed (0: all)")
    p_shp.add_argument("--seed", type=int, default=0, help="seed of the --rows sample (default 0)")
    p_shp.add_argument("--max-hbm-gb", type=float, default=0.0,
                       help="drop cases whose memory estimate exceeds this many GB (0: no limit)")
    p_shp.add_argument("--models-dir", type=Path, metavar="DIR", help="extra model config files (YAML)")
    p_shp.add_argument("-o", "--output", type=Path, default=Path("shapes"), metavar="DIR", help="default: shapes/")
    p_bf = sub.add_parser("backfill", help="write replayed times from a results database into a profile database")
    p_bf.add_argument("profile", type=Path, help="the profile database of opperf import")
    p_bf.add_argument("results", type=Path, help="the results database the replay wrote (results/<device>.db)")
    p_bf.add_argument("--mode", default="all", help="all (default) or missing-only")
    p_rr = sub.add_parser("replay-report", help="the gap between profiled and replayed times: markdown and CSV")
    p_rr.add_argument("profile", type=Path, help="a backfilled profile database")
    p_rr.add_argument("-o", "--output", type=Path, default=Path("reports"), metavar="DIR", help="default: reports/")
    p_rr.add_argument("--top", type=int, default=30, help="rows in the report's tables (default 30)")
    p_lk = sub.add_parser("lookup", help="how long an op takes: measured, interpolated or roofline",
                          description="Answer from a results database: the measured row, else a log-log "
                                      "interpolation between measured neighbours, else the roofline bound.")
    p_lk.add_argument("op")
    p_lk.add_argument("params", nargs="*", metavar="PARAM=VALUE")
    p_lk.add_argument("--db", type=Path, required=True, help="a results database (results/<device>.db)")
    p_lk.add_argument("--dtype", default="bf16", help="default bf16")
    p_lk.add_argument("--backend", help="only this backend's rows (default: the fastest backend)")
    p_lk.add_argument("--device", help="hardware spec for the roofline (default: the database's device)")
    p_lk.add_argument("--hardware", type=Path, help="extra specs file, as --opperf-hardware")


def _devices(extra: Optional[Path]) -> int:
    from pytest_opperf.hardware.specs import SpecError, load_specs

    try:
        specs = load_specs(extra)
    except SpecError as exc:
        print(f"opperf: {exc}", file=sys.stderr)
        return 2
    print(f"{'name':<12} {'backend':<7} {'bf16 TFLOP/s':>12} {'fp32 TFLOP/s':>12} {'GB/s':>7}  title")
    for spec in specs.values():
        bf16, fp32 = spec.matrix_tflops.get("bf16"), spec.matrix_tflops.get("fp32")
        print(f"{spec.name:<12} {spec.backend:<7} {_f(bf16):>12} {_f(fp32):>12} {_f(spec.mem_bw_gbytes_per_s):>7}  {spec.title}")
    return 0



def _view(args: argparse.Namespace) -> int:
    """The commands that read results databases: a bad input is one line on stderr and exit 2."""
    from pytest_opperf.hardware.specs import SpecError
    from pytest_opperf.view.source import ViewError

    try:
        return _VIEW_COMMANDS[args.command](args)
    except (ViewError, SpecError) as exc:
        print(f"opperf {args.command}: {exc}", file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from pytest_opperf.view import summary
    from pytest_opperf.view.source import Results
    from pytest_opperf.view.text import print_sections

    results = Results.open(args.db)
    if args.rows:
        sections = [summary.rows_section(results.table(op), args.limit or 50) for op in results.pick(args.op)]
    else:
        sections = summary.report(results, args.op, args.limit or 20)
    print_sections(sections, markdown=args.markdown)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pytest_opperf.hardware.specs import load_specs
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


def _html(args: argparse.Namespace) -> int:
    from pytest_opperf.hardware.specs import load_specs
    from pytest_opperf.view import html

    gate = html.load_gate(args.gate) if args.gate else None
    path = html.write(args.output, args.dbs, gate, load_specs(args.hardware), args.op, args.title)
    print(f"opperf html: {path} ({path.stat().st_size // 1024} KiB)")
    return 0


def _best(args: argparse.Namespace) -> int:
    from pytest_opperf.view import best
    from pytest_opperf.view.source import Results
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


def _export(args: argparse.Namespace) -> int:
    from pytest_opperf.view.export import export
    from pytest_opperf.view.source import Results

    _emit(export(Results.open(args.db), args.op, args.format), args.output)
    return 0


def _datasette_metadata(args: argparse.Namespace) -> int:
    import json

    from pytest_opperf.view.datasette import metadata
    from pytest_opperf.view.source import Results

    _emit(json.dumps(metadata([Results.open(p) for p in args.dbs]), indent=2) + "\n", args.output)
    return 0


def _emit(text: str, output: Optional[Path]) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"{output}", file=sys.stderr)


def _timeline(args: argparse.Namespace) -> int:
    from pytest_opperf.view import timeline

    sweep = timeline.load(args.db, args.run)
    path = timeline.write(sweep, args.output)
    print(f"opperf timeline: {path} ({len(sweep.bars)} cases, {len(sweep.lanes)} lanes, {sweep.span_s:.1f} s)")
    return 0


_VIEW_COMMANDS = {"report": _report, "plot": _plot, "html": _html, "export": _export, "best": _best,
                  "datasette-metadata": _datasette_metadata}
_VIEW_COMMANDS["timeline"] = _timeline


def _merge(out: Path, inputs: list[Path]) -> int:
    from pytest_opperf.store.database import MergeError, is_rescue_file, merge

    warnings: list[str] = []
    try:
        counts = merge(out, inputs, warnings)
    except MergeError as exc:
        print(f"opperf merge: {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"opperf merge: warning: {warning}", file=sys.stderr)
    for table, count in sorted(counts.items()):
        print(f"{table:<20} {count['read']:>8} read {count['written']:>8} written")
    rescues = [p for p in inputs if is_rescue_file(p)]
    kinds = [f"{len(inputs) - len(rescues)} databases"] if len(rescues) < len(inputs) else []
    kinds += [f"{len(rescues)} rescue files"] if rescues else []
    print(f"opperf merge: {', '.join(kinds)} -> {out}")
    if rescues:
        print(f"opperf merge: the rescued rows are in {out}; delete {' '.join(map(str, rescues))} "
              f"once you have checked them")
    return 0


def _baseline(db: Path, output: Path, ops: Optional[list[str]], runs: int = 1) -> int:
    from pytest_opperf.gate.baseline import Baseline, BaselineError, from_database
    from pytest_opperf.gate.noise import MAX_RUNS

    if not 1 <= runs <= MAX_RUNS:
        print(f"opperf: --runs={runs}: expected an integer from 1 to {MAX_RUNS}", file=sys.stderr)
        return 2

    try:
        fresh = from_database(db, ops)
        old = Baseline.load(output) if output.exists() else None
    except BaselineError as exc:
        print(f"opperf: {exc}", file=sys.stderr)
        return 2
    if old is not None and old.device != fresh.device:
        print(f"opperf: {output} is the baseline of device {old.device!r}, {db} holds {fresh.device!r}", file=sys.stderr)
        return 2
    merged = old.merged(fresh, runs) if old else fresh
    merged.save(output)
    kept = len(merged.entries) - len(fresh.entries)
    print(f"{len(fresh.entries)} cases written to {output}" + (f" ({kept} other cases kept)" if kept else ""))
    return 0


def _compare(a: Path, b: Path, threshold_text: str, rule: str, show_all: bool, markdown: bool) -> int:
    from pytest_opperf.gate.baseline import BaselineError, load_any
    from pytest_opperf.gate.rules import RULES, judge
    from pytest_opperf.gate.report import Comparison
    from pytest_opperf.run.config import parse_fraction

    try:
        threshold = parse_fraction(threshold_text)
    except ValueError:
        print(f"opperf: --max-regression={threshold_text}: expected a threshold above zero such as 5% or 0.05",
              file=sys.stderr)
        return 2
    if rule not in RULES:
        print(f"opperf: --rule={rule}: expected one of {', '.join(RULES)}", file=sys.stderr)
        return 2
    try:
        ref, other = load_any(a), load_any(b)
    except BaselineError as exc:
        print(f"opperf: {exc}", file=sys.stderr)
        return 2
    verdicts = [judge(ref.entries.get(key), entry, threshold, rule, "--max-regression")
                for key, entry in sorted(other.entries.items())]
    comparison = Comparison.build(ref, verdicts, rule, threshold, other.device, other.environment)
    print(f"{b} against {a}")
    if markdown:
        print(comparison.markdown(title=f"opperf compare {a.name} {b.name}"))
    else:
        print("\n".join(comparison.lines(limit=10**9, show_same=show_all)))
    return 1 if comparison.failed else 0


def _catalog(markdown: bool, readme: Optional[Path]) -> int:
    from pytest_opperf.catalog import load_builtin, table

    load_builtin()
    if readme is None:
        print(table.markdown() if markdown else table.text())
        return 0
    try:
        changed = table.update_readme(readme)
    except (OSError, table.TableError) as exc:
        print(f"opperf catalog: {exc}", file=sys.stderr)
        return 2
    print(f"{readme}: catalogue table {'updated' if changed else 'already up to date'}")
    return 0


def _f(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
