"""Ending a run without losing its rows: SIGTERM and SIGINT, and checkpoints on a timer.

Signals. CI cancels a job with SIGTERM (or SIGINT), then SIGKILL a few seconds later (7.5 s on
GitHub Actions, 30 s on GitLab and Kubernetes). The first SIGTERM or SIGINT takes pytest's
interrupt path: it raises KeyboardInterrupt in the main thread, pytest ends the session as
INTERRUPTED (exit 2), and the session's end writes the rows first (tryfirst), closes the run's
row (its ended_at) and says what was kept and how many cases did not run. A later signal does not
interrupt that write. Under xdist the workers turn their SIGTERM into the same interrupt, and the
controller stores every row it received before its own.

A case stuck outside Python (a hung kernel, a deadlock in native code) never returns to the
interpreter, so the handler never runs. signal.set_wakeup_fd has the C-level handler write the
signal's number to a socket that a daemon thread watches: HARD_BOUND_S after the first signal, if
the session has not reached its end, that thread writes the rows, closes the run's row, prints
what it did and ends the process (os._exit, status 2).

Timer. The same thread checkpoints the writer when no row has arrived for --opperf-flush-interval
and rows wait, so a long or hung case does not keep the rows measured before it out of the
database; while rows keep arriving the main thread writes them between cases, so the thread does
not write while a case is being timed (the writer's lock makes the two take turns).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

import pytest

if TYPE_CHECKING:
    from pytest_opperf.run.controller import Controller

HARD_BOUND_S = 3.0  # from the first signal to os._exit, when the session is stuck before its end
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_INTERRUPTED = 2  # pytest's ExitCode.INTERRUPTED
MIN_TICK_S = 0.5  # the timer thread wakes at most this often (a flush interval of 0 writes on each row)


class Shutdown:
    """Hooks of every process that runs or receives cases: signal handlers and the watch thread."""

    def __init__(self, config: pytest.Config, controller: Callable[[], Optional["Controller"]], writes: bool,
                 flush_interval_s: float):
        self.config = config
        # The controller once the session is open (an xdist controller opens it after its workers
        # start: run/session.py); None before, and in a process that does not write rows (writes).
        self._controller = controller
        self.writes = writes and not config.option.collectonly
        self.flush_interval_s = flush_interval_s
        self.signal_name: Optional[str] = None  # the first SIGTERM/SIGINT the main thread's handler saw
        self.watched_signal = "signal"  # the first the watch thread saw (also when the handler cannot run)
        self.interrupted: Optional[str] = None  # why the session was interrupted, as pytest saw it
        self.total = 0
        self.done = 0  # cases whose run ended (a teardown report), whatever their outcome
        self.ended = threading.Event()  # the session reached its end: the bound stands down
        self._previous: dict = {}
        self._wakeup: Optional[tuple] = None
        self._previous_wakeup = -1
        self._thread: Optional[threading.Thread] = None
        # The terminal as it is now (capture suspended): the watch thread writes there when it ends a
        # stuck process, while pytest may be capturing fd 2 for the case that hangs.
        self._stderr = os.dup(2)

    @property
    def controller(self) -> Optional["Controller"]:
        return self._controller()

    @property
    def writer(self):
        controller = self._controller() if self.writes else None
        return None if controller is None else controller.writer

    # --- set-up ------------------------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        if threading.current_thread() is threading.main_thread():
            self._install()
        if self.writes or self._wakeup is not None:
            self._thread = threading.Thread(target=self._watch, name="opperf-shutdown", daemon=True)
            self._thread.start()

    def _install(self) -> None:
        """Take SIGTERM and SIGINT where nobody else has (SIG_DFL, Python's default SIGINT handler)."""
        defaults = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
        for signum, default in defaults.items():
            if signal.getsignal(signum) is default:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        if not self._previous:
            return
        read, write = socket.socketpair()
        read.setblocking(False)
        write.setblocking(False)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        except ValueError:
            read.close()
            write.close()
            return
        self._wakeup = (read, write)

    def _on_signal(self, signum, frame) -> None:
        if self.signal_name is not None:
            return  # the first one is ending the session: let it write; the bound ends a stuck one
        self.signal_name = signal.Signals(signum).name
        raise KeyboardInterrupt(f"opperf: {self.signal_name}")

    # --- the session -------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.done += 1

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.interrupted = self.signal_name or str(excinfo.value).strip() or excinfo.typename

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # First of the session's end: the rows and the run's ended_at, before reports and xdist's
        # wait for its workers, which a CI's SIGKILL may cut short.
        self.ended.set()
        if self.writer is None:
            return
        self.writer.close()
        if self.interrupted is not None or self.signal_name is not None:
            self.controller.notes.insert(0, self.interrupted_line(session))

    def interrupted_line(self, session: Optional[pytest.Session] = None) -> str:
        """'interrupted (SIGTERM): 12 measured rows kept, 30 of 42 cases not run'."""
        session = session or getattr(self, "session", None)
        total = self.total or getattr(session, "testscollected", 0) or 0
        kept = self.writer.written + self.writer.rescued if self.writer is not None else 0
        not_run = f", {max(total - self.done, 0)} of {total} cases not run" if total else ""
        return f"interrupted ({self.signal_name or self.interrupted}): {kept} measured rows kept{not_run}"

    def pytest_unconfigure(self) -> None:
        self.ended.set()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            self._wakeup[1].send(b"\0")  # wakes the thread, which sees the session ended
        if self._thread is not None:
            self._thread.join(2.0)
        if self._wakeup is not None:
            for sock in self._wakeup:
                sock.close()
            self._wakeup = None
        os.close(self._stderr)

    # --- the watch thread --------------------------------------------------------------------

    def _watch(self) -> None:
        tick = max(self.flush_interval_s, MIN_TICK_S)
        deadline: Optional[float] = None
        while not self.ended.is_set():
            wait = tick if deadline is None else max(min(tick, deadline - time.monotonic()), 0.0)
            if self._wakeup is not None:
                ready, _, _ = select.select([self._wakeup[0]], [], [], wait)
                signum = self._stop_signal_in(self._wakeup[0]) if ready else None
                if signum is not None and deadline is None:
                    # Not self.signal_name: the main thread's handler, still to run, raises only on
                    # the first signal it sees.
                    self.watched_signal = signal.Signals(signum).name
                    deadline = time.monotonic() + HARD_BOUND_S
            else:
                self.ended.wait(wait)
            if self.ended.is_set():
                return
            if deadline is not None and time.monotonic() >= deadline:
                self._hard_stop()
            if self.writer is not None and deadline is None:
                self.writer.flush_if_stalled()

    @staticmethod
    def _stop_signal_in(sock: socket.socket) -> Optional[int]:
        """The first SIGTERM or SIGINT among the signal numbers the C handler wrote, or None."""
        try:
            data = sock.recv(256)
        except OSError:
            return None
        return next((byte for byte in data if byte in STOP_SIGNALS), None)

    def _hard_stop(self) -> None:
        """The session did not reach its end within HARD_BOUND_S of the signal: store, say so, exit."""
        name = self.signal_name = self.signal_name or self.watched_signal
        lines = [f"opperf: {name}: the session did not end within {HARD_BOUND_S:g} s (a case stuck outside "
                 f"Python?); storing the rows and ending the process"]
        if self.writer is not None:
            self.writer.close()
            lines.append("opperf: " + self.interrupted_line())
            lines += [f"opperf: {line}" for line in self.writer.summary_lines(self.controller.env.run_id)]
        try:
            os.write(self._stderr, ("\n" + "\n".join(lines) + "\n").encode())
        finally:
            os._exit(EXIT_INTERRUPTED)
