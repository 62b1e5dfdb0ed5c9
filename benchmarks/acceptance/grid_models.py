"""opperf predict from a results database alone: a grid swept once, configurations off the grid predicted.

Four steps, each its own call (the first and the last need no GPU):

    python benchmarks/acceptance/grid_models.py plan       # configs + opperf grid --plan-only -> gridplans/
    python benchmarks/acceptance/grid_models.py sweep      # GPU: each plan's sweep into $OUT/results/<device>.db
    python benchmarks/acceptance/grid_models.py profile    # GPU: CONFIGS run as generate() runs them -> $OUT/grid_truth.json
    python benchmarks/acceptance/grid_models.py predict --db results/h200.db --truth grid_truth.json

The grid: batches 1:64:6 (1, 2, 5, 12, 28, 64) x prompts 16:8192:8 (16 .. 8192; each decode step's KV
length the prompt's + 1), at most 65536 tokens: none of CONFIGS' batches (4, 8, 16) or prompts (512,
1024, 4096) is on it. ``predict`` prices CONFIGS from the rows alone (opperf predict --db, each
configuration its own command, timed from its start), compares each phase with the profile, prints
the share of each kind of price and the interpolation's held-out error, and times a table of 30
configurations of one family in one command. Bf16, random weights, each model at its own depth
(LAYERS where it does not fit one GPU, both sides alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import MOE  # noqa: E402
from predict_models import config_json  # noqa: E402

# name -> its own depth; three with experts, three no earlier test or table named (afm, olmo3, glm4.5-air)
FAMILIES = {"llama3_8b": 32, "qwen3_30b_a3b": 48, "olmoe_1b_7b": 16, "afm_4_5b": 36, "olmo3_7b": 32,
            "glm4_5_air": 46}
LAYERS = {"glm4_5_air": 4}  # 106B parameters: 1 dense and 3 MoE layers on both sides
CONFIGS = ((8, 512), (4, 4096), (16, 1024))
DECODE = 8
GRID = ["--batches", "1:64:6", "--prompts", "16:8192:8", "--max-tokens", "65536", "--spacing", "2"]
TABLE = ("1,2,4,8,16,32", "128,512,1024,2048,4096")  # 30 configurations


def plan(args) -> int:
    """Every family's grid planned, side by side (a trace is one CPU's work)."""
    running = {}
    for name, layers in FAMILIES.items():
        config = config_json(name, Path(args.plans), layers)
        depth = ["--layers", str(LAYERS[name])] if name in LAYERS else []
        running[name] = subprocess.Popen([sys.executable, "-m", "pytest_opperf.cli", "grid", str(config), "--device",
                                          args.device, *GRID, *depth, "-o", args.plans, "--plan-only", "--json"],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failed = 0
    for name, proc in running.items():
        out, err = proc.communicate()
        failed += proc.returncode != 0
        print(name, (err.strip().splitlines() or [""])[-1] if proc.returncode == 0 else err[-800:])
    return 1 if failed else 0


def sweep(args) -> int:
    """Each family's cases, attention first, within --budget seconds a family (pytest stopped there;
    the rows it stored by then kept: --opperf-flush-interval 10)."""
    from pytest_opperf.pipeline.predict import grid

    out = Path(os.environ.get("OUT") or ".") / "results"
    out.mkdir(parents=True, exist_ok=True)
    first = ("attention_prefill", "attention_decode", "linear", "embedding", "softmax", "add")
    timing = {}
    for path in sorted(Path(args.plans).glob("*/grid.json")):
        planned = json.loads(path.read_text())
        files = sorted((f for s in planned["sweeps"] for f in s["files"] if Path(f).stem in args.ops.split(",")),
                       key=lambda f: first.index(Path(f).stem) if Path(f).stem in first else len(first))
        files = [files] if args.together else [[f] for f in files]  # one pytest session: one start-up
        t0, codes = time.monotonic(), []
        for f in files:
            left = args.budget - (time.monotonic() - t0)
            if left <= 5:
                codes.append("not run")
                continue
            one = grid.Planned(planned["model"], planned["configurations"], sweeps=[{"cache": "cold", "files": f}])
            command = grid.sweep(one, out / f"{args.device}.db", args.device, ROOT / "benches",
                                 args.pytest_args + " --opperf-flush-interval 10", run=False)[0][0]
            try:
                codes.append(subprocess.run(command, timeout=left, stdout=subprocess.DEVNULL).returncode)
            except subprocess.TimeoutExpired:
                codes.append("stopped at the budget")
        timing[path.parent.name] = {"seconds": round(time.monotonic() - t0, 1), "cases": planned["cases"],
                                    "files": [[Path(x).stem for x in f] for f in files], "exit_codes": codes}
        print(path.parent.name, timing[path.parent.name], flush=True)
    (out.parent / "grid_sweep.json").write_text(json.dumps(timing, indent=1))
    print("all families:", round(sum(t["seconds"] for t in timing.values()), 1), "s")
    return 0


def profile(args) -> int:
    import torch

    from predict_models import profiled

    top = Path(os.environ.get("OUT") or ".")
    truth = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "commit": os.environ.get("OPPERF_COMMIT", ""), "families": {}}
    for name, layers in FAMILIES.items():
        config = config_json(name, top / "configs", layers)
        for batch, prompt in CONFIGS:
            key = f"{batch}x{prompt}"
            try:
                got = profiled(config, LAYERS.get(name), batch, prompt, DECODE, top / "profiles")
                row = {k: got[k] for k in ("prefill_us", "decode_us", "decode_steps_us", "experts_touched")}
            except Exception as exc:  # noqa: BLE001  (one that cannot run does not stop the others)
                row = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
            truth["families"].setdefault(name, {})[key] = row
            torch.cuda.empty_cache()
            print(name, key, row, flush=True)
            (top / "grid_truth.json").write_text(json.dumps(truth, indent=1))
    return 0


def _predict(config: Path, name: str, batches: str, prompts: str, db: Path, out: Path) -> tuple:
    depth = ["--layers", str(LAYERS[name])] if name in LAYERS else []
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest_opperf.cli", "predict", str(config), "--db", str(db),
                           "--batch", batches, "--prefill", prompts, "--decode", str(DECODE), *depth, "--json",
                           "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - t0
    if done.returncode:
        raise SystemExit(f"{name}: {done.stderr[-800:]}")
    return json.loads(done.stdout), seconds


def predict(args) -> int:
    truth = json.loads(Path(args.truth).read_text())
    top = Path(args.out)
    rows, errors, shares = [], [], {}
    for name, layers in FAMILIES.items():
        config = config_json(name, top / "configs", layers)
        for batch, prompt in CONFIGS:
            answer, seconds = _predict(config, name, str(batch), str(prompt), Path(args.db), top / "predict")
            priced = answer["configurations"][0]["priced"]["rows"]
            want = truth["families"].get(name, {}).get(f"{batch}x{prompt}", {})
            for p in priced["phases"]:
                if p["phase"] not in ("prefill", "decode") or not want.get(f"{p['phase']}_us"):
                    continue
                ratio = p["step_us"] / want[f"{p['phase']}_us"]
                errors.append(ratio - 1)
                for kind, share in p["share"].items():
                    shares.setdefault(kind, []).append(share)
                rows.append({"family": name, "experts": name in MOE, "config": f"{batch}x{prompt}", "phase": p["phase"],
                             "predicted_us": round(p["step_us"], 1), "profiled_us": round(want[f"{p['phase']}_us"], 1),
                             "ratio": round(ratio, 3), "share": {k: round(v, 3) for k, v in p["share"].items() if v},
                             "held_out": priced.get("held_out"), "seconds": round(seconds, 1)})
                print(f"{name:14s} {batch:>3d}x{prompt:<5d} {p['phase']:8s} {ratio:.3f}  {round(seconds, 1)} s  "
                      + ", ".join(f"{k} {100 * v:.0f}%" for k, v in p["share"].items() if v), flush=True)
    _, table_seconds = _predict(config_json("qwen3_30b_a3b", top / "configs", 48), "qwen3_30b_a3b", *TABLE,
                                Path(args.db), top / "table")
    held = [r["held_out"] for r in rows if r["held_out"] and r["held_out"].get("sizes")]
    verdict = {"rows": len(errors), "within_10pct": sum(abs(e) <= 0.10 for e in errors) / max(len(errors), 1),
               "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
               "share_mean": {k: round(sum(v) / len(rows), 3) for k, v in shares.items()},
               "held_out_median_abs": statistics.median(h["median_abs"] for h in held) if held else None,
               "held_out_p90_abs": statistics.median(h["p90_abs"] for h in held) if held else None,
               "seconds_one_configuration_max": max(r["seconds"] for r in rows) if rows else None,
               "seconds_30_configurations": round(table_seconds, 1)}
    verdict["pass"] = bool(errors and verdict["within_10pct"] >= 0.85 and verdict["median_abs_error"] <= 0.05
                           and verdict["seconds_one_configuration_max"] <= 10 and table_seconds <= 60)
    (top / "grid_predict.json").write_text(json.dumps({"truth": {k: truth[k] for k in ("device", "date", "commit")},
                                                       "rows": rows, "verdict": verdict}, indent=1))
    print(json.dumps(verdict, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=("plan", "sweep", "profile", "predict"))
    ap.add_argument("--plans", default="gridplans", help="where plan writes and sweep reads the grids")
    ap.add_argument("--device", default="h200")
    ap.add_argument("--pytest-args", default="", help="sweep: more options for its pytest")
    ap.add_argument("--budget", type=float, default=85.0, help="sweep: seconds a family at most")
    ap.add_argument("--ops", default="attention_prefill,attention_decode,linear,embedding,softmax,add,aten",
                    help="sweep: the ops' files to run")
    ap.add_argument("--together", action="store_true", help="sweep: a family's files in one pytest session")
    ap.add_argument("--db", default="results/h200.db", help="predict: the results database the sweep wrote")
    ap.add_argument("--truth", default="grid_truth.json", help="predict: the profile's step times")
    ap.add_argument("--out", default="grid-predict", help="predict: where its traces go")
    args = ap.parse_args()
    return {"plan": plan, "sweep": sweep, "profile": profile, "predict": predict}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
