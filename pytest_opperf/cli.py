"""The `opperf` command: look at what the plugin knows and what it stored.

    opperf version                   the plugin's version
    opperf devices                   the hardware specs (name, peaks, bandwidth, source)
    opperf report results/cpu.db     the tables of a results database, row counts and runs
    opperf merge all.db s0.db s1.db  merge per-shard databases: newest row per key wins, runs kept
    opperf baseline results/cpu.db -o baselines/cpu.json     a baseline file from a database
    opperf compare A B               B against A (databases or baseline files): the gate's table
    opperf catalog --markdown        the built-in ops, backends and formulas as README's table
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
    p_rep = sub.add_parser("report", help="summarise a results database")
    p_rep.add_argument("db", type=Path)
    p_rep.add_argument("--op", help="show the rows of this op's table")
    p_rep.add_argument("--limit", type=int, default=50)
    p_merge = sub.add_parser("merge", help="merge per-shard result databases into one",
                             description="Merge result databases (e.g. one per --opperf-shard) into OUT, which "
                             "may already exist: on each op's unique key the newest row (created_at) wins, "
                             "every run is kept, all in one transaction after integrity checks.")
    p_merge.add_argument("out", type=Path, metavar="OUT.db")
    p_merge.add_argument("inputs", type=Path, nargs="+", metavar="IN.db")
    p_base = sub.add_parser("baseline", help="write a baseline file from a database's latest rows",
                            description="Take the latest row of every case in DB and write them into the baseline "
                                        "FILE; cases already in FILE and not in DB (or not in --op) are kept.")
    p_base.add_argument("db", type=Path)
    p_base.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="baseline file (JSON)")
    p_base.add_argument("--op", action="append", help="only this op's cases (repeatable)")
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
    args = parser.parse_args(argv)

    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "devices":
        return _devices(args.hardware)
    if args.command == "report":
        return _report(args.db, args.op, args.limit)
    if args.command == "merge":
        return _merge(args.out, args.inputs)
    if args.command == "baseline":
        return _baseline(args.db, args.output, args.op)
    if args.command == "compare":
        return _compare(args.a, args.b, args.max_regression, args.rule, args.all, args.markdown)
    if args.command == "catalog":
        return _catalog(args.markdown, args.readme)
    parser.print_help()
    return 0


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


def _report(path: Path, op: Optional[str], limit: int) -> int:
    import sqlite_utils

    if not path.is_file():
        print(f"opperf: {path}: no such database", file=sys.stderr)
        return 2
    db = sqlite_utils.Database(path)
    tables = [t for t in db.table_names() if t != "runs"]
    if op is None:
        for name in tables:
            print(f"{name:<20} {db[name].count:>8} rows")
        if "runs" in db.table_names():
            print(f"{'runs':<20} {db['runs'].count:>8} runs")
            for run in db.query("select run_id, started_at, device, torch, git_commit from runs order by started_at desc limit 5"):
                print(f"  {run['run_id']}  {run['started_at']}  {run['device']}  torch {run['torch']}  {run['git_commit'] or ''}")
        return 0
    if op not in tables:
        print(f"opperf: {path}: no table {op!r} (tables: {', '.join(tables)})", file=sys.stderr)
        return 2
    rows = list(db[op].rows_where(limit=limit))
    if not rows:
        return 0
    skip = {"run_id", "created_at", "test_id", "kernels", "peak_dtype", "peak_kind", "knobs"}
    cols = [c for c in rows[0] if c not in skip]
    print("\t".join(cols))
    for row in rows:
        print("\t".join(_f(row[c]) for c in cols))
    return 0


def _merge(out: Path, inputs: list[Path]) -> int:
    from pytest_opperf.store.database import MergeError, merge

    try:
        counts = merge(out, inputs)
    except MergeError as exc:
        print(f"opperf merge: {exc}", file=sys.stderr)
        return 2
    for table, count in sorted(counts.items()):
        print(f"{table:<20} {count['read']:>8} read {count['written']:>8} written")
    print(f"opperf merge: {len(inputs)} databases -> {out}")
    return 0


def _baseline(db: Path, output: Path, ops: Optional[list[str]]) -> int:
    from pytest_opperf.gate.baseline import Baseline, BaselineError, from_database

    try:
        fresh = from_database(db, ops)
        old = Baseline.load(output) if output.exists() else None
    except BaselineError as exc:
        print(f"opperf: {exc}", file=sys.stderr)
        return 2
    if old is not None and old.device != fresh.device:
        print(f"opperf: {output} is the baseline of device {old.device!r}, {db} holds {fresh.device!r}", file=sys.stderr)
        return 2
    merged = old.merged(fresh) if old else fresh
    merged.save(output)
    kept = len(merged.entries) - len(fresh.entries)
    print(f"{len(fresh.entries)} cases written to {output}" + (f" ({kept} other cases kept)" if kept else ""))
    return 0


def _compare(a: Path, b: Path, threshold_text: str, rule: str, show_all: bool, markdown: bool) -> int:
    from pytest_opperf.gate.baseline import RULES, BaselineError, judge, load_any
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
