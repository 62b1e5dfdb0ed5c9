"""The pipeline's `opperf` commands: import, shapes, backfill, replay-report, lookup.

cli.py parses their arguments and calls ``run(args)``; bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from pytest_opperf.pipeline.signature import ProfileError

COMMANDS = ("import", "shapes", "backfill", "replay-report", "lookup")


def run(args: argparse.Namespace) -> int:
    try:
        return _COMMANDS[args.command](args)
    except ProfileError as exc:
        print(f"opperf {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output that cannot be written: the path and the system's reason
        print(f"opperf {args.command}: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _import(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline import configs, profile

    rows = profile.import_profile(args.path, args.output, args.mapping, args.source, args.force)
    total_us = sum(r["profiled_total_us"] for r in rows)
    print(f"opperf import: {len(rows)} signatures from {args.path} ({rows[0]['time_source']} time, "
          f"{total_us:.1f} us) -> {args.output}")
    for status in ("mapped", "unreplayable", "unmapped"):
        picked = [r for r in rows if r["status"] == status]
        share = sum(r["share"] for r in picked)
        print(f"  {status}: {len(picked)} signatures, {100 * share:.1f}% of the profiled time")
    for r in [r for r in rows if r["status"] == "unreplayable"][:10]:
        print(f"  unreplayable: {r['op_type']} [{r['input_shapes']}]: {r['reason']}")
    if args.configs:
        files = profile.write_replay_configs(rows, args.configs, str(args.path))
        if files:
            print(f"replay configs in {args.configs}; run them with:\n  {configs.pytest_command(files)}")
        else:
            print("no mapped signature: no replay config written")
    return 0


def _shapes(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline import configs, models, shapes

    known = models.load(args.models_dir)
    chosen = models.select(_list(args.target_models), known)
    plan = shapes.plan(chosen, _ints(args.tp, "--tp"), _ints(args.batch, "--batch"), _ints(args.seq, "--seq"),
                       _list(args.phases), args.dtype, args.rows, args.seed, args.max_hbm_gb)
    header = (f"written by opperf shapes --target-models {args.target_models} --tp {args.tp} --batch {args.batch} "
              f"--seq {args.seq} --phases {args.phases} --rows {args.rows} --seed {args.seed} "
              f"--max-hbm-gb {args.max_hbm_gb:g}\nmodels: " + "; ".join(f"{m.name} ({m.source})" for m in chosen))
    for name, tp, why in plan.skipped:
        print(f"opperf shapes: {name} at tp={tp} skipped: {why}")
    files = shapes.write(plan, args.output, header)
    for f in files:
        op = f.stem
        kept = len({c.params for c in plan.cases if c.op == op})
        print(f"  {op}: {plan.generated[op]} cases generated, {plan.over_budget.get(op, 0)} over --max-hbm-gb, "
              f"{kept} written")
    dropped = sorted(op for op in plan.generated if op not in {f.stem for f in files})
    for op in dropped:
        print(f"  {op}: {plan.generated[op]} cases generated, none written (all over --max-hbm-gb)")
    if files:
        print(f"configs in {args.output}; run them with:\n  {configs.pytest_command(files)}")
    return 0


def _backfill(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline import backfill

    done = backfill.backfill(args.profile, args.results, args.mode)
    print(f"opperf backfill ({args.mode}): {done.filled} signatures filled from {args.results}"
          + (f", {done.kept} kept (already replayed)" if args.mode == "missing-only" else "")
          + f"; {len(done.not_measured)} mapped but not measured; {done.unreplayable} unreplayable; "
          f"{done.unmapped} unmapped")
    for sig in done.not_measured[:20]:
        print(f"  not measured: {sig['op']} {sig['backend']}-{sig['dtype']} {sig['params']} "
              f"({sig['op_type']} [{sig['input_shapes']}])")
    return 0


def _replay_report(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline import profile, replay_report

    md, csv_path = replay_report.write(args.profile, args.output, args.top)
    t = replay_report.totals(profile.load(args.profile))
    print(f"opperf replay-report: {md} and {csv_path}")
    print(f"  mapped {100 * t.share(t.mapped_us):.1f}% of the profiled time (replayed {100 * t.share(t.exact_us):.1f}% "
          f"exact, {100 * t.share(t.proxy_us):.1f}% by stand-ins), unreplayable {100 * t.share(t.unreplayable_us):.1f}%, "
          f"unmapped {100 * t.share(t.unmapped_us):.1f}%")
    return 0


def _lookup(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline import lookup

    params = lookup.parse_params(args.op, args.params)
    answer = lookup.lookup(args.db, args.op, params, args.dtype, args.backend, args.device, args.hardware)
    shown = ", ".join(f"{k}={v}" for k, v in answer.params.items())
    print(f"{answer.op}({shown}) {answer.dtype} on {answer.device}: {answer.time_us:.4g} us [{answer.kind}] "
          f"{answer.detail}")
    return 0


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(t) for t in _list(text)]
    except ValueError:
        raise ProfileError(f"{option}={text}: expected comma-separated positive ints") from None
    if not values or any(v <= 0 for v in values):
        raise ProfileError(f"{option}={text}: expected comma-separated positive ints")
    return values


_COMMANDS = {"import": _import, "shapes": _shapes, "backfill": _backfill, "replay-report": _replay_report,
             "lookup": _lookup}
