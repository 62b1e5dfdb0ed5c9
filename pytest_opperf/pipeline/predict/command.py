"""``opperf grid``: the replay cases a model needs over a range of configurations, swept once into a
results database (predict/grid.py), so that ``opperf predict --db`` prices the configurations in between."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_opperf.commands import HARDWARE, arg, command
from pytest_opperf.pipeline.reading.signature import ProfileError

# Bad input and an output that cannot be written: one line on stderr, exit 2 (as pipeline/commands.py's).
BAD_INPUT = {"errors": (ProfileError, OSError),
             "message": lambda exc: f"{exc.filename or ''}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)}


@command("grid", help="sweep the calls a model runs over a range of configurations into a results database",
         description="Build MODEL on meta at its own depth, trace it at each batch x prompt of the grid (one decode "
                     "step after each prompt), gather the calls of every trace once, keep those the spacing along "
                     "each kernel family and the HBM budget allow, write them as replay configs and run them "
                     "through pytest into --db (results/<device>.db). opperf predict MODEL --db then prices any "
                     "configuration of the range from those rows: measured, interpolated along its kernel family, "
                     "or extrapolated, each said.",
         args=[arg("model", metavar="MODEL", help="config.json, a directory with one, a built-in model name, or "
                                                 "package.module:callable"),
               arg("--device", required=True, help="the hardware spec measured on (its rows go to --db)"),
               arg("--db", type=Path, help="the results database the sweep writes (default results/<device>.db)"),
               arg("--batches", default="1:64:7", help="LO:HI:N (N sizes, geometric) or A,B,..; default 1:64:7"),
               arg("--prompts", default="16:8192:10", help="prompt lengths, as --batches; default 16:8192:10 (each "
                                                          "decode step's KV length is its prompt's + 1)"),
               arg("--max-tokens", type=int, default=65536, help="batch x prompt at most (default 65536)"),
               arg("--spacing", type=float, default=1.5, help="within a kernel family, the least factor between "
                                                              "two sizes kept along its axis (default 1.5)"),
               arg("--max-hbm-gb", type=float, default=0.0, help="leave out cases whose memory estimate exceeds "
                                                                  "this many GB (default: none left out)"),
               arg("--dtype", help="the model's dtype (default: the config's)"),
               arg("--layers", type=int, metavar="N", help="the first N decoder layers (default: the whole model, "
                                                           "each distinct layer once)"),
               arg("--attention", default="auto", help="as opperf predict's"),
               arg("--routing", default="random", help="as opperf predict's"),
               arg("-o", "--output", type=Path, default=Path("grid"), metavar="DIR",
                   help="where the traces and replay configs go (default grid/)"),
               arg("--plan-only", action="store_true", help="write the replay configs and print the sweep's "
                                                             "commands; run nothing"),
               arg("--benches", type=Path, default=Path("benches"), metavar="DIR",
                   help="the bench tests the sweep runs (default benches/)"),
               arg("--pytest-args", default="", metavar="ARGS", help="more options for the sweep's pytest, one string"),
               arg("--json", action="store_true", help="the plan as JSON on stdout"),
               HARDWARE],
         **BAD_INPUT)
def _grid(args: argparse.Namespace) -> int:
    from pytest_opperf.pipeline.predict import answer, grid

    if args.layers is not None and args.layers <= 0:
        raise ProfileError(f"--layers={args.layers}: expected a positive int")
    if args.max_tokens <= 0:
        raise ProfileError(f"--max-tokens={args.max_tokens}: expected a positive int")
    batches, prompts = grid.sizes(args.batches, "--batches"), grid.sizes(args.prompts, "--prompts")
    db = args.db or Path("results") / f"{args.device}.db"
    ask = answer.Ask(args.model, 1, args.dtype, args.layers, args.attention, device=args.device,
                     hardware=args.hardware, output=args.output, routing=args.routing)
    if args.dtype:
        from pytest_opperf.pipeline.predict.model import checked_dtype

        checked_dtype(args.dtype)
    if args.spacing < 1:
        raise ProfileError(f"--spacing={args.spacing}: expected a factor of 1 or more")
    if not args.plan_only:
        grid.check_sweep(db, args.device, args.benches)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    planned = grid.plan(ask, batches, prompts, args.max_tokens, args.spacing, args.max_hbm_gb, say)
    say(f"opperf grid {planned.model}: {planned.said()}")
    runs = grid.sweep(planned, db, args.device, args.benches, args.pytest_args, run=not args.plan_only)
    failed = [code for _, code in runs if code not in (None, 0)]
    if args.json:
        print(json.dumps({"model": planned.model, "configurations": planned.configurations,
                          "cases": len(planned.cases), "gathered": planned.gathered,
                          "over_budget": planned.over_budget, "sweeps": planned.sweeps,
                          "exit_codes": [code for _, code in runs]}, indent=1))
    else:
        for s in planned.sweeps:
            print(("to run: " if args.plan_only else "ran: ") + s["command"])
        if not args.plan_only:
            print(f"opperf grid: {len(planned.cases)} cases into {db}" + (f"; {len(failed)} sweep(s) failed: pytest's "
                                                                          f"output above says which" if failed else ""))
    return 1 if failed else 0
