"""An independent check of the recorded times: every row of a results database timed again, apart
from the plugin's timers.

For each row of every op table (collectives left out) the case is rebuilt through the catalogue
(the row's parameters, dtypes and per-case seed; the backend's callable with the row's knobs) and
timed with torch.profiler's device activity: the device time of all kernels, copies and fills one
call ran, median over `--calls` calls. Cold rows: before every call a full read of twice the L2 by
a Triton kernel of its own name (`opperf_check_separator`, which also tells the calls' kernels
apart); hot rows: the same kernel reading one block. `--rounds N` keeps each row's median of N
passes, the SM clock NVML read beside it. None of the plugin's measuring code is used (no sampler,
timer, flusher or record reader), so a bug there cannot hide in both numbers. Prints recorded /
independent per row, then the rows >= 5 us within 5% and < 5 us within 10%.

On a database, in a process of its own, each row is rebuilt: a row whose speed depends on its
process (a kernel of two speeds, a compiled variant) can differ by more than the bound with both
timings right. In the sweep's process, as a pytest plugin, each case's callable is timed right
after the case, on the same inputs, the process's state shared:

    PYTHONPATH=benchmarks/acceptance pytest benches/ -p independent_check --independent-json OUT/inprocess.json

    pytest benches/                                   # the default sweep -> results/<device>.db
    python benchmarks/acceptance/independent_check.py            # results/h100.db on an H100 (the device's spec name)
    python benchmarks/acceptance/independent_check.py --db results/h100.db --calls 100 --json OUT/check.json
    python benchmarks/acceptance/independent_check.py --rounds 3 --match grouped_gemm --match "add_rmsnorm torch"
    python benchmarks/acceptance/independent_check.py --db results/cpu.db --dry-run   # rebuild every case, time nothing
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

from pytest_opperf.case import Case
from pytest_opperf import dtypes
from pytest_opperf.catalog import load_builtin
from pytest_opperf.catalog.registry import BACKENDS, OPS, DTypes
from pytest_opperf.record import plain
from pytest_opperf.run.env import case_seed
from pytest_opperf.store.results import open_results

SMALL_US = 5.0
CLOCK_BOUND = 0.05  # a row timed here at an SM clock this far from the recorded one is not compared
TOLERANCE = {True: 0.10, False: 0.05}  # small row (< 5 us) -> allowed relative difference


def rebuild(op: str, row: dict, param_names: list, device, seed: int = 0) -> tuple[Callable, tuple]:
    """(the backend's callable with the row's knobs, the op's inputs): the case the row measured."""
    params = tuple((name, plain(row[name])) for name in param_names)
    knobs = json.loads(row["knobs"]) if row.get("knobs") else {}
    case = Case(op, row["backend"], None, row["dtype_in"], row["dtype_out"], params, tuple(knobs.items()))
    dts = DTypes(dtypes.lookup(row["dtype_in"]), dtypes.lookup(row["dtype_out"]))
    gen = torch.Generator(device=device).manual_seed(case_seed(seed, case))
    with torch.inference_mode():
        args = OPS[op].inputs(dict(params), dts, device, gen)
    fn = BACKENDS[(op, row["backend"])].fn
    return (lambda *a: fn(*a, **knobs)) if knobs else fn, tuple(args)


SEPARATOR_NAME = "opperf_check_separator"  # in no op's kernels: the calls are told apart by it


def _triton_separator():
    """A Triton kernel that reads its buffer (one partial sum per block): a kernel name no op runs."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def opperf_check_separator(src, out, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < n, other=0.0)
        tl.store(out + pid, tl.sum(x, axis=0))

    return opperf_check_separator


class Separator:
    """What runs between two timed calls: a full read of twice the L2 (cold), or a one-block read (hot).

    Its kernel splits the profiler's device timeline into calls. With Triton it is a kernel of its
    own name, so no op's kernel is mistaken for it; without, torch's int16 max (a memset and a
    reduction), which ops that run a memset or an int16 reduction themselves cannot be checked by.
    """

    BLOCK = 4096

    def __init__(self, device, cold: bool, l2_bytes: int):
        self.cold = cold
        self.kernel = _triton_separator()
        n = max(2 * l2_bytes, 64 << 20) // 4 if cold else self.BLOCK
        if self.kernel is not None:
            self.buffer = torch.rand(n, dtype=torch.float32, device=device)
            self.blocks = -(-n // self.BLOCK)
            self.out = torch.empty(self.blocks, dtype=torch.float32, device=device)
        else:
            self.buffer = torch.ones(n * 2 if cold else 1, dtype=torch.int16, device=device)
        self.names = set(k.name for k in _device_events(self._profile(lambda: None, 3)))

    def is_separator(self, name: str) -> bool:
        return SEPARATOR_NAME in name if self.kernel is not None else name in self.names

    def __call__(self):
        if self.kernel is not None:
            self.kernel[(self.blocks,)](self.buffer, self.out, self.buffer.numel(), BLOCK=self.BLOCK)
            return self.out
        return self.buffer.max() if self.cold else self.buffer.fill_(1)

    def _profile(self, fn: Callable, calls: int):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                self()
                fn()
            self()
            torch.cuda.synchronize()
        return prof


def _device_events(prof) -> list:
    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)


def call_times_us(fn: Callable, args: tuple, sep: Separator, calls: int, per_kernel: Optional[dict] = None) -> list[float]:
    """The device time of each of `calls` calls, each after the separator (its kernels excluded).

    per_kernel, where given, gets each kernel name's durations (us), to pin a disagreement to a kernel.
    """
    with torch.inference_mode():
        for _ in range(3):
            fn(*args)  # warm-up: compilation, autotuning, lazy set-up
        torch.cuda.synchronize()
        prof = sep._profile(lambda: fn(*args), calls)
    times, current, seen, previous_sep = [], None, 0, False
    for e in _device_events(prof):
        if sep.is_separator(e.name):
            # One separator may run several kernels back to back (a large max(): a memset, then the
            # reduction): they count once.
            if not previous_sep:
                if current is not None:
                    times.append(current)
                current = 0.0
                seen += 1
            previous_sep = True
            continue
        previous_sep = False
        if current is not None:
            current += e.time_range.elapsed_us()
            if per_kernel is not None:
                per_kernel.setdefault(e.name[:100], []).append(e.time_range.elapsed_us())
    if seen != calls + 1 or len(times) != calls:
        raise RuntimeError(f"{seen} separator kernels for {calls} calls: a call ran a kernel named like the "
                           f"separator's ({SEPARATOR_NAME if sep.kernel is not None else sorted(sep.names)})")
    return times


class Clocks:
    """The GPU's SM clock (MHz) and power draw (W) by NVML, where nvidia-ml-py is installed: said beside
    each row, so that a difference from the recorded time can be told from a clock that moved."""

    def __init__(self, device):
        self.nvml = self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # no nvidia-ml-py, no NVML: the rows go without clocks
            self.nvml = None

    def read(self) -> Optional[tuple]:
        if self.nvml is None:
            return None
        try:
            return (self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM),
                    round(self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000))
        except Exception:
            return None


def new_entry(label: str, row: dict) -> dict:
    """A row's entry: what was recorded (a database row or the plugin's record: the same columns)."""
    return {"row": label, "recorded_us": row.get("time_us"), "timer": row.get("timer"), "cache": row.get("cache"),
            "rounds_us": [], "clocks": [],
            "recorded_sm_mhz": [row.get("sm_clock_mhz_before"), row.get("sm_clock_mhz_after")]}


def error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class Timing:
    """What one run of the check shares across rows: a separator for cold and one for hot rows, the
    L2's size, the clock reader."""

    def __init__(self, device):
        self.device = device
        self.l2 = torch.cuda.get_device_properties(device).L2_cache_size
        self.clocks = Clocks(device)
        self.seps: dict = {}

    def into(self, entry: dict, fn: Callable, args: tuple, calls: int) -> None:
        """One round of the row: its median call time, kernels and clocks added to `entry`."""
        cold = entry["cache"] == "cold"
        sep = self.seps.get(cold) or self.seps.setdefault(cold, Separator(self.device, cold, self.l2))
        before = self.clocks.read()
        kernels: dict = {}
        entry["rounds_us"].append(statistics.median(call_times_us(fn, args, sep, calls, kernels)))
        entry["kernels_us"] = {k: round(statistics.median(v), 2) for k, v in kernels.items()}
        entry["clocks"].append([before, self.clocks.read()])
        entry["independent_us"] = statistics.median(entry["rounds_us"])
        entry["ratio"] = entry["recorded_us"] / entry["independent_us"]
        entry["spread"] = max(entry["rounds_us"]) / min(entry["rounds_us"]) - 1


