"""opperf predict against the model run as generate() runs it: families at published widths (families.py).

Per family and configuration (batch x prompt, --configs), bf16, random weights, on this GPU:
**profiled**: the model built on the GPU, a warm-up generation (which also counts the experts each
routing touched), then torch.profiler around a prefill with ``logits_to_keep=1`` and DECODE greedy
decode steps, each in its record_function range; a step's time is its kernels', copies' and fills'
device time by launch: the prefill (TTFT) and the median decode step (TPOT). **predicted**: ``opperf
predict``'s path in this process, ``--measure``, at ``--layers`` (both sides cut alike), its default
routing and prefill. Printed: per (family, configuration, phase) the ratio; per row off by over 5% the
kernels that moved most (profile -> sequence); per family whether the configurations rank alike by
tokens/s per GPU (D = decode + 1). ``--full``: FULL's models at their own depth through the CLI, timed
from the command's start, against the whole model profiled. All of it: $OUT/predict_summary.json.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
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

# Nine families: dense GQA (Llama-3), two LayerNorm/GELU-or-ReLU^2 ones (Pythia, Minitron), and five
# with experts (8 top 2, 128 top 8, 64 top 8, 64 top 6 with MLA, 40 top 8); four no table named before.
FAMILIES = ("llama3_8b", "pythia_6_9b", "minitron_8b", "starcoder2_7b", "mixtral_8x7b", "qwen3_30b_a3b",
            "olmoe_1b_7b", "deepseek_v2_lite", "granitemoe_3b")
FULL = {"llama3_8b": 32, "qwen3_30b_a3b": 48}   # each model's own depth, as its config.json ships it
FULL_CONFIGS = ((1, 1024), (8, 512))


def config_json(name: str, out: Path, layers: int = 32) -> Path:
    """The family's config.json as a checkpoint ships it (model_type, widths, dtype), LAYERS deep."""
    import transformers

    config_name, _, fields = PUBLISHED[name]
    raw = getattr(transformers, config_name)(**{"num_hidden_layers": layers, **fields}).to_dict()
    raw["dtype"] = "bfloat16"
    path = out / f"{name}-{layers}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=1, default=str))
    return path


def profiled(config: Path, layers, batch: int, prefill: int, decode: int, out: Path) -> dict:
    """Kernel time of the prefill step and of each decode step of the model run on this GPU as
    generate() runs it (the prefill's LM head on the last position)."""
    from pytest_opperf.pipeline.predict import model as models
    from pytest_opperf.pipeline.predict.trace import logits_kept, steps

    torch.manual_seed(0)
    built = models.build(str(config), layers=layers, device="cuda")  # as the trace builds it, weights random
    ids = torch.randint(0, built.vocab, (batch, prefill), device="cuda")
    keep = logits_kept(built.module)

    def generate():
        with torch.no_grad():
            steps(built.module, {"input_ids": ids}, decode, keep)
        torch.cuda.synchronize()

    touched = experts_touched(built.module)
    generate()  # warm-up: handles, allocator, lazy set-up stay out of the profile; the routing counted
    touched = touched()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        generate()
    path = out / "profile_trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    times, kernels = step_times(path)
    path.unlink()
    steps_of = {ph: len(times.get(ph) or [1]) for ph in kernels}
    return {"prefill_us": times.get("prefill", [None])[0], "decode_steps_us": times.get("decode", []),
            "experts_touched": touched,
            "decode_us": statistics.median(times["decode"]) if times.get("decode") else None,
            "kernels": {ph: {k: us / steps_of[ph] for k, us in by.items()} for ph, by in kernels.items()}}


def experts_touched(module):
    """Hooks that count the distinct experts each experts module's call routes to; the returned
    callable removes them and gives the mean per call for the prefill (the first forward) and decode."""
    seen, forwards = [], [0]
    hooks = [module.register_forward_pre_hook(lambda m, a: forwards.__setitem__(0, forwards[0] + 1))]
    hooks += [m.register_forward_pre_hook(lambda m, a: seen.append((forwards[0], int(a[1].unique().numel())))
                                          if len(a) > 1 and torch.is_tensor(a[1]) else None)
              for m in module.modules() if type(m).__name__.endswith("Experts")]

    def done() -> dict:
        [h.remove() for h in hooks]
        phases = {"prefill": [n for f, n in seen if f == 1], "decode": [n for f, n in seen if f > 1]}
        return {ph: round(sum(v) / len(v), 1) for ph, v in phases.items() if v}
    return done


