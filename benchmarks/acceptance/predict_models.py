"""opperf predict against the model run: transformers families at published widths, three configurations.

For each family (a checkpoint's config.json fields, written to $OUT/<family>/config.json, layers cut
to --layers) and each configuration (batch x prompt, --configs), on this GPU, bf16, random weights:

- **profiled**: the model built on the GPU from the same config (transformers' AutoModelForCausalLM,
  grouped_mm experts), a warm-up generation, then torch.profiler around a prefill and DECODE greedy
  decode steps, each in its record_function range; each step's time is its device kernels' time
  (kernels, copies and fills whose launch fell in the range); the prefill step, and the median of
  the decode steps;
- **predicted**: ``opperf predict``'s path in this process: the model traced on meta, imported, and
  priced ``--measure`` (the traced calls in sequence on this GPU); with ``--ways measure,rows`` also
  the trace's replay sweeps run into a results database (pytest, as import prints them) and the
  calls priced from its rows.

Prints a row per (family, configuration, phase): profiled us, predicted us per way, ratio; then the
share of rows within 10% and the median |error| per way. Everything goes to $OUT/predict_summary.json.

    python benchmarks/acceptance/predict_models.py                                   # every family
    python benchmarks/acceptance/predict_models.py --family mistral_7b --configs 1x128 --ways measure,rows
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import MOE, PUBLISHED  # noqa: E402  (the published widths, each with its checkpoint)

# The families of the table: dense ones of three shapes (GQA Llama-like, q/k/v biases, LayerNorm with a
# GELU MLP, partial rotary with 2 KV heads) and three with experts (8 top 2, 128 top 8, 64 top 8).
FAMILIES = ("mistral_7b", "qwen2_7b", "starcoder2_7b", "glm4_9b", "mixtral_8x7b", "qwen3_30b_a3b", "olmoe_1b_7b")
LAYERS = {"num_hidden_layers": 32}  # the checkpoint's depth in config.json; --layers cuts both sides alike


def config_json(name: str, out: Path) -> Path:
    """The family's config.json as a checkpoint ships it (model_type, widths, dtype)."""
    import transformers

    config_name, _, fields = PUBLISHED[name]
    config = getattr(transformers, config_name)(**{**LAYERS, **fields})
    raw = config.to_dict()
    raw["dtype"] = "bfloat16"
    path = out / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=1, default=str))
    return path


def profiled(config: Path, layers: int, batch: int, prefill: int, decode: int, out: Path) -> dict:
    """Kernel time of the prefill step and of each decode step of the model run on this GPU."""
    from pytest_opperf.pipeline.predict import model as models
    from pytest_opperf.pipeline.predict.trace import steps

    torch.manual_seed(0)
    built = models.build(str(config), layers=layers, device="cuda")  # as the trace builds it, weights random
    model = built.module
    ids = torch.randint(0, built.vocab, (batch, prefill), device="cuda")

    def generate():
        with torch.no_grad():
            steps(model, {"input_ids": ids}, decode)
        torch.cuda.synchronize()

    generate()  # warm-up: handles, allocator, lazy set-up stay out of the profile
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        generate()
    path = out / "profile_trace.json"
    prof.export_chrome_trace(str(path))
    times, kernels = step_times(path)
    path.unlink()
    return {"prefill_us": times.get("prefill", [None])[0], "decode_steps_us": times.get("decode", []),
            "decode_us": statistics.median(times["decode"]) if times.get("decode") else None,
            "kernels": {ph: sorted(((round(us / len(times.get(ph) or [1]), 1), k) for k, us in by.items()),
                                   reverse=True)[:12] for ph, by in kernels.items()}}


def step_times(path: Path) -> tuple[dict, dict]:
    """range name -> each range's device time (us): kernels, copies and fills by their launch's time;
    and range name -> kernel name -> its time over those ranges (us)."""
    import bisect

    events = json.loads(path.read_text())["traceEvents"]
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                    if e.get("cat") == "user_annotation" and e.get("ph") == "X")
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    starts = [r[0] for r in ranges]
    totals = [0.0] * len(ranges)
    kernels: dict = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        ts = launches.get(e.get("args", {}).get("correlation"))
        k = bisect.bisect_right(starts, ts) - 1 if ts is not None else -1
        if k >= 0 and ts <= ranges[k][1]:
            totals[k] += float(e.get("dur", 0))
            by = kernels.setdefault(ranges[k][2], {})
            by[e["name"][:90]] = by.get(e["name"][:90], 0.0) + float(e.get("dur", 0))
    out: dict = {}
    for (_, _, name), us in zip(ranges, totals):
        out.setdefault(name, []).append(us)
    return out, kernels


def sweep(row: dict, results: Path, budget: str, log: Path) -> int:
    """The trace's replay sweeps into RESULTS (pytest, as opperf import prints them); failed cases."""
    failed = 0
    with open(log, "a") as fh:
        for s in row["replay_sweeps"]:
            cmd = shlex.split(s["command"])[1:] + [f"--opperf-results={results}", f"--opperf-budget={budget}",
                                                  "--opperf-target=2%", "--opperf-summary=0", "-q",
                                                  "-p", "no:cacheprovider"]
            done = subprocess.run([sys.executable, "-m", "pytest", *cmd], cwd=ROOT, capture_output=True, text=True)
            fh.write(f"$ {s['command']}\n{done.stdout[-3000:]}{done.stderr[-2000:]}\n")
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            if " failed" in last:
                failed += int(last.split(" failed")[0].split()[-1])
    return failed


