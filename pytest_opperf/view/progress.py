"""A progress line in pytest's terminal: case N of M, the time so far, an estimate of the time left,
and what a case that runs longer than a second is doing (its phase: set-up, first call, check,
sampling, ...), as a heartbeat that shows the run is not hung.

It is written after pytest's own output on the current line (the dots, or the test's name with
-v) and erased before pytest writes again, so pytest's lines stay as they are; it is refreshed
twice a second by a thread. It goes to the terminal straight (a copy of its file descriptor taken
before any capture), never into a test's captured output. Under xdist the controller shows it,
from the workers' reports and the phase files they write (run/activity.py).

Only on a terminal: not when the output is piped (a log keeps pytest's lines alone), not with
-q, -s (a test's own prints share the line) or live logging (log_cli).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from pytest_opperf import testid
from pytest_opperf.run.activity import Activity, read_phases
from pytest_opperf.run.durations import recorded
from pytest_opperf.run.xdist import workers_dir
from pytest_opperf.view import fit

HEARTBEAT_S = 1.0  # a case shows in the line once it has run this long
MIN_ROOM = 40  # less room after pytest's output than the line needs: it goes on a line of its own
TICK_S = 0.5
LABELS = {None: "", "setup": "set-up", "inputs": "making inputs", "first call": "first call (may compile)",
          "check": "checking against the reference", "warmup": "warming up",
          "devstate": "reading the device state", "sampling": "sampling", "verify": "checking a timed call",
          "record": "recording"}


def wanted(config: pytest.Config) -> bool:
    """A terminal that can take it: a tty, not -q, not -s, no live logging, not Windows' console."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not reporter.isatty() or config.get_verbosity() < 0:
        return False
    if getattr(config.option, "capture", "fd") == "no" or config.getini("log_cli") or os.name == "nt":
        return False
    return os.environ.get("TERM") != "dumb" and hasattr(sys.stdout, "fileno")


def clock(seconds: float) -> str:
    """'0:07', '12:30', '1:02:03'."""
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def label(nodeid: str, room: int) -> str:
    """The case's name in at most `room` characters: its test, backend and dtype (the first two
    parameters) stay whole, the other parameters lose their start (the last ones tell the cases
    of a sweep apart).

    >>> label("b.py::test_gemm[torch-fp16-m=1024-n=1024-k=4096]", 36)
    'test_gemm[torch-fp16-...024-k=4096]'
    """
    t = testid.parse(nodeid)
    if len(t.name) <= room or t.params is None:
        return fit.cut(t.name, room)
    parts = testid.tokens(t.params)
    head, rest = f"{t.test}[{'-'.join(parts[:2])}", "-".join(parts[2:])
    space = room - len(head) - 2  # the '-' before the rest and the closing ']'
    if not rest or space < 2 * len(fit.ELLIPSIS):
        return fit.cut(t.name, room)
    return f"{head}-{rest if len(rest) <= space else fit.ELLIPSIS + rest[len(rest) - space + len(fit.ELLIPSIS):]}]"


def time_left(done: int, total: int, elapsed: float, running: list[tuple[str, Optional[str], float]],
              pending: Optional[set] = None, recorded: Optional[dict] = None, parallel: int = 1) -> Optional[float]:
    """Seconds the run has left: each case not yet finished takes its recorded time where the
    results database has one, shared among the `parallel` processes that run cases (xdist's
    workers), else the mean wall time per case so far; a running case has already spent its
    running time. None before there is anything to go by.

    >>> time_left(2, 4, 10.0, [("a", None, 31.0)], {"a", "b"}, {"a": 40.0})
    14.0
    """
    recorded = recorded or {}
    mean = elapsed / done if done else None
    known = [recorded[n] for n in (pending or ()) if n in recorded]
    if mean is None and not known:
        return None
    typical = mean if mean is not None else sum(known) / len(known)
    running_ids = {n for n, _, _ in running}
    waiting = set(pending or ()) - running_ids
    unknown = max(total - done - len(running_ids) - len(waiting), 0)  # pending ids not known (xdist)
    known_s = sum(recorded[n] for n in waiting if n in recorded)
    known_s += sum(max(recorded[n] - seconds, 0.0) for n, _, seconds in running if n in recorded)
    unknown += sum(1 for n in waiting if n not in recorded)
    unknown_s = unknown * typical + sum(max(typical - seconds, 0.0) for n, _, seconds in running if n not in recorded)
    return known_s / max(parallel, 1) + unknown_s


