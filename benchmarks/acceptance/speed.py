"""Issue 36 side by side, in one GPU call: the sweep's scaling, the harness against do_bench, the
shards' balance, and whether a row depends on the case before it.

    python3 benchmarks/acceptance/speed.py [--out DIR] [--workers N] [--pytest-args "..."] [--skip STEP ...]

Steps, in this order (each can be skipped):

    forward   README's main command (`pytest benches/`) serially, into DIR/forward: it warms the
              compile caches and records the times the later steps order and deal by
    parallel  the same with -n N (one worker per GPU), into DIR/parallel, which starts from a copy
              of forward's database: its workers take the longest recorded cases first
    reverse   the same serially in reverse order (-p reverse_order), into DIR/reverse: warm, the
              serial wall time of the speedup, and the rows of another order
    dobench   triton.testing.do_bench (its defaults) on the same callables as reverse's rows, in
              this process: a case's wall time in the harness against do_bench's (first calls apart)
    shards    the shares --opperf-shard=I/N deals from forward's recorded times (N = 3 and the GPU
              count), by time and, for comparison, by count
    settle    int8 GEMM 256^3 timed (CUDA events, L2 flushed by a read before each of 30 calls) on a
              rested GPU, right after 0.5 s of large bf16 GEMMs, and after them once the clock
              settled as the plugin's clock warmer lets it (measure/clocks.py)

What to read (issue 60's acceptance): -n N against serial, warm, collectives included, >= 2.5x on
4 GPUs and 1.7x on 2, the kernel cases' phase (first start to last end) >= 3.5x and 1.9x; what is
left between those and N (start-up, the end, idle devices, the collective phase); the collective
phase <= 20 s on 2 GPUs, at most 5% of collective rows unstable, rows -n vs serial (kernel >= 5 us
within 3%, 95% of the collective rows). Issue 52's: harness / do_bench <= 0.5, each
side's first calls (compilation) left out; forward vs reverse: every kernel row of 5 us or more
within 3%, 95% of the collective rows; the collective cases' phase <= 20 s; shares within 25% of their mean;
settle: 'after, settled' within 3% of 'rested' where 'after, no settle' is not.
Writes DIR/speed.json (DIR: --out, else $OUT, else a temporary directory) and prints a short
table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from harness_cost import do_bench_walls, read_rows  # noqa: E402

STEPS = ("forward", "parallel", "reverse", "dobench", "shards", "settle")
SMALL_US = 5.0  # rows below this are left out of the order comparison (issue 36: rows of 5 us or more)


def sweep(out: Path, name: str, extra: list[str], history: Path | None = None) -> dict:
    """README's main command into out/name (from a copy of `history`, if given): wall and rows."""
    results = out / name
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    if history is not None:
        shutil.copy(history, results / history.name)
    command = [sys.executable, "-m", "pytest", "benches/", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               f"--opperf-results={results}", "--opperf-summary=0", *extra]
    print("$", " ".join(shlex.quote(c) for c in command), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    start = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.time() - start
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    print("\n".join(line for line in done.stdout.splitlines()[-4:]), flush=True)
    dbs = sorted(results.glob("*.db"))
    rows = [r for r in read_rows(dbs[0]) if r["started_unix_s"] >= start] if dbs else []
    return {"wall_s": wall, "exit": done.returncode, "cases": len(rows), "db": str(dbs[0]) if dbs else None,
            "began": start,
            "rows": {r["test_id"]: {"time_us": r["time_us"], "wall_s": r["ended_unix_s"] - r["started_unix_s"],
                                    "first_call_ms": r.get("first_call_ms") or 0.0,
                                    "worker": r.get("worker"), "op": r["op"], "backend": r["backend"],
                                    "knobs": r.get("knobs"), "dtype_in": r["dtype_in"], "dtype_out": r["dtype_out"],
                                    "busbw_gbps": r.get("busbw_gbps"), "collective": r.get("comm_convention") is not None,
                                    "started": r["started_unix_s"], "ended": r["ended_unix_s"],
                                    "unstable": r.get("unstable"), "cv": r.get("cv"), "gpus": r.get("gpus"),
                                    "gpu": r.get("gpu"), "target_met": r.get("target_met"),
                                    "_params": r["_params"], **{p: r[p] for p in r["_params"]}}
                     for r in rows}}


def phases(rows: dict) -> dict:
    """Seconds from the first case's start to the last one's end, of the kernel cases and of the
    collective cases, whichever workers ran them; and the collective cases' mean seconds."""
    out = {}
    for name, collective in (("kernel", False), ("collective", True)):
        mine = [r for r in rows.values() if r.get("collective") == collective]
        if mine:
            out[f"{name}_span_s"] = max(r["ended"] for r in mine) - min(r["started"] for r in mine)
            out[f"{name}_cases"] = len(mine)
            out[f"{name}_case_s"] = sum(r["ended"] - r["started"] for r in mine) / len(mine)
    return out


def breakdown(run: dict, gpus: int) -> dict:
    """Where a sweep's wall time went: start-up (the process's start to the first case's), the
    collective and kernel phases (first start to last end of each; they may overlap), the end (the
    last case's end to the process's), the devices' busy share (device-seconds of the cases, a
    collective case's on each of its GPUs, over the host's GPUs x the cases' span), and the unstable and budget-stopped collective rows."""
    rows = list(run["rows"].values())
    if not rows:
        return {}
    first, last = min(r["started"] for r in rows), max(r["ended"] for r in rows)
    busy = sum((r["ended"] - r["started"]) * (len(r["gpus"].split(",")) if r.get("gpus") else 1) for r in rows)
    collective = [r for r in rows if r["collective"]]
    out = {"startup_s": first - run["began"], "cases_span_s": last - first,
           "end_s": run["began"] + run["wall_s"] - last, "busy_share": busy / max(gpus, 1) / max(last - first, 1e-9),
           "collective_rows": len(collective), "collective_unstable": sum(1 for r in collective if r.get("unstable")),
           "collective_target_missed": sum(1 for r in collective if r.get("target_met") == 0),
           "kernel_unstable": sum(1 for r in rows if not r["collective"] and r.get("unstable")),
           "side_by_side_groups": _most_at_once(collective)}
    return {**out, **phases(run["rows"])}


def bound(serial: dict, gpus: int) -> dict:
    """The wall time -n on GPUS can reach, from a serial run's cases (issue 76): its start-up and end,
    the all-GPU groups one after another (each holds every GPU), and the rest spread evenly over the
    GPUs (a kernel case one GPU's seconds, a partial group's k GPUs')."""
    rows = list(serial["rows"].values())
    b = breakdown(serial, gpus)
    if not rows or not b:
        return {}
    width = [len(r["gpus"].split(",")) if r["collective"] and r.get("gpus") else 1 for r in rows]
    every = sum(r["ended"] - r["started"] for r, k in zip(rows, width) if r["collective"] and k >= gpus > 1)
    spread = sum((r["ended"] - r["started"]) * k for r, k in zip(rows, width) if not (r["collective"] and k >= gpus > 1))
    return {"startup_s": b["startup_s"], "end_s": b["end_s"], "all_gpu_groups_s": every,
            "spread_s": spread / max(gpus, 1), "bound_s": b["startup_s"] + b["end_s"] + every + spread / max(gpus, 1)}


def first_calls(run: dict) -> dict:
    """Seconds of first calls (compilation) per worker, and the largest single one per worker: a
    worker's first compiled case paid its compiler's start unless it was warmed before (issue 76)."""
    out: dict = {}
    for r in run["rows"].values():
        mine = out.setdefault(r.get("worker") or "-", {"s": 0.0, "largest_ms": 0.0})
        mine["s"] += r["first_call_ms"] / 1e3
        mine["largest_ms"] = max(mine["largest_ms"], r["first_call_ms"])
    return out


def _most_at_once(rows: list[dict]) -> int:
    """The most collective cases that ran at the same time (disjoint leases side by side)."""
    edges = sorted([(r["started"], 1) for r in rows] + [(r["ended"], -1) for r in rows], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def agreement(a: dict, b: dict, collective: bool | None = None) -> dict:
    """Rows of 5 us or more in both runs (of collective cases only, or kernel cases only, where
    `collective` says): how many, how many within 3%, the worst ratios b/a."""
    pairs = [(t, b[t]["time_us"] / a[t]["time_us"]) for t in a if t in b and a[t]["time_us"] >= SMALL_US
             and (collective is None or a[t].get("collective") == collective)]
    worst = sorted(pairs, key=lambda p: -abs(p[1] - 1))[:5]
    return {"rows": len(pairs), "within_3pct": sum(abs(r - 1) <= 0.03 for _, r in pairs),
            "worst": [(t.split("::")[-1], round(r, 3)) for t, r in worst]}


def shard_balance(seconds: dict, counts: list[int]) -> dict:
    """Per N: each share's recorded seconds dealt by time (LPT) and by count (no history)."""
    from pytest_opperf.run import shard

    out = {}
    for n in counts:
        by_time = [sum(seconds[t] for t in b) for b in shard.lpt(seconds, n)]
        by_count = [sum(seconds[t] for t in b) for b in shard.lpt(dict.fromkeys(seconds, 1.0), n)]
        out[n] = {"by_time_s": [round(s, 1) for s in by_time], "by_count_s": [round(s, 1) for s in by_count],
                  "by_time_worst": max(abs(s / statistics.mean(by_time) - 1) for s in by_time),
                  "by_count_worst": max(abs(s / statistics.mean(by_count) - 1) for s in by_count)}
    return out


def harness_vs_do_bench(reverse: dict, budget_s: float) -> dict:
    """do_bench on reverse's cases; both sides' mean wall ms a case over the cases do_bench timed.

    Three comparisons. like-for-like (the issue's ratio): each side's wall less its first call
    (compilation, autotuning: what a backend costs once whatever times it; do_bench's is its
    own call before do_bench). Also ours with our first call against do_bench without its
    (the earlier figure), and both with their first calls.
    """
    rows = [{**r, "test_id": t} for t, r in reverse["rows"].items()]
    bench = do_bench_walls(rows, budget_s, fresh_caches=False)
    if not bench:
        return {}
    ours = [reverse["rows"][t] for *_, t in bench]
    with_first = statistics.mean(r["wall_s"] * 1e3 for r in ours)
    without_first = statistics.mean(r["wall_s"] * 1e3 - r["first_call_ms"] for r in ours)
    theirs = statistics.mean(w for _, w, *_ in bench)
    theirs_first = statistics.mean(w + first for _, w, _, first, _ in bench)
    return {"cases": len(bench), "harness_ms": without_first, "do_bench_ms": theirs, "ratio": without_first / theirs,
            "harness_with_first_ms": with_first, "ratio_ours_with_first": with_first / theirs,
            "do_bench_with_first_ms": theirs_first, "ratio_both_with_first": with_first / theirs_first,
            "end_to_end_ms": reverse["wall_s"] * 1e3 / max(reverse["cases"], 1)}


def settle_probe() -> dict:
    """int8 GEMM 256^3: rested, right after heavy bf16 GEMMs, and after them once the clock settled."""
    import torch

    from pytest_opperf.measure import clocks, devstate

    device = torch.device("cuda", 0)
    monitor = devstate.open_monitor(device)
    a = torch.randint(-8, 8, (256, 256), dtype=torch.int8, device=device)
    b = torch.randint(-8, 8, (256, 256), dtype=torch.int8, device=device).t()
    big = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    flush = torch.empty(2 * 2**30 // 8, dtype=torch.int64, device=device)  # a read of 2 GiB clears any L2

    def timed() -> float:
        times = []
        for _ in range(30):
            flush.sum()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch._int_mm(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)

    def heavy() -> None:
        began = time.perf_counter()
        while time.perf_counter() - began < 0.5:
            big @ big
            torch.cuda.synchronize()

    clocks.Burner(device)()  # compile nothing later: the kernels' first calls are here
    timed()
    out = {}
    heavy()
    out["after_no_settle_us"], out["mhz_after_heavy"] = timed(), monitor.sm_clock()
    time.sleep(2.0)  # rested (well within the 5 s after which the warmer would warm up again)
    out["rested_us"], out["mhz_rested"] = timed(), monitor.sm_clock()
    heavy()
    low = monitor.sm_clock()
    warm = max(filter(None, [out["mhz_rested"], low])) if out["mhz_rested"] or low else None
    waited = clocks.settle(monitor.sm_clock, warm) if warm else None
    out["after_settled_us"] = timed()
    out["settle"] = waited.columns() if waited else "no SM clock to read (NVML)"
    return out


def table(report: dict) -> str:
    lines = ["", f"issue 60, {report['date']}, {report['device']} x{report['gpus']}", ""]
    fw, par, rev = report.get("forward"), report.get("parallel"), report.get("reverse")
    if rev and par:
        lines.append(f"serial (reverse, warm) {rev['wall_s']:.1f} s, -n {report['workers']} {par['wall_s']:.1f} s: "
                     f"speedup {rev['wall_s'] / par['wall_s']:.2f}x (cases {rev['cases']} / {par['cases']})")
    if fw and par:
        for kind, collective in (("kernel", False), ("collective", True)):
            a = agreement(fw["rows"], par["rows"], collective)
            lines.append(f"{kind} rows forward vs -n: {a['within_3pct']} of {a['rows']} (>= 5 us) within 3%; "
                         f"worst {a['worst']}")
    if fw and rev:
        for kind, collective in (("kernel", False), ("collective", True)):
            a = agreement(fw["rows"], rev["rows"], collective)
            lines.append(f"{kind} rows forward vs reverse: {a['within_3pct']} of {a['rows']} (>= 5 us) within 3%; "
                         f"worst {a['worst']}")
    for name in ("forward", "parallel", "reverse"):
        run = report.get(name)
        if run:
            ph = phases(run["rows"])
            lines.append(f"{name}: wall {run['wall_s']:.1f} s; " + "; ".join(
                f"{k} cases {ph[k + '_cases']} in {ph[k + '_span_s']:.1f} s (first start to last end), "
                f"{ph[k + '_case_s'] * 1e3:.0f} ms a case" for k in ("kernel", "collective") if k + "_cases" in ph))
    for name in ("forward", "parallel", "reverse"):
        run = report.get(name)
        if run:
            b = breakdown(run, report["gpus"] or 1)
            if b:
                lines.append(f"{name}: start-up {b['startup_s']:.1f} s, cases {b['cases_span_s']:.1f} s, end "
                             f"{b['end_s']:.1f} s; devices busy {b['busy_share']:.0%} of the cases' span; collective rows "
                             f"unstable {b['collective_unstable']} of {b['collective_rows']}, stopped on the budget "
                             f"{b['collective_target_missed']}; kernel rows unstable {b['kernel_unstable']}; "
                             f"groups side by side at most {b['side_by_side_groups']}")
    if rev and par:
        a, b = phases(rev["rows"]), phases(par["rows"])
        ra, rb = breakdown(rev, report["gpus"] or 1), breakdown(par, report["gpus"] or 1)
        n = report["workers"]
        lines.append(f"left between the speedup and {n}: -n start-up {rb['startup_s']:.1f} s (serial "
                     f"{ra['startup_s']:.1f} s), end {rb['end_s']:.1f} s (serial {ra['end_s']:.1f} s), devices idle "
                     f"{1 - rb['busy_share']:.0%} of the cases' span; collective phase {b.get('collective_span_s', 0):.1f} s "
                     f"against {a.get('collective_span_s', 0):.1f} s serially")
        if "kernel_span_s" in a and "kernel_span_s" in b:
            lines.append(f"kernel phase serial (reverse) / -n {report['workers']}: {a['kernel_span_s']:.1f} / "
                         f"{b['kernel_span_s']:.1f} s: {a['kernel_span_s'] / b['kernel_span_s']:.2f}x")
        top = bound(rev, report["gpus"] or 1)
        if top:
            lines.append(f"bound on {report['gpus']} GPUs from the serial run: start-up {top['startup_s']:.1f} + end "
                         f"{top['end_s']:.1f} + all-GPU groups {top['all_gpu_groups_s']:.1f} + the rest spread "
                         f"{top['spread_s']:.1f} = {top['bound_s']:.1f} s; -n {par['wall_s']:.1f} s is "
                         f"{par['wall_s'] / top['bound_s']:.2f}x of it (target <= 1.10)")
    for name in ("forward", "parallel", "reverse"):
        if report.get(name):
            lines.append(f"{name}: first calls by worker " + ", ".join(
                f"{w} {f['s']:.1f} s (largest {f['largest_ms']:.0f} ms)" for w, f in sorted(first_calls(report[name]).items())))
    d = report.get("dobench")
    if d:
        lines.append(f"harness {d['harness_ms']:.1f} ms a case vs do_bench {d['do_bench_ms']:.1f} ms on the same "
                     f"{d['cases']} cases, first calls in neither: {d['ratio']:.2f}x (target <= 0.5); ours with our "
                     f"first calls {d['harness_with_first_ms']:.1f} ms: {d['ratio_ours_with_first']:.2f}x; first calls "
                     f"in both: {d['ratio_both_with_first']:.2f}x; end to end {d['end_to_end_ms']:.1f} ms")
    for n, s in (report.get("shards") or {}).items():
        lines.append(f"shards /{n}: by time {s['by_time_s']} (worst {s['by_time_worst']:.0%} off the mean), "
                     f"by count {s['by_count_s']} (worst {s['by_count_worst']:.0%})")
    p = report.get("settle")
    if p:
        lines.append(f"int8 GEMM 256^3: rested {p['rested_us']:.2f} us ({p['mhz_rested']} MHz), after heavy GEMMs "
                     f"{p['after_no_settle_us']:.2f} us ({p['mhz_after_heavy']} MHz), after them settled "
                     f"{p['after_settled_us']:.2f} us ({p['settle']})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=0, help="xdist workers (default: one per visible GPU)")
    parser.add_argument("--pytest-args", default="", help="more pytest options for every sweep, one string")
    parser.add_argument("--main-forward", action="store_true",
                        help="the forward sweep is README's main command as it is (--pytest-args left out of it): "
                             "on a fresh machine, the main command cold")
    parser.add_argument("--do-bench-budget", type=float, default=60.0, help="seconds of the do_bench step")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS)
    parser.add_argument("--history", type=Path, default=None,
                        help="a results database whose recorded times -n orders by, where forward is skipped")
    args = parser.parse_args()
    import torch

    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="speed-"))
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    workers = args.workers or gpus
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpus": gpus, "workers": workers,
              "device": torch.cuda.get_device_name(0) if gpus else "cpu"}
    extra = shlex.split(args.pytest_args)
    steps = [s for s in STEPS if s not in args.skip]
    if "forward" in steps:
        report["forward"] = sweep(out, "forward", [] if args.main_forward else extra)
    history = Path(report["forward"]["db"]) if report.get("forward", {}).get("db") else args.history
    if "parallel" in steps and workers:
        report["parallel"] = sweep(out, "parallel", [*extra, "-n", str(workers)], history)
    if "reverse" in steps:
        report["reverse"] = sweep(out, "reverse", [*extra, "-p", "reverse_order"])
    if "dobench" in steps and report.get("reverse") and gpus:
        report["dobench"] = harness_vs_do_bench(report["reverse"], args.do_bench_budget)
    if "shards" in steps and report.get("forward"):
        seconds = {t: r["wall_s"] for t, r in report["forward"]["rows"].items()}
        report["shards"] = shard_balance(seconds, sorted({3, max(gpus, 2)}))
    if "settle" in steps and gpus:
        report["settle"] = settle_probe()
    (out / "speed.json").write_text(json.dumps(report, indent=1, default=str))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
