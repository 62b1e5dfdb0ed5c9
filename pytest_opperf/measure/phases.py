"""Where a case's wall time goes: a per-phase account, kept in its row and summed for the session.

A case runs, in this order: pytest's set-up of its fixtures (``setup``, which includes the
creation of its inputs, kept apart as ``inputs``), the functional check (``check``: the first
call, the reference, the comparison), the warm-up (``warmup``: the clock warm-up, when it
runs, and the warm-up calls), the device-state reading before and after (``devstate``),
sampling (``sampling``: the timer's loop until the stopping rule says stop), the check of one
timed call (``verify``, with the kernel names of a profiled call when they are asked for),
and the making of the row (``record``: the record, the gate's verdict). The phases are
disjoint stretches of the case's wall time, from the start of its set-up to the end of its
record, so their sum is at most the wall time; the rest is pytest's own work between them.

>>> clock = PhaseClock()
>>> with clock("check"):
...     pass
>>> sorted(clock.ms)
['check']
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from pytest_opperf.columns import PHASES as PHASE_COLUMNS, types

# When this process loaded the plugin (pytest's start, give or take its own imports): the runs
# row's started_unix_s, from which a session's start-up to its first case is counted.
LOADED_UNIX_S = time.time()
PHASES = ("setup", "inputs", "check", "warmup", "devstate", "sampling", "verify", "record")
# The row's columns: each phase in milliseconds; the case's start and end on the host's clock
# (seconds since the epoch), which place it on a timeline beside the other workers' cases.
COLUMNS = types(PHASE_COLUMNS)  # declared with their meanings in pytest_opperf/columns.py
LABELS = {"setup": "set-up", "inputs": "inputs", "check": "check", "warmup": "warm-up", "devstate": "device state",
          "sampling": "sampling", "verify": "timed-call check", "record": "record"}


class PhaseClock:
    """Milliseconds spent per phase, added up over the stretches timed with `with clock(name)`.

    listener: told the phase the case is in as it changes (None: between phases), for a progress
    display (the terminal's heartbeat of a long case).
    """

    def __init__(self, listener: Optional[Callable[[Optional[str]], None]] = None) -> None:
        self.ms: dict[str, float] = {}
        self.listener = listener
        self._open: list[str] = []

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with self.told(phase):
                yield
        finally:
            self.add(phase, time.perf_counter() - start)

    @contextmanager
    def told(self, phase: str) -> Iterator[None]:
        """The listener hears of `phase` for the stretch, which is not added (another clock times it)."""
        self._open.append(phase)
        self._tell()
        try:
            yield
        finally:
            self._open.pop()
            self._tell()

    def _tell(self) -> None:
        if self.listener is not None:
            self.listener(self._open[-1] if self._open else None)

    def add(self, phase: str, seconds: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
        self.ms[phase] = self.ms.get(phase, 0.0) + seconds * 1e3


class Span:
    """A stretch of wall time on two clocks: the epoch clock places it, perf_counter measures it."""

    def __init__(self) -> None:
        self.unix_s = time.time()
        self.perf_s = time.perf_counter()
        self.stop_perf_s: Optional[float] = None

    def stop(self) -> None:
        self.stop_perf_s = time.perf_counter()

    @property
    def seconds(self) -> float:
        return ((self.stop_perf_s if self.stop_perf_s is not None else time.perf_counter()) - self.perf_s)

    def unix_now(self) -> float:
        """The epoch time now, read off perf_counter: monotonic within the span, unlike time.time()."""
        return self.unix_s + (time.perf_counter() - self.perf_s)


def columns(setup: Optional[Span], inputs_s: Optional[float], clock: PhaseClock, ended_unix_s: float,
            started_unix_s: Optional[float] = None) -> dict:
    """The row's phase columns. setup: the pytest set-up of the case (None: not seen, as when the
    test was run without the plugin's hooks); inputs_s: the inputs fixture's time inside it (None:
    the test made its own inputs). A phase that did not run is NULL, not 0.

    >>> c = PhaseClock(); c.add("check", 0.002); c.add("sampling", 0.010)
    >>> row = columns(None, None, c, 100.0, 99.9)
    >>> row["phase_check_ms"], row["phase_sampling_ms"], row["phase_setup_ms"], row["started_unix_s"]
    (2.0, 10.0, None, 99.9)
    """
    ms: dict[str, Optional[float]] = {p: clock.ms.get(p) for p in PHASES}
    if setup is not None:
        inside = inputs_s or 0.0
        # The fixtures' set-up, and what the case itself set up (a collective's rank group).
        ms["setup"] = max(setup.seconds - inside, 0.0) * 1e3 + (clock.ms.get("setup") or 0.0)
        started_unix_s = setup.unix_s
    if inputs_s is not None:
        ms["inputs"] = inputs_s * 1e3
    return {**{f"phase_{p}_ms": ms[p] for p in PHASES}, "started_unix_s": started_unix_s,
            "ended_unix_s": ended_unix_s}


def wall_ms(row: dict) -> Optional[float]:
    """A row's wall time from its start to its end, in milliseconds (None: not recorded)."""
    start, end = row.get("started_unix_s"), row.get("ended_unix_s")
    return None if start is None or end is None else (end - start) * 1e3


def totals(rows: list[dict]) -> dict[str, float]:
    """Milliseconds per phase summed over rows, and 'wall' (their wall times) and 'other' (wall
    time in no phase: pytest's work between the phases). Rows without phases are left out.

    >>> totals([{"phase_check_ms": 2.0, "phase_sampling_ms": 5.0, "started_unix_s": 0.0, "ended_unix_s": 0.01}])
    {'setup': 0.0, 'inputs': 0.0, 'check': 2.0, 'warmup': 0.0, 'devstate': 0.0, 'sampling': 5.0, 'verify': 0.0, 'record': 0.0, 'wall': 10.0, 'other': 3.0}
    """
    out = {p: 0.0 for p in PHASES}
    wall = 0.0
    for row in rows:
        w = wall_ms(row)
        if w is None:
            continue
        wall += w
        for p in PHASES:
            out[p] += row.get(f"phase_{p}_ms") or 0.0
    out["wall"] = wall
    out["other"] = max(wall - sum(out[p] for p in PHASES), 0.0)
    return out


def summary_line(rows: list[dict], session_start_unix_s: Optional[float] = None,
                 profiler_start_s: Optional[float] = None) -> Optional[str]:
    """One line for the terminal summary: where the measured cases' time went, per case on average,
    and (given the session's start) the start-up before the first case, with the profiler's start
    inside it (timers.start_profiler) when this process paid it there.

    >>> summary_line([{"phase_check_ms": 2.0, "phase_sampling_ms": 5.0, "started_unix_s": 0.0, "ended_unix_s": 0.01}])
    'harness, per case (mean of 1): wall 10.0 ms = check 2.0, sampling 5.0, other 3.0 ms; sampling is 50% of the wall time'
    >>> summary_line([{"phase_sampling_ms": 5.0, "started_unix_s": 12.5, "ended_unix_s": 12.51}], 10.0).split("; ")[-1]
    'start-up 2.5 s to the first case'
    >>> summary_line([{"phase_sampling_ms": 5.0, "started_unix_s": 12.5, "ended_unix_s": 12.51}], 10.0, 1.04).split("; ")[-1]
    "start-up 2.5 s to the first case, of which 1.0 s the profiler's start"
    """
    timed = [r for r in rows if wall_ms(r) is not None]
    if not timed:
        return None
    t, n = totals(timed), len(timed)
    parts = [f"{LABELS[p]} {t[p] / n:.1f}" for p in PHASES if t[p] > 0] + [f"other {t['other'] / n:.1f}"]
    share = t["sampling"] / t["wall"] if t["wall"] > 0 else 0.0
    line = (f"harness, per case (mean of {n}): wall {t['wall'] / n:.1f} ms = {', '.join(parts)} ms; "
            f"sampling is {share:.0%} of the wall time")
    if session_start_unix_s is not None:
        first = min(r["started_unix_s"] for r in timed)
        line += f"; start-up {max(first - session_start_unix_s, 0.0):.1f} s to the first case"
        if profiler_start_s is not None:
            line += f", of which {profiler_start_s:.1f} s the profiler's start"
    return line