def status(done: int, total: int, elapsed: float, running: list[tuple[str, Optional[str], float]],
           room: int, named: bool = True, left_s: Optional[float] = None) -> str:
    """The line's text in at most `room` characters ('' when none fits): the counts, then the
    longest-running case (unless not `named`: pytest -v wrote it already) and its phase.
    running: (nodeid, phase, seconds running) per case; left_s: time_left's estimate (None: the
    mean of the cases done so far).

    >>> status(3, 10, 30.0, [("b.py::test_gemm[torch-fp16-m=1024]", "sampling", 12.4)], 80)
    ' [case 4/10, 0:30, ~1:10 left] test_gemm[torch-fp16-m=1024] 12s: sampling'
    >>> status(3, 10, 30.0, [("b.py::test_gemm[torch-fp16-m=1024]", "sampling", 12.4)], 20)
    ' [4/10 ~1:10 left]'
    """
    if left_s is None and done and total > done:
        left_s = elapsed / done * (total - done)
    left = f", ~{clock(left_s)} left" if left_s is not None and total > done else ""
    head = f" [case {min(done + 1, total) if total else done + 1}/{total or '?'}, {clock(elapsed)}{left}]"
    short = f" [{min(done + 1, total) if total else done + 1}/{total or '?'}{' ' + left[2:] if left else ''}]"
    if not running:
        return head if len(head) <= room else short if len(short) <= room else ""
    nodeid, phase, seconds = max(running, key=lambda r: r[2])
    more = f" (+{len(running) - 1} running)" if len(running) > 1 else ""
    tail = f" {seconds:.0f}s" + (f": {LABELS.get(phase, phase)}" if LABELS.get(phase, phase) else "") + more
    for lead in (head, short):
        space = room - len(lead) - len(tail) - 1
        if not named and space >= 0:
            return lead + tail
        if space >= 16:
            return f"{lead} {label(nodeid, space)}{tail}"
    return short if len(short) <= room else ""


