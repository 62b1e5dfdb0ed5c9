"""The pipeline's `opperf` commands: import, shapes, backfill, replay-report, sequence, lookup, predict.

Seed 001's pipeline: profile -> signatures -> replay configs -> backfill -> report; lookup.
Bad input (ProfileError) and an output that cannot be written are one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_opperf.commands import HARDWARE, arg, command
from pytest_opperf.pipeline.reading.signature import ProfileError


def _say(exc: Exception) -> str:
    if isinstance(exc, OSError):  # an output that cannot be written: the path and the system's reason
        return f"{exc.filename or ''}: {exc.strerror or exc}"
    return str(exc)


BAD_INPUT = {"errors": (ProfileError, OSError), "message": _say}


@command("import", help="import a profile (torch.profiler trace, kernel_details.csv) as signatures",
         description="Read a torch.profiler Chrome trace (recorded with record_shapes=True) or Ascend "
                     "kernel_details*.csv files (a file or a directory), aggregate the calls by signature, map them "
                     "to catalogue ops and write a profile database.",
         args=[arg("path", type=Path, help="a trace .json/.json.gz, a kernel_details*.csv, or a directory of them"),
               arg("-o", "--output", type=Path, default=Path("profile.db"), help="default: profile.db"),
               arg("--configs", type=Path, metavar="DIR", help="also write the replay configs (one per op) here"),
               arg("--mapping", type=Path, action="append", metavar="FILE",
                   help="extra mapping rules, tried before the built-in ones (repeatable)"),
               arg("--source", default="auto", help="auto, torch.profiler or ascend (default auto: by the path)"),
               arg("--world-size", type=int, metavar="N",
                   help="devices of the profiled run, for the collectives (default: the profile's metadata)"),
               arg("--l2-mb", type=float, metavar="MB",
                   help="the profiled device's L2 in MiB, for the cache state of each replay (default: the trace's "
                        "device's spec; unknown: all cold)"),
               arg("--cache-rule", default="signature", metavar="RULE",
                   help="signature (default): one cache state per signature, by its weights and size; inputs: a "
                        "state per input (weights cold, other inputs resident when they fit half the L2), replayed "
                        "with --opperf-cache=resident where they differ"),
               arg("--force", action="store_true", help="replace an existing OUTPUT")],
         outputs=("output",), output_dirs=("configs",), **BAD_INPUT)
def _import(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline.mapping import configs, profile, tag

    rows = profile.import_profile(args.path, args.output, args.mapping, args.source, args.force, args.world_size,
                                  args.l2_mb, args.cache_rule)
    total_us = sum(r["profiled_total_us"] for r in rows)
    print(f"opperf import: {len(rows)} signatures from {args.path} ({rows[0]['time_source']} time, "
          f"{total_us:.1f} us) -> {args.output}")
    for status in ("mapped", "unreplayable", "unmapped"):
        picked = [r for r in rows if r["status"] == status]
        share = sum(r["share"] for r in picked)
        print(f"  {status}: {len(picked)} signatures, {100 * share:.1f}% of the profiled time")
    for r in [r for r in rows if r["status"] == "unreplayable"][:10]:
        print(f"  unreplayable: {r['op_type']} [{r['input_shapes']}]: {r['reason']}")
    unmapped = profile.unmapped_types(rows)
    if unmapped:
        print(f"  largest unmapped op types ({min(10, len(unmapped))} of {len(unmapped)}): share of the profiled "
              f"time, calls, signatures")
        width = min(60, max(len(u.op_type) for u in unmapped[:10]))
        for u in unmapped[:10]:
            print(f"    {u.op_type[:width]:<{width}} {100 * u.share:5.1f}% {u.calls:>8} calls {u.signatures:>5} sig")
    if args.configs:
        files = profile.write_replay_configs(rows, args.configs, str(args.path), profile.import_token(args.output))
        table = (args.configs / tag.TABLE).resolve()
        for cache, written in files.items():
            print(f"replay configs ({cache} cache) in {written[0].parent}; run them with:\n  "
                  f"{configs.pytest_command(written)} -p pytest_opperf.pipeline.mapping.tag --opperf-signatures={table}")
        if not files:
            print("no mapped signature: no replay config written")
    return 0


@command("shapes", help="write cases: configs of the catalogue ops from model configs",
         description="Every catalogue case one layer of each model runs, per TP size, batch, sequence length and "
                     "phase, as one cases: config per op.",
         args=[arg("--target-models", required=True, metavar="NAMES", help="comma-separated: dsv3,qwen3-32b"),
               arg("--tp", default="1", help="TP sizes, comma-separated (default 1)"),
               arg("--batch", default="1", help="batch sizes (sequences), comma-separated (default 1)"),
               arg("--seq", default="2048", help="prefill lengths / decode context lengths (default 2048)"),
               arg("--phases", default="prefill,decode", help="prefill, decode or both (default both)"),
               arg("--dtype", default="bf16", help="the cases' dtype (default bf16)"),
               arg("--rows", type=int, default=0, help="at most N cases per op, sampled with --seed (0: all)"),
               arg("--seed", type=int, default=0, help="seed of the --rows sample (default 0)"),
               arg("--max-hbm-gb", type=float, default=0.0,
                   help="drop cases whose memory estimate exceeds this many GB (0: no limit)"),
               arg("--models-dir", type=Path, metavar="DIR", help="extra model config files (YAML)"),
               arg("-o", "--output", type=Path, default=Path("shapes"), metavar="DIR", help="default: shapes/")],
         output_dirs=("output",), **BAD_INPUT)
def _shapes(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline.mapping import configs
    from pytest_opperf.pipeline.predict import models, shapes

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


@command("backfill", help="write replayed times from a results database into a profile database",
         args=[arg("profile", type=Path, help="the profile database of opperf import"),
               arg("results", type=Path, help="the results database the replay wrote (results/<device>.db)"),
               arg("--mode", default="all", help="all (default) or missing-only")],
         outputs=("profile",), **BAD_INPUT)
def _backfill(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline.replay import backfill

    done = backfill.backfill(args.profile, args.results, args.mode)
    print(f"opperf backfill ({args.mode}): {done.filled} signatures filled from {args.results}"
          + (f", {done.kept} kept (already replayed)" if args.mode == "missing-only" else "")
          + f"; {len(done.not_measured)} mapped but not measured; {done.unreplayable} unreplayable; "
          f"{done.unmapped} unmapped")
    if done.not_measured:
        print("  (a replayed row carries its signatures' ids: run the replay with the command opperf import "
              "printed, -p pytest_opperf.pipeline.mapping.tag included)")
    for sig in done.not_measured[:20]:
        print(f"  not measured: {sig['op']} {sig['backend']}-{sig['dtype']} {sig['params']} "
              f"({sig['op_type']} [{sig['input_shapes']}])")
    return 0


@command("replay-report", help="the gap between profiled and replayed times: markdown and CSV",
         args=[arg("profile", type=Path, help="a backfilled profile database"),
               arg("-o", "--output", type=Path, default=Path("reports"), metavar="DIR", help="default: reports/"),
               arg("--top", type=int, default=30, help="rows in the report's tables (default 30)"),
               arg("--results", type=Path, metavar="DB",
                   help="the results database of the replay: its all-cold and all-hot rows give the bounds beside "
                        "the estimate")],
         output_dirs=("output",), **BAD_INPUT)
def _replay_report(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline.replay import backfill, report
    from pytest_opperf.pipeline.mapping import profile

    rows = profile.load(args.profile)
    cache_bounds = None
    if args.results is not None:
        cache_bounds = report.bounds(rows, backfill.replayed_by_state(args.profile, args.results))
    md, csv_path = report.write(args.profile, args.output, args.top, cache_bounds)
    t = report.totals(rows)
    print(f"opperf replay-report: {md} and {csv_path}")
    print(f"  mapped {100 * t.share(t.mapped_us):.1f}% of the profiled time (replayed {100 * t.share(t.exact_us):.1f}% "
          f"exact, {100 * t.share(t.proxy_us):.1f}% by stand-ins), unreplayable {100 * t.share(t.unreplayable_us):.1f}%, "
          f"unmapped {100 * t.share(t.unmapped_us):.1f}%")
    m = report.model_figures(rows)
    if m.ratio is not None:
        top = m.dominant[0][0]
        print(f"  the model: replayed x count {m.replayed_sum_us:.1f} us / profiled {m.profiled_sum_us:.1f} us = "
              f"{m.ratio:.4f} over {100 * m.covered:.1f}% of the profile; time-weighted |error| "
              f"{100 * m.weighted_error:.1f}%, most from {top['op_type']} [{top['input_shapes']}]")
        print(f"  {report.bounds_line(cache_bounds)}")
    c = report.in_context(rows)
    if c is not None:
        iso = (f"; over the {c.isolated} also replayed alone: in sequence "
               f"{c.isolated_sequence_us / c.isolated_profiled_us:.4f}, isolated {c.isolated_us / c.isolated_profiled_us:.4f}"
               f" of the profile" if c.isolated and c.isolated_profiled_us else "")
        print(f"  in context: in-sequence {c.sequence_us:.1f} us / profiled {c.profiled_us:.1f} us = "
              f"{c.sequence_us / c.profiled_us:.4f} over {100 * c.covered:.1f}% of the profile{iso}")
    return 0


@command("sequence", help="replay a profile's calls in the order they ran: each signature's time in context",
         description="Run the profile's calls again in their recorded order on the device, each built as its "
                     "isolated replay, linked to the outputs it read, timed kernel by kernel under torch.profiler; "
                     "write each signature's in-sequence time (sequence_us) and context factor into the profile "
                     "database. With --backend OP=BACKEND: the step time per phase before and after that swap.",
         args=[arg("profile", type=Path, help="a profile database of opperf import"),
               arg("--device", help="the torch device to replay on (default: cuda when the profile holds device "
                                    "kernel times, else cpu)"),
               arg("--repeats", type=int, default=3, help="timed repetitions of the whole sequence (default 3)"),
               arg("--backend", action="append", metavar="OP=BACKEND",
                   help="what-if: replay the calls of catalogue op OP on BACKEND too (repeatable)"),
               arg("--replace", action="append", metavar="CLASS=OP:BACKEND",
                   help="what-if: each call of a module of CLASS (a leaf module of the captured model, fnmatch "
                        "pattern: LlamaRMSNorm, *RMSNorm) replaced by one call of catalogue op OP on BACKEND "
                        "(repeatable; needs a profile taken inside capture(trace, model))"),
               arg("--register", action="append", metavar="MODULE",
                   help="import MODULE (a module name, or a .py file) first: backends of your own that it registers "
                        "(repeatable)"),
               arg("--inputs", default="per-call", metavar="HOW",
                   help="per-call (default): inputs of their own for the k-th call of a signature in a step; "
                        "per-signature: one set a signature (less memory)"),
               arg("--seed", type=int, default=0, help="seed of the inputs (default 0)"),
               arg("--json", action="store_true", help="the phases' figures as JSON on stdout")],
         outputs=("profile",), **BAD_INPUT)
def _sequence(args: argparse.Namespace) -> int:
    import json

    from pytest_opperf.pipeline.mapping import profile
    from pytest_opperf.pipeline.replay import plan as planning
    from pytest_opperf.pipeline.replay import sequence, summary, whatif

    rows = profile.load(args.profile)
    calls = planning.load_calls(args.profile)
    whatif.register(args.register)
    overrides = whatif.parse_backends(args.backend)
    replace = whatif.parse_replacements(args.replace)
    device = planning.device_of(args.device, rows[0]["time_source"])
    say = planning.stderr
    say(f"opperf sequence: building {len(calls)} calls of {args.profile} on {device}")
    # One way through: the plan is built, the what-if transforms it, it runs, it is summed.
    plan = planning.plan(rows, calls, device, args.inputs, args.seed, say)
    whatif.swap_backends(plan, rows, overrides, device)
    if replace:
        whatif.stand_ins(plan, replace, whatif.load_modules(args.profile), device, args.seed)
    wrong = whatif.check_swapped(plan, rows, say) if plan.what_if else []
    if wrong:
        for line in wrong:
            print(f"opperf sequence: what-if check failed: {line}", file=sys.stderr)
        return 1
    outcome = sequence.run(plan, device, args.repeats, plan.what_if, say)
    written = summary.write(args.profile, outcome, rows)
    table = summary.phases(outcome, calls)
    if args.json:
        by_id = {r["id"]: r for r in rows}
        left = [{"signature": s, "op_type": by_id[s]["op_type"], "input_shapes": by_id[s]["input_shapes"],
                 "share": by_id[s]["share"], "why": why} for s, why in plan.left_out.items() if s in by_id]
        print(json.dumps({"device": str(device), "repeats": args.repeats, "backends": overrides,
                          "replaced": {k: {"op": v[0], "backend": v[1], "module_calls": v[2]}
                                       for k, v in plan.replaced.items()},
                          "calls": len(plan.calls), "signatures": written,
                          "phases": [vars(t) for t in table],
                          "links": {"fed": outcome.links[0], "unfit": outcome.links[1]},
                          "left_out": sorted(left, key=lambda e: -(e["share"] or 0))}, indent=1))
        return 0
    print(summary.summary(args.profile, rows, plan, outcome, table, plan.what_if, written))
    return 0


@command("lookup", help="how long an op takes: measured, interpolated or roofline",
         description="Answer from a results database: the measured row, else a log-log interpolation between "
                     "measured neighbours, else the roofline bound.",
         args=[arg("op"),
               arg("params", nargs="*", metavar="PARAM=VALUE"),
               arg("--db", type=Path, required=True, help="a results database (results/<device>.db)"),
               arg("--dtype", default="bf16", help="default bf16"),
               arg("--backend", help="only this backend's rows (default: the fastest backend)"),
               arg("--device", help="hardware spec for the roofline (default: the database's device)"),
               HARDWARE],
         **BAD_INPUT)
def _lookup(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline.replay import lookup

    params = lookup.parse_params(args.op, args.params)
    answer = lookup.lookup(args.db, args.op, params, args.dtype, args.backend, args.device, args.hardware)
    shown = ", ".join(f"{k}={v}" for k, v in answer.params.items())
    print(f"{answer.op}({shown}) {answer.dtype} on {answer.device}: {answer.time_us:.4g} us [{answer.kind}] "
          f"{answer.detail}")
    return 0


@command("predict", help="a model's prefill and decode step time at configurations, traced from its own code",
         description="Build MODEL on the meta device (a transformers config.json, a directory holding one, a built-in "
                     "model, or module:callable), record its calls of one prefill step and DECODE decode steps at each "
                     "configuration (no weights, no GPU), write them as a profile database, and price them: replayed "
                     "in sequence on this machine's GPU (--measure), from a results database's rows (--db), and with "
                     "a sequence-replayed profile's context factors (--from). --idealised: the hand-written step of "
                     "a built-in model instead (the former predict).",
         args=[arg("model", metavar="MODEL", help="config.json, a directory with one, a built-in model name, or "
                                                 "package.module:callable"),
               arg("--batch", default="1", help="sequences, comma-separated (default 1)"),
               arg("--prefill", default="1024", help="prompt tokens a sequence, comma-separated (default 1024)"),
               arg("--decode", type=int, default=8, help="decode steps traced (default 8)"),
               arg("--tp", default="1", help="tensor-parallel ranks, comma-separated (default 1)"),
               arg("--dtype", help="the model's dtype (default: the config's dtype/torch_dtype)"),
               arg("--layers", type=int, metavar="N", help="trace the first N decoder layers only (default: the whole "
                                                           "model, each distinct layer traced once and counted per "
                                                           "layer)"),
               arg("--logits", default="last", help="the prefill's LM head: last (the last position, as generate() "
                                                    "runs it; default) or all (every prompt position: scoring)"),
               arg("--routing", default="random", help="the experts' rows a grouped GEMM: random (each token picks "
                                                       "its top-k experts uniformly at random, seeded; default) or "
                                                       "even (spread evenly); --from takes a profile's shares"),
               arg("--output-tokens", type=int, metavar="D", help="the output tokens a request: the time for D "
                                                                  "tokens and tokens/s (default: --decode + 1)"),
               arg("--slo", metavar="ttft=MS,tpot=MS", help="mark the configurations whose TTFT and TPOT meet it"),
               arg("--attention", default="auto", help="the kernel of each scaled_dot_product_attention: auto "
                                                       "(torch's choice on this GPU, else the flash rule), flash, "
                                                       "efficient, cudnn or math"),
               arg("--db", type=Path, help="a results database (results/<device>.db) to price each call from"),
               arg("--device", help="the hardware spec predicted for: roofline answers and the L2 of each call's "
                                    "cache state (default: the database's device; with --measure, this GPU's)"),
               arg("--measure", action="store_true",
                   help="replay the traced calls in sequence on this machine's GPU (as opperf sequence)"),
               arg("--measure-device", default="cuda", help="the torch device --measure replays on (default cuda)"),
               arg("--repeats", type=int, default=3, help="--measure: repetitions of the sequence (default 3)"),
               arg("--jobs", type=int, metavar="N", help="without --measure: configurations traced and priced in N "
                                                         "processes side by side (default: this machine's CPUs)"),
               arg("--from", dest="from_profile", type=Path, metavar="PROFILE_DB",
                   help="a profile database of the same model: its experts' shares of the rows, and (with --db, "
                        "after opperf backfill and opperf sequence on it) its context factors"),
               arg("-o", "--output", type=Path, default=Path("predict"), metavar="DIR",
                   help="where each configuration's trace and profile database go (default predict/)"),
               arg("--idealised", action="store_true",
                   help="the hand-written idealised step of a built-in model, priced from --db (the former predict)"),
               arg("--models-dir", type=Path, metavar="DIR", help="more model YAML files, as opperf shapes takes"),
               arg("--backend", help="--idealised: only this backend's rows (default: the fastest backend)"),
               arg("--measure-dir", type=Path, default=Path("predict-cases"), metavar="DIR",
                   help="--idealised --measure: where its configs go (default predict-cases/)"),
               arg("--benches", type=Path, default=Path("benches"), metavar="DIR",
                   help="--idealised --measure: the bench tests it runs (default benches/)"),
               arg("--pytest-args", default="", metavar="ARGS",
                   help="--idealised --measure: more options for its pytest, one string"),
               arg("--top", type=int, default=5, help="the costliest calls shown a phase (default 5)"),
               arg("--json", action="store_true", help="the whole answer as JSON on stdout"),
               HARDWARE],
         **BAD_INPUT)
def _predict(args: argparse.Namespace) -> int:
    import json

    from pytest_opperf.pipeline.predict import answer

    if args.idealised:
        return _idealised(args)
    if args.decode < 0:
        raise ProfileError(f"--decode={args.decode}: expected 0 or more")
    if args.layers is not None and args.layers <= 0:
        raise ProfileError(f"--layers={args.layers}: expected a positive int")
    ask = answer.Ask(args.model, args.decode, args.dtype, args.layers, args.attention, args.measure,
                     args.measure_device, args.db, args.device, args.hardware, args.from_profile, args.output,
                     args.repeats, args.models_dir, args.routing, args.logits, args.output_tokens,
                     answer.parse_slo(args.slo))
    batches, prefills, tps = _ints(args.batch, "--batch"), _ints(args.prefill, "--prefill"), _ints(args.tp, "--tp")
    result = answer.predict(ask, batches, prefills, tps, say=lambda text: print(text, file=sys.stderr, flush=True),
                            jobs=args.jobs)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(answer.text(result, args.top))
    return 0


def _idealised(args: argparse.Namespace) -> int:
    """The former predict: the hand-written idealised step of a built-in model, priced from --db."""
    import json

    from pytest_opperf.pipeline.predict import idealised

    args.dtype = args.dtype or "bf16"
    for option in ("batch", "prefill", "tp"):
        try:
            setattr(args, option, int(getattr(args, option)))
        except ValueError:
            raise ProfileError(f"--{option}={getattr(args, option)}: expected a positive int (--idealised takes "
                               f"one value)") from None
    for option in ("batch", "prefill", "decode", "tp"):
        if getattr(args, option) <= 0:
            raise ProfileError(f"--{option}={getattr(args, option)}: expected a positive int")
    model = idealised.load_model(args.model, args.models_dir)
    calls = {phase: idealised.step_calls(model, args.tp, args.batch, args.prefill, args.decode, phase, args.dtype)
             for phase in ("prefill", "decode")}
    if args.measure:
        device = idealised.measuring_device(args.device, args.hardware)
        db = args.db or Path("results") / f"{device}.db"
        idealised.check_device(db, device, measure=True)
    elif args.db is None:
        raise ProfileError("--db: a results database (results/<device>.db) to price from, or --measure to make "
                           "this machine's")
    else:
        db = args.db
        device = idealised.check_device(db, args.device) or args.device
    out = {"model": model.name, "source": model.source, "batch": args.batch, "prefill": args.prefill,
           "decode": args.decode, "tp": args.tp, "dtype": args.dtype, "db": str(db), "device": device,
           "phases": {}}
    if args.measure:
        missing = idealised.unmeasured([c for phase in calls.values() for c in phase], db, device, args.hardware,
                                     args.backend)
        header = (f"written by opperf predict {args.model} --batch {args.batch} --prefill {args.prefill} --decode "
                  f"{args.decode} --tp {args.tp} --measure")
        code, command = idealised.measure(missing, db, device, args.measure_dir, args.benches, args.pytest_args,
                                        header)
        out["measured"] = {"cases": len(missing), "command": command, "exit": code}
        if code not in (0, 5):  # 5: pytest ran nothing (every case skipped or deselected)
            raise ProfileError(f"--measure: pytest exited {code} on {len(missing)} cases in {args.measure_dir}: "
                               f"its output above says which; nothing was predicted")
    for phase, phase_calls in calls.items():
        out["phases"][phase] = idealised.summary(idealised.price(phase_calls, db, device, args.hardware,
                                                             args.backend))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"opperf predict {model.name}: batch {args.batch}, prefill {args.prefill}, decode {args.decode}, "
          f"tp {args.tp}, {args.dtype}, on {device} ({db})")
    for phase, result in out["phases"].items():
        shares = ", ".join(f"{kind} {100 * share:.1f}%" for kind, share in result["share"].items())
        print(f"{phase} step: {result['step_us'] / 1e3:.4g} ms ({shares}), {len(result['calls'])} kinds of call")
        for call in result["calls"][:max(args.top, 0)]:
            shown = " ".join(f"{k}={v}" for k, v in call["params"].items())
            print(f"  {call['total_us'] / 1e3:8.4g} ms  {call['op']} {shown} x{call['count']} ({call['what']}): "
                  f"{call['time_us']:.4g} us [{call['kind']}]")
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