def check(db_path: Path, calls: int, dry_run: bool, ops: Optional[list] = None, rounds: int = 1,
          match: Optional[list] = None, saved: Optional[Callable] = None) -> list[dict]:
    """Every row (of `ops`, whose label holds one of `match`) timed `rounds` times, one pass over the
    database a round: the row's independent time is the median of its rounds' medians, and the rounds'
    spread says how much the machine itself moved."""
    device = torch.device("cpu" if dry_run else "cuda")
    timing = None if dry_run else Timing(device)
    entries: dict = {}
    load_builtin()
    with open_results(db_path) as db:
        todo = []
        for op in db.op_tables():
            if op not in OPS or OPS[op].peak == "link" or (ops and op not in ops):
                continue
            names = db.params(op)
            for row in db.rows(op):
                label = f"{op} {row['backend']} {row['dtype_in']} " + " ".join(f"{n}={plain(row[n])}" for n in names)
                if match and not any(m in label for m in match):
                    continue
                todo.append((op, names, row, label))
        for r in range(1 if dry_run else rounds):
            if rounds > 1:
                print(f"round {r + 1} of {rounds}", flush=True)
            for op, names, row, label in todo:
                entry = entries.setdefault(label, new_entry(label, row))
                if "error" in entry:
                    continue
                for attempt in (1, 2):
                    try:
                        _time_row(entry, op, names, row, device, timing, calls)
                        break
                    except torch.cuda.OutOfMemoryError:
                        # The cache goes back only when a row needs it: after every row it fragmented
                        # later rows' memory (attention_decode's GEMMs then 14% slower than in the sweep).
                        torch.cuda.empty_cache()
                        if attempt == 2:
                            entry["error"] = "OutOfMemoryError: with the cached memory released too"
                    except Exception as exc:  # a backend missing here, a row of an older catalogue
                        entry["error"] = error_text(exc)
                        break
                _print_row(entry)
                if saved is not None:
                    saved(list(entries.values()))  # a run cut short keeps what it timed
    return list(entries.values())


