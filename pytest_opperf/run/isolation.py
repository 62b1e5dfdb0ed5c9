"""Per-case guards in the process that runs the cases: timeout, out-of-memory, device health.

Out of memory (torch.OutOfMemoryError): the case fails with torch's message; once its
report and teardown are done, the memory it held is released (the failure's traceback,
which pytest keeps in sys.last_traceback for post-mortem debugging, still references the
case's tensors) and the run goes on.

Any other error while an accelerator context exists: the device's health decides, not the
error's class. Some errors poison the context for every later case in the process (an
illegal memory access, a device-side assert); others leave it working (cuBLAS refusing
arguments raises a plain RuntimeError). So the guard probes the context: one tiny kernel
and a wait for its result, in a daemon thread joined with a timeout (PROBE_TIMEOUT_S), so a
hung device cannot hang the probe. A device that answers: the case fails as itself and the
sweep goes on. One that does not: under xdist the worker writes the error and the probe's
result to its crash file and exits inside the case, so xdist reports exactly that case as
crashed and starts a fresh worker on the same device; without xdist the rows measured so
far are written and the run stops after the case; `-n 1` replaces the process instead. On a
CPU session, or before any accelerator context exists, nothing is probed.

Timeout (--opperf-timeout=S). Under xdist: faulthandler dumps the stack of the stuck case to
the crash file and ends the worker after S seconds, whatever it is doing (a hung kernel
included); xdist reports the case, replaces the worker, the sweep goes on. Without xdist: a
SIGALRM after S seconds raises in the case's Python code, which fails the case and the run
goes on; a case stuck in native code (a hung kernel) is ended by a backstop, S + max(S, 10)
seconds after it started, which ends the run (rows are checkpointed before each case when a
timeout is set, so none is lost).
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
from typing import Callable, Optional

import pytest

from pytest_opperf.run import xdist

POISONED_EXIT = 70  # a worker that ends itself after its device stopped working
# The probe is one tiny kernel; seconds leave room for what the failed case left queued.
PROBE_TIMEOUT_S = 5.0


class CaseTimeout(Exception):
    """A case ran past --opperf-timeout."""


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def context_exists(device) -> bool:
    """An accelerator context this process made on the session's device (False on a CPU)."""
    if device.type == "cpu":
        return False
    import torch

    module = getattr(torch, device.type, None)
    is_initialized = getattr(module, "is_initialized", None)
    return bool(is_initialized()) if is_initialized is not None else True


def probe(device) -> None:
    """One-element add on the device, waited for; raises when the context no longer works."""
    import torch

    x = torch.ones(1, device=device)
    x.add_(1)
    torch.accelerator.synchronize(device)  # also waits for what the failed case left queued
    got = x.item()
    if got != 2.0:
        raise RuntimeError(f"1 + 1 gave {got} on {device}")


def run_bounded(fn: Callable[[], None], timeout_s: float) -> Optional[str]:
    """Run fn in a daemon thread for at most timeout_s: None if it returned, else why not.

    A thread rather than faulthandler's timer: the process has one such timer and
    --opperf-timeout owns it, and a thread lets a hung probe be reported and the rows
    stored instead of ending the process. torch releases the GIL while it waits on the
    device, so the join times out even when the probe never returns; being a daemon, the
    stuck thread does not hold up the interpreter's exit.

    >>> run_bounded(lambda: None, 1.0) is None
    True
    """
    outcome: list = []

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (whatever the probe raised is the verdict)
            outcome.append(f"{type(exc).__name__}: {exc}")
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name="opperf-device-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return f"no answer within {timeout_s:g} s"
    return outcome[0]


def release_memory() -> None:
    """Drop what a failed case still holds and return the cached device memory."""
    sys.last_type = sys.last_value = sys.last_traceback = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class CaseGuard:
    """Hooks of a process that runs cases (a worker, or the one process without xdist)."""

    def __init__(self, config: pytest.Config, device, timeout_s: float, flush: Callable[[], None]):
        self.config = config
        self.device = device  # the torch device the cases run on: probed after an error
        self.timeout_s = timeout_s
        self.flush = flush  # a checkpoint of the rows so far (the single process writes them)
        self.crash_path = xdist.crash_file(config)
        self.crash = None
        self.out_of_memory = False
        self.device_failed = False  # a probe found the device gone: the run is stopping, probe no more

    # --- setup -----------------------------------------------------------------------------

    def pytest_sessionstart(self) -> None:
        # After pytest's faulthandler plugin pointed faulthandler at stderr in pytest_configure.
        if self.crash_path is not None:
            self.crash = open(self.crash_path, "a+", encoding="utf-8")  # noqa: SIM115 (open for the process)
            faulthandler.enable(file=self.crash)

    # --- each case -------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        if self.crash is not None:
            self.crash.truncate(0)  # a crash report tells about the case that crashed, not an earlier one
            self.crash.flush()
        if self.timeout_s > 0:
            if self.crash is not None:
                faulthandler.dump_traceback_later(self.timeout_s, exit=True, file=self.crash)
            else:
                self.flush()  # the backstop ends the process: keep every row measured so far
                faulthandler.dump_traceback_later(self.timeout_s + max(self.timeout_s, 10.0), exit=True)
        try:
            return (yield)
        finally:
            if self.timeout_s > 0:
                faulthandler.cancel_dump_traceback_later()
            if self.out_of_memory:
                self.out_of_memory = False
                release_memory()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        if self.timeout_s <= 0 or self.crash is not None or not hasattr(signal, "setitimer"):
            return (yield)
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        try:
            return (yield)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _on_alarm(self, signum, frame):
        raise CaseTimeout(f"opperf: the case ran past --opperf-timeout={self.timeout_s:g} s")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        exc = call.excinfo.value if call.excinfo is not None else None
        if exc is not None and is_out_of_memory(exc):
            self.out_of_memory = True
            return (yield)
        # Exceptions only: pytest's outcomes (skip, fail, xfail) are verdicts, not device errors.
        if not isinstance(exc, Exception) or self.device_failed or not context_exists(self.device):
            return (yield)
        problem = run_bounded(lambda: probe(self.device), PROBE_TIMEOUT_S)
        if problem is not None:
            self._unusable(item, call, problem)
            return (yield)
        report = yield
        report.sections.append(("opperf", "the device answered a probe after this error: it still works"))
        return report

    def _unusable(self, item: pytest.Item, call: pytest.CallInfo, problem: str) -> None:
        error = type(call.excinfo.value).__name__
        if self.crash is not None:
            # Exit inside the case, before its report: xdist then reports this case (not the
            # next one it already holds) as crashed, and the controller shows this text.
            self._note(f"opperf: {error} in {item.nodeid} ({call.when}); the device no longer works (probe: "
                       f"{problem}), so the worker was replaced:\n{call.excinfo.getrepr(style='short')}")
            os._exit(POISONED_EXIT)
        self.device_failed = True
        self.flush()  # the stop below ends the run: store every row measured so far
        item.session.shouldstop = (f"opperf: {error} in {item.nodeid}, and then the device no longer worked "
                                   f"(probe: {problem}); stopping, rows measured so far are stored (run with "
                                   f"-n 1 to replace the process and go on)")

    def _note(self, text: str) -> None:
        self.crash.write(text + "\n")
        self.crash.flush()