def step_times(path: Path) -> tuple[dict, dict]:
    """range name -> each range's device time (us): kernels, copies and fills by their launch's time;
    and range name -> kernel name -> its time over those ranges (us)."""
    events, kernels = json.loads(path.read_text())["traceEvents"], {}
    ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                    if e.get("cat") == "user_annotation" and e.get("ph") == "X")
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    starts = [r[0] for r in ranges]
    totals = [0.0] * len(ranges)
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        ts = launches.get(e.get("args", {}).get("correlation"))
        k = bisect.bisect_right(starts, ts) - 1 if ts is not None else -1
        if k >= 0 and ts <= ranges[k][1]:
            totals[k] += float(e.get("dur", 0))
            by = kernels.setdefault(ranges[k][2], {})
            by[e["name"][:80]] = by.get(e["name"][:80], 0.0) + float(e.get("dur", 0))
    out: dict = {}
    for (_, _, name), us in zip(ranges, totals):
        out.setdefault(name, []).append(us)
    return out, kernels


def sequence_kernels(profile_db: Path) -> dict:
    """phase -> kernel name -> its time a step in the sequence replay: each call's time split evenly
    over the kernels its signature ran (sequence_kernels)."""
    import sqlite3

    with sqlite3.connect(profile_db) as db:
        rows = db.execute("SELECT c.phase, c.step, c.sequence_us, s.sequence_kernels FROM calls c "
                          "JOIN signatures s ON s.id = c.signature WHERE c.sequence_us IS NOT NULL").fetchall()
    db.close()
    out, steps = {}, {}
    for phase, step, us, names in rows:
        names = [k[:80] for k in json.loads(names or "{}")] or ["(no kernel)"]
        by = out.setdefault(phase or "", {})
        steps.setdefault(phase or "", set()).add(step)
        for k in names:
            by[k] = by.get(k, 0.0) + us / len(names)
    return {ph: {k: us / max(len(steps[ph]), 1) for k, us in by.items()} for ph, by in out.items()}


def moved(truth: dict, predicted: dict, top: int = 6) -> list:
    """The kernels whose time a step differs most between the profile and the sequence."""
    names = set(truth) | set(predicted)
    diffs = sorted(names, key=lambda k: -abs(predicted.get(k, 0.0) - truth.get(k, 0.0)))[:top]
    return [[round(truth.get(k, 0.0), 1), round(predicted.get(k, 0.0), 1), k] for k in diffs]


def predicted(config: Path, layers, batch: int, prefill: int, decode: int, out: Path, repeats: int) -> dict:
    from pytest_opperf.pipeline.predict import answer
    ask = answer.Ask(str(config), decode, layers=layers, measure=True, output=out / "predict", repeats=repeats)
    row = answer.predict(ask, [batch], [prefill], [1])["configurations"][0]
    phases = {p["phase"]: p for p in row["priced"]["sequence"]["phases"]}
    return {"prefill_us": phases.get("prefill", {}).get("step_us"), "decode_us": phases.get("decode", {}).get("step_us"),
            "how": row["priced"]["sequence"]["how"], "assumptions": row["assumptions"],
            "kernels": sequence_kernels(Path(row["profile"]))}


def family(name: str, top: Path, args) -> dict:
    config = config_json(name, top)
    rows = [configuration(name, config, args.layers, b, p, top / name, args) for b, p in args.configs]
    return {"config": str(config), "experts": name in MOE, "configurations": rows,
            "ranking": ranking(rows, args.decode)}