def family(name: str, top: Path, args) -> dict:
    from pytest_opperf.pipeline.predict import answer, price

    out = top / name
    config = config_json(name, top)
    entry = {"config": str(config), "experts": name in MOE, "configurations": []}
    for batch, prefill in args.configs:
        t0 = time.monotonic()
        try:
            truth = profiled(config, args.layers, batch, prefill, args.decode, out)
            torch.cuda.empty_cache()  # the model run is gone: its memory back before the replay
        except Exception as exc:  # noqa: BLE001  (a configuration that cannot run does not stop the others)
            entry["configurations"].append({"batch": batch, "prefill": prefill, "error": f"profile: {exc}"[:500]})
            torch.cuda.empty_cache()
            continue
        t1 = time.monotonic()
        ask = answer.Ask(str(config), args.decode, layers=args.layers, measure="measure" in args.ways,
                         output=out / "predict", repeats=args.repeats)
        try:
            got = answer.predict(ask, [batch], [prefill], [1])["configurations"][0]
        except Exception as exc:  # noqa: BLE001
            entry["configurations"].append({"batch": batch, "prefill": prefill, "profiled": truth,
                                            "error": f"predict: {type(exc).__name__}: {exc}"[:500]})
            torch.cuda.empty_cache()
            continue
        torch.cuda.empty_cache()
        row = {"batch": batch, "prefill": prefill, "profiled": truth, "assumptions": got["assumptions"],
               "seconds": {"profile": round(t1 - t0, 1), "predict": round(time.monotonic() - t1, 1)}, "ways": {}}
        if "measure" in args.ways:
            row["ways"]["measure"] = _phases(got["priced"]["sequence"]["phases"])
        if "rows" in args.ways:
            t2 = time.monotonic()
            results = out / f"results-b{batch}-p{prefill}"
            row["failed_cases"] = sweep(got, results, args.budget, out / "sweep.log")
            dbs = sorted(results.glob("*.db"))
            if dbs:
                phases, how = price.rows(Path(got["profile"]), dbs[0])
                row["ways"]["rows"] = _phases([p.as_dict() for p in phases])
                row["rows_how"] = how
            row["seconds"]["rows"] = round(time.monotonic() - t2, 1)
        entry["configurations"].append(row)
        print(_line(name, row), flush=True)
    return entry


def _phases(phases: list) -> dict:
    return {p["phase"]: {"us": p["step_us"], "unpriced": p["share"].get("unpriced", 0.0),
                         "top": [[round(c["step_share_us"], 1), c["op_type"], c["shapes"][:80], c["calls_per_step"],
                                  (c.get("kernels") or "")[:160]] for c in p["top"]]}
            for p in phases if p["phase"] in ("prefill", "decode")}


def _line(name: str, row: dict) -> str:
    cells = []
    for phase in ("prefill", "decode"):
        truth = row["profiled"][f"{phase}_us"]
        for way, got in row["ways"].items():
            us = got.get(phase, {}).get("us")
            if truth and us:
                cells.append(f"{phase} {way} {us:.0f}/{truth:.0f}={us / truth:.3f}")
    return f"{name:14s} b{row['batch']:<3d} p{row['prefill']:<5d} " + "  ".join(cells)


def verdict(summary: dict) -> dict:
    out = {}
    errors: dict = {}
    for entry in summary["families"].values():
        for row in entry.get("configurations", []):
            for way, got in row.get("ways", {}).items():
                for phase in ("prefill", "decode"):
                    truth, us = row["profiled"].get(f"{phase}_us"), got.get(phase, {}).get("us")
                    if truth and us:
                        errors.setdefault(way, []).append(us / truth - 1)
    for way, e in errors.items():
        out[way] = {"rows": len(e), "within_10pct": sum(abs(x) <= 0.10 for x in e) / len(e),
                    "median_abs_error": statistics.median(abs(x) for x in e)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", action="append", choices=sorted(PUBLISHED), help="repeatable (default: FAMILIES)")
    ap.add_argument("--configs", default="1x1024,8x512,32x2048",
                    type=lambda t: [tuple(int(x) for x in c.split("x")) for c in t.split(",")],
                    help="BATCHxPROMPT, comma-separated (default 1x1024,8x512,32x2048)")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="repetitions of the sequence replay")
    ap.add_argument("--ways", default="measure", type=lambda t: t.split(","), help="measure, rows (comma-separated)")
    ap.add_argument("--budget", default="0.02", help="--opperf-budget of the rows' replay sweeps (s a case)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    top = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="predict-models-"))
    top.mkdir(parents=True, exist_ok=True)
    import transformers

    summary = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "transformers": transformers.__version__, "layers": args.layers, "decode": args.decode,
               "configs": args.configs, "ways": args.ways,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "families": {}}
    path = top / "predict_summary.json"
    for name in args.family or FAMILIES:
        summary["families"][name] = family(name, top, args)
        summary["verdict"] = verdict(summary)
        path.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary.get("verdict", {}), indent=1))
    with gzip.open(top / "predict_summary.json.gz", "wt") as fh:
        json.dump(summary, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