def _time_row(entry: dict, op: str, names: list, row: dict, device, timing: Optional[Timing], calls: int) -> None:
    """One round of one row: rebuilt, then called (a dry run, no timing) or timed into `entry`."""
    fn, args = rebuild(op, row, names, device)
    if timing is None:
        with torch.inference_mode():
            fn(*args)  # the rebuilt case runs
        return
    timing.into(entry, fn, args, calls)


def _print_row(e: dict) -> None:
    print(_row_text(e), flush=True)


def _row_text(e: dict) -> str:
    if "error" in e:
        return f"  {e['row']:<70} error: {e['error']}"
    elif "ratio" in e:
        small = e["independent_us"] < SMALL_US
        mark = "" if abs(e["ratio"] - 1) <= TOLERANCE[small] else "  x"
        spread = f" spread {e['spread']:.1%}" if len(e.get("rounds_us", ())) > 1 else ""
        clock = e["clocks"][-1] if e.get("clocks") else None
        seen = f" (recorded at {e['recorded_sm_mhz'][0]}-{e['recorded_sm_mhz'][1]} MHz, here {clock[0][0]}-{clock[1][0]} MHz)" \
            if clock and clock[0] and clock[1] and e["recorded_sm_mhz"][0] else ""
        return (f"  {e['row']:<70} {e['recorded_us']:10.2f} {e['independent_us']:10.2f} {e['ratio']:7.3f}{mark}"
                f"{spread}{seen}")
    return f"  {e['row']:<70} rebuilt and called"


def clock_change(e: dict) -> Optional[float]:
    """How far the SM clock here (the lower NVML reading around the row's last timing) sat from the
    recorded row's (the lower of its before and after), relative; None where either is unknown.

    >>> clock_change({"recorded_sm_mhz": [1920, 1965], "clocks": [[[1965, 398], [1515, 448]]]})
    -0.2109375
    """
    recorded = [m for m in e.get("recorded_sm_mhz") or () if m]
    here = [reading[0] for reading in (e.get("clocks") or [[]])[-1] if reading]
    if not recorded or not here:
        return None
    return min(here) / min(recorded) - 1