class Progress:
    """The controller's hooks (or the single process's) that keep the counts and draw the line."""

    def __init__(self, config: pytest.Config, activity: Activity, db_path: Optional[Path] = None):
        self.config, self.activity = config, activity
        self.db_path = db_path  # the results database whose recorded times the estimate takes
        self.tw = config.get_terminal_writer()
        self.fd = _terminal_fd(config)
        self.width = self.tw.fullwidth
        # pytest -v writes the running case's name before it runs (xdist's controller does not)
        self.names_shown = config.get_verbosity() > 0 and not getattr(config.option, "dist", "no") != "no"
        self.lock = threading.Lock()
        self.shown = 0  # characters of the line on the screen now
        self.below: Optional[int] = None  # drawn on a line of its own: the column pytest's line ended at
        self.total = 0
        self.pending: set[str] = set()  # the collected cases not finished yet
        self.recorded: dict[str, float] = {}  # their recorded wall times (results database)
        self.done = 0
        self.started: Optional[float] = None
        self.running: dict[str, float] = {}  # nodeid -> when it started (perf_counter)
        self.in_call: set[str] = set()  # running cases past their set-up
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None

    # --- counts ---------------------------------------------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self._expect([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list) -> None:
        self.total = max(self.total, len(ids))
        if not self.pending:
            self._expect(ids)

    def _expect(self, nodeids: list) -> None:
        self.pending = set(nodeids)
        if self.db_path is not None:  # else nothing to go by but the mean of the cases done
            self.recorded = {n: s for n, s in recorded(self.db_path, time.time()).items() if n in self.pending}

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session):
        # trylast: the innermost wrapper, so the line is gone before pytest writes its last progress.
        if not session.config.option.collectonly:  # under xdist the count comes later, from the workers
            self.thread = threading.Thread(target=self._beat, name="opperf-progress", daemon=True)
            self.thread.start()
        try:
            return (yield)
        finally:
            self.close()

    # --- pytest writes: the line is erased first, and stays off while pytest writes -----------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location):
        with self.lock:
            self._erase()
            self.running[nodeid] = time.perf_counter()
            self.started = self.started or self.running[nodeid]  # the first case's start (xdist's workers are up)
            self.width = self.tw.fullwidth  # read here, in the main thread, while no capture hides the terminal
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport):
        with self.lock:
            self._erase()
            if report.when == "setup" and report.passed:
                self.in_call.add(report.nodeid)
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logfinish(self, nodeid: str, location):
        with self.lock:
            self._erase()
            self.in_call.discard(nodeid)
            self.pending.discard(nodeid)
            if self.running.pop(nodeid, None) is not None:
                self.done += 1
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True, optionalhook=True)
    def pytest_testnodedown(self, node, error):
        with self.lock:
            self._erase()
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True, optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        with self.lock:
            self._erase()
            self.running.pop(crashitem, None)
            return (yield)

    # --- the line -------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self.stop.wait(TICK_S):
            with self.lock:
                if self.stop.is_set():
                    return
                self._draw()

    def _draw(self) -> None:
        now = time.perf_counter()
        running = [(n, t) for n, t in self.running.items() if now - t >= HEARTBEAT_S]
        if not running:
            self._erase()
            return
        phases = self._phases()
        rows = [(n, phases[n][0] if n in phases else None if n in self.in_call else "setup", now - t)
                for n, t in running]
        elapsed = now - (self.started or now)
        left = time_left(self.done, self.total, elapsed, rows, self.pending, self.recorded, len(self.running))
        column = self.tw.width_of_current_line
        room = self.width - column - 1
        text = status(self.done, self.total, elapsed, rows, room, not self.names_shown, left)
        below = None
        if room < MIN_ROOM:  # pytest's dots (or -v's name) filled the row: a line of its own below it
            text, below = "\n" + status(self.done, self.total, elapsed, rows, self.width - 1, True, left)[1:], column
        self._erase()
        if text.strip():
            self._write(text)
            self.shown, self.below = len(text), below

    def _phases(self) -> dict:
        activity = self.activity
        phases = read_phases(workers_dir(self.config))
        if activity.nodeid is not None:
            phases[activity.nodeid] = (activity.phase, activity.since or 0.0)
        return phases

    def _erase(self) -> None:
        if self.shown and self.below is not None:
            # Clear the line below, go back up to where pytest's line ended.
            self._write("\r\x1b[K\x1b[1A\r" + (f"\x1b[{self.below}C" if self.below else ""))
        elif self.shown:
            self._write("\b" * self.shown + "\x1b[K")
        self.shown, self.below = 0, None

    def _write(self, text: str) -> None:
        try:
            os.write(self.fd, text.encode("utf-8", "replace"))
        except OSError:
            self.stop.set()  # the terminal went away: no more lines

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            self._erase()
        if self.thread is not None:
            self.thread.join(timeout=2 * TICK_S)
            self.thread = None

    def pytest_unconfigure(self) -> None:
        self.close()
        try:
            os.close(self.fd)
        except OSError:
            pass


def _terminal_fd(config: pytest.Config) -> int:
    """A copy of the terminal's file descriptor, taken with pytest's capture off: writes to it
    reach the terminal while a test's output is captured."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        return os.dup(sys.stdout.fileno())
    with capman.global_and_fixture_disabled():
        return os.dup(sys.stdout.fileno())