def configuration(name: str, config: Path, layers, batch: int, prefill: int, out: Path, args) -> dict:
    row, t0 = {"batch": batch, "prefill": prefill}, time.monotonic()
    try:
        row["predicted"] = predicted(config, layers, batch, prefill, args.decode, out, args.repeats)
    except Exception as exc:  # noqa: BLE001  (a configuration that cannot run does not stop the others)
        row["error"] = f"predict: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    torch.cuda.empty_cache()
    t1 = time.monotonic()
    try:
        row["profiled"] = profiled(config, layers, batch, prefill, args.decode, out)
    except Exception as exc:  # noqa: BLE001
        row["error"] = row.get("error", "") + f" profile: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    row["seconds"] = {"predict": round(t1 - t0, 1), "profile": round(time.monotonic() - t1, 1)}
    torch.cuda.empty_cache()
    print(_line(name, row), flush=True)
    for ph in ("prefill", "decode") if "profiled" in row and "predicted" in row else ():
        row.setdefault("moved", {})[ph] = moved(row["profiled"]["kernels"].get(ph, {}),
                                                row["predicted"]["kernels"].get(ph, {}))
        if abs((row["predicted"][f"{ph}_us"] or 0) / (row["profiled"][f"{ph}_us"] or 1) - 1) > 0.05:
            print(f"  moved in {ph}: " + "; ".join(f"{a}->{b} {k[:50]}" for a, b, k in row["moved"][ph][:4]))
    return row


def ranking(rows: list, decode: int) -> dict:
    """The configurations ranked by tokens/s per GPU (answer.serving, D = decode + 1), predicted and profiled."""
    from pytest_opperf.pipeline.predict import answer

    def rate(r, way):
        phases = [{"phase": ph, "step_us": r[way][f"{ph}_us"]} for ph in ("prefill", "decode") if r[way].get(f"{ph}_us")]
        got = answer.serving({"batch": r["batch"], "tp": 1, "priced": {"x": {"phases": phases}}}, decode + 1)
        return got.get("tokens_per_s_per_gpu")
    both = [r for r in rows if "profiled" in r and "predicted" in r]
    rates = {way: {f"{r['batch']}x{r['prefill']}": rate(r, way) for r in both} for way in ("predicted", "profiled")}
    order = {way: sorted(rates[way], key=lambda k: -(rates[way][k] or 0)) for way in rates}
    return {"tokens_per_s_per_gpu": rates, "order": order, "same": order["predicted"] == order["profiled"]}


def full_depth(name: str, layers: int, top: Path, args) -> list:
    """The model at its own depth: opperf predict through the CLI (timed from its start), then the
    whole model profiled."""
    config = config_json(name, top, layers)
    out = []
    for batch, prefill in FULL_CONFIGS:
        row, t0 = {"batch": batch, "prefill": prefill, "layers": layers}, time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest_opperf.cli", "predict", str(config), "--batch", str(batch),
                               "--prefill", str(prefill), "--decode", str(args.decode), "--measure", "--json",
                               "-o", str(top / f"{name}-{layers}" / "predict")], capture_output=True, text=True,
                              cwd=ROOT)
        row["seconds"] = round(time.monotonic() - t0, 1)
        if done.returncode != 0:
            row["error"] = done.stderr[-600:]
        else:
            got = json.loads(done.stdout)["configurations"][0]
            phases = {p["phase"]: p["step_us"] for p in got["priced"]["sequence"]["phases"]}
            row["predicted"] = {"prefill_us": phases.get("prefill"), "decode_us": phases.get("decode"),
                                "depth": got["assumptions"].get("depth"), "experts": got["assumptions"]["experts"],
                                "how": got["priced"]["sequence"]["how"]}
        torch.cuda.empty_cache()
        try:
            row["profiled"] = profiled(config, None, batch, prefill, args.decode, top / f"{name}-{layers}")
        except Exception as exc:  # noqa: BLE001
            row["error"] = row.get("error", "") + f" profile: {type(exc).__name__}: {str(exc)[:300]}"
        torch.cuda.empty_cache()
        print(_line(f"{name} x{layers}", row) + f"  ({row['seconds']} s from the command's start; experts touched "
              f"a call, profiled: {row.get('profiled', {}).get('experts_touched')})", flush=True)
        out.append(row)
    return out


def _line(name: str, row: dict) -> str:
    both = [(ph, row["predicted"][f"{ph}_us"], row["profiled"][f"{ph}_us"]) for ph in ("prefill", "decode")
            if row.get("predicted", {}).get(f"{ph}_us") and row.get("profiled", {}).get(f"{ph}_us")]
    said = "  ".join(f"{ph} {us:.0f}/{truth:.0f}={us / truth:.3f}" for ph, us, truth in both)
    return f"{name:16s} b{row['batch']:<3d} p{row['prefill']:<5d} {said or row.get('error', '')[:300]}"


