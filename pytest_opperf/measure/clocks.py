"""Clock warm-up: bring an idle GPU's clocks up before a case is timed.

An idle GPU parks its SM clock low and raises it only under load: an H100 that started a
sweep idle read 345 MHz, and 18 of its 90 cases, the first ones among them, came out
unstable (then: CV > 0.15) while the clock climbed. So before the first timed case of a process,
and before a case that follows more than IDLE_GAP_S without one, the device is held busy
with matrix multiplies until its clock is steady:

    steady  (NVML) the SM clock, polled every POLL_S, settled: three readings within 2% of
            each other near the target clock (the applications clock, else the max clock),
            or within 2% for PLATEAU_S (a GPU held below its target: power cap, locked
            clocks); recorded as `bound` when the bound came first (3 s by default)
    fixed   (no clock to read: other accelerators, no nvidia-ml-py, a MIG slice) busy for
            the whole bound (1 s by default)

A heavy case leaves the clock low the other way: large GEMMs at the power cap pull the SM
clock down, and a small kernel timed right after them ran 12-29% slower than from a rested
GPU (H200, 2026-11-26), so its row depended on its neighbour in the sweep. So when the clock
read after a case is more than 2% below the highest clock this process has seen, the next case
first lets the device rest, polling every SETTLE_POLL_S, until the clock is back within 2%
(or SETTLE_BOUND_S passed): recorded as `settled` (or `settle-bound`). A light case never
waits, and without a clock to read nothing settles.

A CPU gets nothing: its frequency governor answers within milliseconds, which each case's
own warm-up (--opperf-warmup) already covers.

    warmer = open_warmer(settings, device, monitor)   # one per process
    columns = warmer.before_case()                    # the row's clock_warmup_* columns
    ...                                               # the case is timed
    warmer.after_case()
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from pytest_opperf.columns import CLOCK_WARMUP, types

IDLE_GAP_S = 5.0  # without device work for longer, clocks may have dropped: warm up again
AUTO_BOUND_S = 3.0  # the most an NVML warm-up may take under --opperf-clock-warmup=auto
AUTO_FIXED_S = 1.0  # a warm-up that cannot read the clock under auto
POLL_S = 0.05
STEADY_READINGS = 3
STEADY_REL = 0.02
NEAR_TARGET = 0.9
PLATEAU_S = 0.5
BURST_S = 0.01  # one burst of busy work, then a sync: the loop checks time and clock between bursts
MATRIX = 2048  # fp32: 48 MB, enough tiles for every SM of today's GPUs
SETTLE_BOUND_S = 0.3  # the most a case waits for the clock a heavy case before it pulled down
SETTLE_POLL_S = 0.005

# Per row: what warm-up ran right before the case (docs/database.md).
COLUMNS = types(CLOCK_WARMUP)


@dataclass(frozen=True)
class Warmup:
    """One warm-up: how (steady, bound, fixed), how long, and the SM clock at its start and end."""

    method: str
    seconds: float
    mhz_start: Optional[int] = None
    mhz_end: Optional[int] = None

    def columns(self) -> dict:
        return {"clock_warmup_s": round(self.seconds, 4), "clock_warmup_method": self.method,
                "clock_warmup_mhz_start": self.mhz_start, "clock_warmup_mhz_end": self.mhz_end}


def settled(readings: list[tuple[float, int]], target_mhz: Optional[int]) -> bool:
    """Has the clock stopped rising? readings: (seconds, MHz) in the order taken.

    >>> settled([(0.0, 345), (0.05, 1965), (0.1, 1980), (0.15, 1980)], 1980)
    True
    >>> settled([(0.0, 345), (0.05, 345), (0.1, 345)], 1980)     # idle, not yet raised
    False
    """
    last = [mhz for _, mhz in readings[-STEADY_READINGS:]]
    if len(last) < STEADY_READINGS or not _agree(last):
        return False
    if target_mhz and last[-1] >= NEAR_TARGET * target_mhz:
        return True
    # A plateau: every reading from PLATEAU_S ago (the last one taken by then) to now agrees.
    since = [i for i, (t, _) in enumerate(readings) if t <= readings[-1][0] - PLATEAU_S]
    return bool(since) and _agree([mhz for _, mhz in readings[since[-1]:]])


def _agree(values: list[int]) -> bool:
    return max(values) - min(values) <= STEADY_REL * max(values)


def hold_until_steady(busy: Callable[[], None], read_mhz: Callable[[], Optional[int]],
                      target_mhz: Optional[int], bound_s: float, now: Callable[[], float] = time.monotonic) -> Warmup:
    """Run busy() until the clock read_mhz() gives has settled, or for bound_s at most."""
    start = now()
    readings = [(0.0, read_mhz())]
    while True:
        busy()
        elapsed = now() - start
        if elapsed - readings[-1][0] >= POLL_S:
            readings.append((elapsed, read_mhz()))
            known = [(t, mhz) for t, mhz in readings if mhz is not None]
            if known and settled(known, target_mhz):
                return Warmup("steady", elapsed, readings[0][1], readings[-1][1])
        if elapsed >= bound_s:
            return Warmup("bound", elapsed, readings[0][1], read_mhz())


def settle(read_mhz: Callable[[], Optional[int]], warm_mhz: int, bound_s: float = SETTLE_BOUND_S,
           now: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Warmup:
    """Leave the device idle until its clock is back within STEADY_REL of warm_mhz, or for bound_s."""
    start = now()
    first = mhz = read_mhz()
    while mhz is not None and mhz < (1 - STEADY_REL) * warm_mhz:
        if now() - start >= bound_s:
            return Warmup("settle-bound", now() - start, first, mhz)
        sleep(SETTLE_POLL_S)
        mhz = read_mhz()
    return Warmup("settled", now() - start, first, mhz)


def hold_for(busy: Callable[[], None], seconds: float, now: Callable[[], float] = time.monotonic) -> Warmup:
    """Run busy() for `seconds`: the warm-up of a device whose clock cannot be read."""
    start = now()
    while now() - start < seconds:
        busy()
    return Warmup("fixed", now() - start)


class Burner:
    """Busy work on a device: bursts of fp32 matrix multiplies of about BURST_S, each waited for."""

    def __init__(self, device):
        import torch

        self.device = device
        try:
            self.a, self.b, self.out = (torch.rand(MATRIX, MATRIX, device=device) for _ in range(3))
        except torch.OutOfMemoryError:  # the case's inputs fill the device: smaller matrices still load it
            self.a, self.b, self.out = (torch.rand(256, 256, device=device) for _ in range(3))
        self.calls = 1

    def __call__(self) -> None:
        import torch

        began = time.perf_counter()
        for _ in range(self.calls):
            torch.mm(self.a, self.b, out=self.out)
        torch.accelerator.synchronize(self.device)
        if time.perf_counter() - began < BURST_S / 2:  # grow the burst until it keeps the device busy
            self.calls = min(2 * self.calls, 1024)


class ClockWarmer:
    """Warms the device up before a case when nothing has kept it busy: one per process.

    bound_s None: warm-up off (or a CPU). read_mhz None: no clock to read, so a fixed warm-up.
    """

    def __init__(self, bound_s: Optional[float], make_busy: Callable[[], Callable[[], None]],
                 read_mhz: Optional[Callable[[], Optional[int]]] = None, target_mhz: Optional[int] = None,
                 now: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.bound_s = bound_s
        self.make_busy = make_busy
        self.read_mhz = read_mhz
        self.target_mhz = target_mhz
        self.now = now
        self.sleep = sleep
        self.last_busy: Optional[float] = None  # when the last case ended; None: no case yet
        self.warm_mhz: Optional[int] = None  # the highest clock read so far: the rested, warm clock
        self.after_mhz: Optional[int] = None  # the clock as the last case ended

    def before_case(self) -> dict:
        """Warm up if the device has been idle, let it settle if the last case pulled its clock
        down; the row's clock_warmup_* columns."""
        if self.bound_s is None:
            return dict.fromkeys(COLUMNS)
        if self.last_busy is not None and self.now() - self.last_busy <= IDLE_GAP_S:
            if self.read_mhz is not None and self.warm_mhz and self.after_mhz and \
                    self.after_mhz < (1 - STEADY_REL) * self.warm_mhz:
                return self._seen(settle(self.read_mhz, self.warm_mhz, min(SETTLE_BOUND_S, self.bound_s),
                                         self.now, self.sleep)).columns()
            return {**dict.fromkeys(COLUMNS), "clock_warmup_s": 0.0}
        busy = self.make_busy()
        if self.read_mhz is None:
            return hold_for(busy, self.bound_s, self.now).columns()
        return self._seen(hold_until_steady(busy, self.read_mhz, self.target_mhz, self.bound_s, self.now)).columns()

    def after_case(self) -> None:
        self.last_busy = self.now()
        if self.read_mhz is not None:
            self.after_mhz = self.read_mhz()
            self._raise(self.after_mhz)

    def _seen(self, warmup: Warmup) -> Warmup:
        self._raise(warmup.mhz_end)
        return warmup

    def _raise(self, mhz: Optional[int]) -> None:
        if mhz is not None and (self.warm_mhz is None or mhz > self.warm_mhz):
            self.warm_mhz = mhz


