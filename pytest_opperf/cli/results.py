"""The commands that combine and judge results: merge (databases, rescue files), baseline, compare."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_opperf.amounts import parse_fraction
from pytest_opperf.commands import CommandError, arg, command
from pytest_opperf.gate.baseline import BaselineError
from pytest_opperf.gate.rules import RULES
from pytest_opperf.cli.views import WIDTH, width
from pytest_opperf.store.database import MergeError


@command("merge", help="merge result databases and rescue files into one",
         description="Merge result databases (e.g. one per --opperf-shard) and rescue files "
                     "(results/<device>.rescue.jsonl: the rows a run could not store) into OUT, which may already "
                     "exist (the device's database itself): on each op's unique key the newest row (created_at) "
                     "wins, every run is kept, all in one transaction after integrity checks.",
         args=[arg("out", type=Path, metavar="OUT.db"),
               arg("inputs", type=Path, nargs="+", metavar="IN",
                   help="a result database, or a rescue file (*.jsonl, or recognised by its first line)")],
         errors=(MergeError,), outputs=("out",))
def _merge(args: argparse.Namespace) -> int:
    from pytest_opperf.store.database import is_rescue_file, merge, migration_note

    out, inputs = args.out, args.inputs
    warnings: list[str] = []
    migrated: dict[str, list] = {}
    counts = merge(out, inputs, warnings, migrated)
    for warning in warnings:
        print(f"opperf merge: warning: {warning}", file=sys.stderr)
    held = _row_counts(out, list(counts))
    for table, count in sorted(counts.items()):
        # What the file holds: rows of the same case in several inputs are written once each, the newest last.
        print(f"{table:<20} {count['read']:>8,} rows read, {held[table]:>8,} in {out.name}")
    for table, columns in sorted(migrated.items()):
        print(f"opperf merge: {migration_note(out, table, columns)}")
    rescues = [p for p in inputs if is_rescue_file(p)]
    kinds = [f"{len(inputs) - len(rescues)} databases"] if len(rescues) < len(inputs) else []
    kinds += [f"{len(rescues)} rescue files"] if rescues else []
    print(f"opperf merge: {', '.join(kinds)} -> {out}")
    if rescues:
        print(f"opperf merge: the rescued rows are in {out}; delete {' '.join(map(str, rescues))} "
              f"once you have checked them")
    return 0


def _row_counts(path: Path, tables: list[str]) -> dict[str, int]:
    """How many rows each table of the database at `path` holds."""
    from pytest_opperf.store.results import open_results

    with open_results(path) as results:
        return {t: results.db[t].count if results.has_table(t) else 0 for t in tables}


@command("baseline", help="write a baseline file from a database's latest rows",
         description="Take the latest row of every case in DB and write them into the baseline FILE; cases "
                     "already in FILE and not in DB (or not in --op) are kept.",
         args=[arg("db", type=Path),
               arg("-o", "--output", type=Path, required=True, metavar="FILE", help="baseline file (JSON)"),
               arg("--op", action="append", help="only this op's cases (repeatable)"),
               arg("--runs", type=int, default=1, metavar="N",
                   help="keep the last N runs of each case already in FILE (default 1: replace it)")],
         errors=(BaselineError,), prefix="opperf", outputs=("output",))
def _baseline(args: argparse.Namespace) -> int:
    from pytest_opperf.gate.baseline import Baseline, from_database
    from pytest_opperf.gate.noise import MAX_RUNS

    db, output = args.db, args.output
    if not 1 <= args.runs <= MAX_RUNS:
        raise CommandError(f"--runs={args.runs}: expected an integer from 1 to {MAX_RUNS}")
    fresh = from_database(db, args.op)
    old = Baseline.load(output) if output.exists() else None
    if old is not None and old.device != fresh.device:
        raise CommandError(f"{output} is the baseline of device {old.device!r}, {db} holds {fresh.device!r}")
    merged = old.merged(fresh, args.runs) if old else fresh
    merged.save(output)
    kept = len(merged.entries) - len(fresh.entries)
    print(f"{len(fresh.entries)} cases written to {output}" + (f" ({kept} other cases kept)" if kept else ""))
    return 0


@command("compare", help="compare B against A: databases or baseline files",
         description="Judge every case of B against the same case in A with the gate's rule; exit status 1 when "
                     "a case of B regressed.",
         args=[arg("a", type=Path, help="the reference: a results database or a baseline file"),
               arg("b", type=Path, help="the one compared: a results database or a baseline file"),
               arg("--max-regression", default="5%", help="threshold, as --opperf-max-regression (default 5%%)"),
               arg("--rule", default="ci", help="as --opperf-gate-rule: ci, spread or threshold (default ci)"),
               arg("--all", action="store_true", help="list the unchanged cases too"),
               arg("--markdown", action="store_true", help="print the markdown report instead of the table"),
               WIDTH],
         errors=(BaselineError,), prefix="opperf")
def _compare(args: argparse.Namespace) -> int:
    from pytest_opperf.gate.baseline import load_any
    from pytest_opperf.gate.rules import judge
    from pytest_opperf.gate.report import Comparison
    from pytest_opperf.view.terminal import Out, gate_summary

    a, b = args.a, args.b
    try:
        threshold = parse_fraction(args.max_regression)
    except ValueError:
        raise CommandError(f"--max-regression={args.max_regression}: expected a threshold above zero such as 5% "
                           f"or 0.05") from None
    if args.rule not in RULES:
        raise CommandError(f"--rule={args.rule}: expected one of {', '.join(RULES)}")
    ref, other = load_any(a), load_any(b)
    verdicts = [judge(ref.entries.get(key), entry, threshold, args.rule, "--max-regression")
                for key, entry in sorted(other.entries.items())]
    comparison = Comparison.build(ref, verdicts, args.rule, threshold, other.device, other.environment)
    if args.markdown:
        print(f"{b} against {a}")
        print(comparison.markdown(title=f"opperf compare {a.name} {b.name}"))
    else:
        out = Out.of_stream(sys.stdout, width(args.width))
        out.line(f"{b} against {a}")
        gate_summary(comparison, 10**9, out, show_same=args.all)
    return 1 if comparison.failed else 0