def verdict(summary: dict) -> dict:
    errors, moe_decode, failed = [], [], []
    for name, entry in summary["families"].items():
        for row in entry.get("configurations", []):
            if "error" in row:
                failed.append(f"{name} {row['batch']}x{row['prefill']}: {row['error'][:120]}")
            for phase in ("prefill", "decode"):
                truth, us = row.get("profiled", {}).get(f"{phase}_us"), row.get("predicted", {}).get(f"{phase}_us")
                if truth and us:
                    errors.append(us / truth - 1)
                    if entry["experts"] and phase == "decode":
                        moe_decode.append(us / truth - 1)
    full = [r for rows in summary.get("full", {}).values() for r in rows]
    full_errors = [r["predicted"][f"{ph}_us"] / r["profiled"][f"{ph}_us"] - 1 for r in full for ph in ("prefill", "decode")
                   if r.get("predicted", {}).get(f"{ph}_us") and r.get("profiled", {}).get(f"{ph}_us")]
    out = {"rows": len(errors), "failed": failed, "within_10pct": sum(abs(x) <= 0.10 for x in errors) / max(len(errors), 1),
           "median_abs_error": statistics.median(abs(x) for x in errors) if errors else None,
           "moe_decode_within_10pct": all(abs(x) <= 0.10 for x in moe_decode) if moe_decode else None,
           "rankings_equal": {n: e.get("ranking", {}).get("same") for n, e in summary["families"].items()},
           "full_depth_within_10pct": all(abs(x) <= 0.10 for x in full_errors) if full_errors else None,
           "full_depth_errors": [round(x, 4) for x in full_errors],
           "full_depth_seconds": [r.get("seconds") for r in full]}
    out["pass"] = bool(errors and out["within_10pct"] >= 0.95 and out["median_abs_error"] <= 0.03 and not failed
                       and out["moe_decode_within_10pct"] is not False and all(out["rankings_equal"].values())
                       and out["full_depth_within_10pct"] is not False
                       and all((s or 99) <= 60 for s in out["full_depth_seconds"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", action="append", choices=sorted(PUBLISHED), help="repeatable (default: FAMILIES)")
    ap.add_argument("--configs", default="1x1024,8x512,32x2048",
                    type=lambda t: [tuple(int(x) for x in c.split("x")) for c in t.split(",")],
                    help="BATCHxPROMPT, comma-separated (default 1x1024,8x512,32x2048)")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2, help="the table's depth, both sides alike")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions of the sequence replay")
    ap.add_argument("--full", default=",".join(FULL), help="FULL's families at their own depth (default all)")
    ap.add_argument("--no-full", action="store_true", help="the table only")
    ap.add_argument("--no-table", action="store_true", help="--full's models only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    top = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="predict-models-"))
    top.mkdir(parents=True, exist_ok=True)
    import transformers

    summary = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "transformers": transformers.__version__, "layers": args.layers, "decode": args.decode,
               "configs": args.configs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "commit": _commit(), "families": {}, "full": {}}
    path = top / "predict_summary.json"
    t0 = time.monotonic()
    for name in [] if args.no_table else args.family or FAMILIES:
        summary["families"][name] = family(name, top, args)
        summary["verdict"] = verdict(summary)
        path.write_text(json.dumps(summary, indent=1))
    summary["seconds_table"] = round(time.monotonic() - t0, 1)
    for name in ([] if args.no_full else [n for n in args.full.split(",") if n]):
        summary["full"][name] = full_depth(name, FULL[name], top, args)
        summary["verdict"] = verdict(summary)
        path.write_text(json.dumps(summary, indent=1))
    summary["seconds"] = round(time.monotonic() - t0, 1)
    path.write_text(json.dumps(summary, indent=1))
    print(f"table {summary['seconds_table']} s, all {summary['seconds']} s")
    print(json.dumps(summary.get("verdict", {}), indent=1))
    return 0


def _commit() -> str:  # OPPERF_COMMIT, else git's (a device machine's copy of the tree may carry a stale .git)
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return os.environ.get("OPPERF_COMMIT") or (done.stdout.strip() if done.returncode == 0 else "")


if __name__ == "__main__":
    sys.exit(main())
