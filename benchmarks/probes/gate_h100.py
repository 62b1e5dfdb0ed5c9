"""The gate on a subset of the default sweep: false alarms on unchanged code, and 10% slowdowns caught.

Runs the checkout's own benches/ and configs/ (the default sweep, narrowed by -k) in one Python
process, one pytest session after another (pytest.main), so torch's import and the profiler's
start are paid once:

1. --baseline-runs sessions save a baseline (each appends a run);
2. --reruns sessions of unchanged code are gated against it: a `regressed` verdict is a false
   alarm; `inconclusive` (a contended case or a drifted machine, where the gate has it) is
   counted apart, and is no false alarm;
3. --slow-reruns sessions in which every backend is made --slowdown slower: after each call of
   the backend, a spin kernel (torch.cuda._sleep) lasting that share of the case's baseline
   time, so the profiler counts it as part of the call. The spin's own floor (its duration at
   0 cycles) is measured first; a case whose share is shorter than it is left unslowed and not
   counted. A slowed case is caught only when it fails (`regressed`); `inconclusive` or `same`
   is a miss. The slowdown each case really got is measured too (its time over the baseline's).

Prints a short table and the two acceptance figures (issue 28: 0 false alarms in 20 reruns;
>= 95% of 10% slowdowns caught); writes OUT/gate_h100.json and each session's report.

    python3 benchmarks/probes/gate_h100.py                                    # H100, -k "softmax or rope"
    python3 benchmarks/probes/gate_h100.py -k "rmsnorm and not unfused" --reruns 20 --slow-reruns 5
    python3 benchmarks/probes/gate_h100.py --dry-run                          # CPU: two short sessions, no figures
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Slowdown:
    """A pytest plugin that slows every catalogue backend by `share` of the case's baseline time."""

    def __init__(self, baseline: Path):
        self.baseline = baseline
        self.share = 0.0
        self.target_us: Optional[float] = None
        self.slowed: set = set()  # test ids that got their spin kernel this session
        self.too_short: set = set()
        self.floor_us, self.cycles_per_us = spin_calibration()
        self._times: Optional[dict] = None

    def wrap_backends(self) -> None:
        from pytest_opperf.catalog import load_builtin
        from pytest_opperf.catalog.registry import BACKENDS

        load_builtin()
        for key, be in list(BACKENDS.items()):
            BACKENDS[key] = dataclasses.replace(be, fn=self._slowed(be.fn))

    def _slowed(self, fn):
        def slowed(*args, **kwargs):
            out = fn(*args, **kwargs)
            if self.target_us is not None:
                import torch

                torch.cuda._sleep(int((self.target_us - self.floor_us) * self.cycles_per_us))
            return out
        return slowed

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        self.target_us = None
        case = item.funcargs.get("opperf_case") if hasattr(item, "funcargs") else None
        base_us = self._baseline_times().get(_key(case)) if case is not None and self.share else None
        if base_us is None:
            return
        if self.share * base_us <= self.floor_us:
            self.too_short.add(item.nodeid)
            return
        self.target_us = self.share * base_us
        self.slowed.add(item.nodeid)

    def _baseline_times(self) -> dict:
        if self._times is None:
            entries = json.loads(self.baseline.read_text())["cases"]
            self._times = {_entry_key(e): e["time_us"] for e in entries}
        return self._times


def _key(case) -> tuple:
    from pytest_opperf.record import plain

    params = tuple((k, plain(v)) for k, v in case.params)
    return case.op, case.backend, case.dtype_in, case.dtype_out, params


def _entry_key(e: dict) -> tuple:
    return e["op"], e["backend"], e["dtype_in"], e["dtype_out"], tuple(e["params"].items())