def summary(rows: list[dict]) -> str:
    """The acceptance line: rows >= 5 us within 5%, rows < 5 us within 10%, the median ratio.

    A row whose SM clock here moved more than CLOCK_BOUND from the recorded one (a power cap pulling
    it down during one timing and not the other) compares two clocks, not two timers: it is counted
    apart, named in the line, and left out of the bounds.
    """
    timed = [r for r in rows if "ratio" in r]
    if not timed:
        return f"{len(rows)} rows, none timed ({sum('error' in r for r in rows)} errors)"
    clocked = [r for r in timed if abs(clock_change(r) or 0.0) > CLOCK_BOUND]
    compared = [r for r in timed if r not in clocked]
    parts = []
    for small, label in ((False, f">= {SMALL_US:g} us"), (True, f"< {SMALL_US:g} us")):
        group = [r for r in compared if (r["independent_us"] < SMALL_US) == small]
        ok = sum(abs(r["ratio"] - 1) <= TOLERANCE[small] for r in group)
        parts.append(f"rows {label}: {ok}/{len(group)} within {TOLERANCE[small]:.0%}")
    errors = sum("error" in r for r in rows)
    moved = sum(r.get("spread", 0) > TOLERANCE[r["independent_us"] < SMALL_US] for r in timed)
    apart = "; ".join(f"{r['row']} {r['ratio']:.3f} at {clock_change(r):+.0%} SM clock" for r in clocked)
    return (f"{len(timed)} rows timed: " + "; ".join(parts)
            + f"; median ratio {statistics.median(r['ratio'] for r in timed):.3f}"
            + (f"; {len(clocked)} rows at another SM clock than recorded, not compared ({apart})" if clocked else "")
            + (f"; {moved} rows moved beyond the bound between rounds here" if moved else "")
            + (f"; {errors} rows not rebuilt (errors above)" if errors else ""))


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, help="results database (default: results/<this GPU's spec>.db)")
    ap.add_argument("--calls", type=int, default=50, help="calls timed a row (median over them)")
    ap.add_argument("--op", action="append", help="only this op's table (repeatable)")
    ap.add_argument("--match", action="append", help="only rows whose label holds this text (repeatable)")
    ap.add_argument("--rounds", type=int, default=1, help="passes over the rows (the median of rounds is kept)")
    ap.add_argument("--json", type=Path, help="write the rows and the summary here")
    ap.add_argument("--dry-run", action="store_true", help="rebuild every case on the CPU, time nothing")
    a = ap.parse_args(argv)
    if not a.dry_run and not torch.cuda.is_available():
        print("independent_check: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    db = a.db or _default_db()
    if not db.is_file():
        print(f"independent_check: {db}: no such database (run `pytest benches/` first)", file=sys.stderr)
        return 2
    print(f"{db}: row, recorded us, independent us, recorded/independent (x: outside the tolerance)")
    device = "cpu (dry run)" if a.dry_run else torch.cuda.get_device_name()

    def save(rows: list, line: str) -> None:
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps({"date": dt.date.today().isoformat(), "device": device, "db": str(db),
                                          "calls": a.calls, "rounds": a.rounds, "summary": line, "rows": rows},
                                         indent=1))

    rows = check(db, a.calls, a.dry_run, a.op, a.rounds, a.match, saved=lambda rows: save(rows, "(unfinished)"))
    line = summary(rows)
    print(line)
    save(rows, line)
    return 0


def _default_db() -> Path:
    from pytest_opperf.hardware.specs import detect_accelerator, load_specs, resolve_alias, slug

    acc = detect_accelerator()
    spec = resolve_alias(load_specs(), acc.reported_name) if acc.type != "cpu" else None
    return Path("results") / f"{spec.name if spec else slug(acc.reported_name)}.db"


# ---- in the sweep's process: a pytest plugin (-p independent_check) ----

def pytest_addoption(parser):
    group = parser.getgroup("independent_check", "benchmarks/acceptance/independent_check.py in the sweep's process")
    group.addoption("--independent-json", default="", help="write the rows and the summary here")
    group.addoption("--independent-calls", type=int, default=20, help="calls timed after each case")


class InProcess:
    """After each measured case: its callable timed here on its inputs; at the end, the summary."""

    def __init__(self, config):
        self.config = config
        self.calls = config.getoption("independent_calls")
        self.entries: dict = {}
        self.timing: Optional[Timing] = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield
        fn, args = item.funcargs.get("backend"), item.funcargs.get("inputs")
        if fn is None or args is None or not torch.cuda.is_available():
            return
        from pytest_opperf.run.bench import RECORD_KEY  # the row just measured (read, not measured by)

        record = item.stash.get(RECORD_KEY, None)
        if record is None:
            return
        entry = self.entries.setdefault(item.nodeid, new_entry(item.nodeid, record))
        try:
            if self.timing is None:
                self.timing = Timing(next((a.device for a in args if isinstance(a, torch.Tensor)),
                                          torch.device("cuda")))
            self.timing.into(entry, fn, tuple(args), self.calls)
        except Exception as exc:  # a case the loop cannot split or call: said, the sweep goes on
            entry["error"] = error_text(exc)

    def pytest_terminal_summary(self, terminalreporter):
        rows = list(self.entries.values())
        if not rows:
            return
        outside = [e for e in rows if "ratio" in e
                   and abs(e["ratio"] - 1) > TOLERANCE[e["independent_us"] < SMALL_US]]
        terminalreporter.write_sep("-", "independent check, in the sweep's process")
        for e in outside + [e for e in rows if "error" in e]:
            terminalreporter.write_line(_row_text(e))
        line = summary(rows)
        terminalreporter.write_line(line)
        path = self.config.getoption("independent_json")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps({"date": dt.date.today().isoformat(), "mode": "in the sweep's process",
                                              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "",
                                              "calls": self.calls, "summary": line, "rows": rows}, indent=1))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("opperf"):  # loaded beside the plugin: the in-process check
        config.pluginmanager.register(InProcess(config), "independent-check-in-process")


if __name__ == "__main__":
    sys.exit(main())
