"""Per-case guards in the process that runs the cases: timeout, out-of-memory, poisoned device.

Out of memory (torch.OutOfMemoryError): the case fails with torch's message; once its
report and teardown are done, the memory it held is released (the failure's traceback,
which pytest keeps in sys.last_traceback for post-mortem debugging, still references the
case's tensors) and the run goes on.

Any other accelerator error (an illegal memory access, a device-side assert, a launch
failure) may leave the CUDA context unusable for every later case in the process. Under
xdist the worker writes the error to its crash file and exits inside the case, so xdist
reports exactly that case as crashed (with the error, read back by the controller) and
starts a fresh worker on the same device. Without xdist the run stops after the case, with
the error, keeping the rows measured so far; `-n 1` isolates such cases instead.

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
from typing import Optional

import pytest

from pytest_opperf.run import xdist

POISONED_EXIT = 70  # a worker that ends itself after a poisoning accelerator error


class CaseTimeout(Exception):
    """A case ran past --opperf-timeout."""


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def is_device_error(exc: BaseException) -> bool:
    """An accelerator error other than out-of-memory: the context may be poisoned."""
    import torch

    if is_out_of_memory(exc):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("CUDA error" in text or "HIP error" in text
                                              or "device-side assert" in text)


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

    def __init__(self, config: pytest.Config, state):
        self.config = config
        self.state = state
        self.timeout_s = state.settings.timeout_s
        self.crash_path = xdist.crash_file(config)
        self.crash = None
        self.out_of_memory = False

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
                self.state.flush()  # the backstop ends the process: keep every row measured so far
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
        elif exc is not None and is_device_error(exc):
            self._poisoned(item, call)
        return (yield)

    def _poisoned(self, item: pytest.Item, call: pytest.CallInfo) -> None:
        text = (f"opperf: {type(call.excinfo.value).__name__} in {item.nodeid} ({call.when}); the device context "
                f"may be unusable, so the worker was replaced:\n{call.excinfo.getrepr(style='short')}")
        if self.crash is not None:
            # Exit inside the case, before its report: xdist then reports this case (not the
            # next one it already holds) as crashed, and the controller shows this text.
            self._note(text)
            os._exit(POISONED_EXIT)
        item.session.shouldstop = (f"opperf: {type(call.excinfo.value).__name__} in {item.nodeid} may have left the "
                                   f"device unusable; stopping (run with -n 1 to replace the process and go on)")

    def _note(self, text: str) -> None:
        self.crash.write(text + "\n")
        self.crash.flush()