def open_warmer(settings, device, monitor) -> ClockWarmer:
    """This process's warmer, from --opperf-clock-warmup and what the monitor (NVML) can read."""
    if device.type == "cpu" or not (settings.clock_warmup_auto or settings.clock_warmup_s):
        return ClockWarmer(None, Burner)
    reads_clock = monitor.sm_clock() is not None
    bound = settings.clock_warmup_s or (AUTO_BOUND_S if reads_clock else AUTO_FIXED_S)
    if not reads_clock:
        return ClockWarmer(bound, lambda: Burner(device))
    return ClockWarmer(bound, lambda: Burner(device), monitor.sm_clock, monitor.sm_clock_target())


def run_columns(records: list[dict]) -> dict:
    """The runs row's summary of the warm-ups before the stored cases (of every worker).

    >>> run_columns([{"clock_warmup_s": 0.4}, {"clock_warmup_s": 0.0}, {"clock_warmup_s": None}, {}])
    {'clock_warmups': 1, 'clock_warmup_s': 0.4}
    """
    seconds = [r["clock_warmup_s"] for r in records
               if r.get("clock_warmup_s") and not str(r.get("clock_warmup_method")).startswith("settle")]
    return {"clock_warmups": len(seconds), "clock_warmup_s": round(sum(seconds), 4)}