def spin_calibration() -> tuple[float, float]:
    """(the spin kernel's duration at 0 cycles in us, cycles per us), from the profiler's kernel times."""
    import torch

    if not torch.cuda.is_available():
        return 0.0, 0.0
    from torch.profiler import ProfilerActivity, profile

    def spin_us(cycles: int) -> float:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                torch.cuda._sleep(cycles)
            torch.cuda.synchronize()
        times = [e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return statistics.median(times)

    for _ in range(3):
        spin_us(2_000_000)  # clocks up
    floor, long = spin_us(0), spin_us(2_000_000)
    return floor, 2_000_000 / max(long - floor, 1e-3)


def tally(name: str, reports: list[dict], slowed: Optional[list] = None) -> dict:
    """Judgements of one group; with `slowed` (the test ids slowed, per session) only those count."""
    judged = []
    for i, r in enumerate(reports):
        for c in r["cases"]:
            if c["verdict"] in (None, "new", "incomparable"):
                continue
            if slowed is not None and c["test_id"] not in slowed[i]:
                continue
            judged.append(c)
    ratios = [c["p50_us"] / c["baseline_p50_us"] for c in judged if c.get("baseline_p50_us")]
    return {"name": name, "sessions": len(reports), "judged": len(judged),
            "regressed": sum(c["verdict"] == "regressed" for c in judged),
            "inconclusive": sum(c["verdict"] == "inconclusive" for c in judged),
            "measured_slowdown": statistics.median(ratios) - 1 if ratios else None}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default="softmax or rope", help="pytest -k over the default sweep (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="output directory (default: $OUT, else a temporary one)")
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--reruns", type=int, default=20)
    ap.add_argument("--slow-reruns", type=int, default=5)
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--dry-run", action="store_true", help="CPU: one baseline and one rerun session, add only")
    a = ap.parse_args(argv)
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="gate_h100_")))
    out.mkdir(parents=True, exist_ok=True)
    if a.dry_run:
        a.k, a.baseline_runs, a.reruns, a.slow_reruns = "test_add and fp32", 1, 1, 0
    baseline, db = out / "baseline.json", out / "results"
    baseline.unlink(missing_ok=True)
    started = time.monotonic()
    plugin = Slowdown(baseline)
    plugin.wrap_backends()
    os.chdir(ROOT)
    common = ["benches", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-k", a.k, "--opperf-sample-only",
              *(["--device=cpu", "--opperf-budget=0.05"] if a.dry_run else [])]

    def session(label: str, *extra: str) -> Optional[dict]:
        report = out / f"{label}.json"
        code = pytest.main([*common, *extra, f"--opperf-report-json={report}"], plugins=[plugin])
        if code not in (0, 1):
            raise SystemExit(f"{label}: pytest exited {code}")
        return json.loads(report.read_text()) if report.is_file() else None

    for i in range(a.baseline_runs):
        session(f"baseline{i}", f"--opperf-save-baseline={baseline}")
    unchanged = [session(f"unchanged{i}", f"--opperf-baseline={baseline}") for i in range(a.reruns)]
    plugin.share = a.slowdown
    slowed_reports, slowed_ids = [], []
    for i in range(a.slow_reruns):
        plugin.slowed = set()
        slowed_reports.append(session(f"slowed{i}", f"--opperf-baseline={baseline}"))
        slowed_ids.append(set(plugin.slowed))
    groups = [tally("unchanged", [r for r in unchanged if r])]
    if slowed_reports:
        groups.append(tally(f"slowed {a.slowdown:.0%}", [r for r in slowed_reports if r], slowed_ids))
    return _print(out, a, groups, plugin, time.monotonic() - started)


def _print(out: Path, a, groups: list[dict], plugin: Slowdown, wall_s: float) -> int:
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    summary = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": device,
               "torch": torch.__version__, "k": a.k, "wall_s": round(wall_s, 1), "groups": groups,
               "spin_floor_us": plugin.floor_us, "left_unslowed_too_short": sorted(plugin.too_short)}
    (out / "gate_h100.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\n{summary['date']}, {device}, torch {torch.__version__}, -k {a.k!r}, {summary['wall_s']} s; files in {out}")
    print("| sessions | judgements | regressed | inconclusive | slowdown measured (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for g in groups:
        measured = "-" if g["measured_slowdown"] is None else f"{g['measured_slowdown']:+.1%}"
        print(f"| {g['sessions']} x {g['name']} | {g['judged']} | {g['regressed']} | {g['inconclusive']} | {measured} |")
    false_alarms = groups[0]["regressed"]
    print(f"false alarms: {false_alarms} in {groups[0]['judged']} judgements of unchanged code (target 0)")
    ok = false_alarms == 0
    if len(groups) > 1:
        g = groups[1]
        rate = g["regressed"] / g["judged"] if g["judged"] else 0.0
        print(f"caught: {g['regressed']} of {g['judged']} slowed judgements ({rate:.0%}; target >= 95%); "
              f"{len(plugin.too_short)} cases too short to slow (spin floor {plugin.floor_us:.2f} us)")
        ok = ok and rate >= 0.95
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
