"""The process and the machine around the cases: how busy the machine is at the start, torch's
intra-op threads, one Triton cache directory for the sweep, the profiler's start, and the heap
the garbage collector leaves alone.

    machine = Machine(settings, device, workers=2)
    machine.look()                         # the controller, before workers start
    machine.warm_backends(backends)        # each process that runs cases, once it has them: in a thread
    machine.before_first_case()            # each process that runs cases
    machine.warmed()                       # before each kernel case (at once after the first)
    freeze_heap()                          # every process of a sweep, once it has its cases
    thaw_heap()                            # at the session's very end
"""

from __future__ import annotations

import gc
import importlib
import os
import threading
from typing import Callable, Optional

from pytest_opperf.measure import contention, timers
from pytest_opperf.run.device import DeviceContext
from pytest_opperf.run.options import Settings


class Machine:
    def __init__(self, settings: Settings, device: DeviceContext, workers: int):
        self.settings = settings
        self.device = device
        self.workers = workers  # processes sharing the CPUs: xdist workers (or torchrun ranks of this node)
        self.busy_at_start: Optional[float] = None  # cores other processes kept busy as the run began
        self.threads: Optional[int] = None  # torch's intra-op threads of the cases (set before the first)
        self.profiler_start_s: Optional[float] = None  # what the profiler's start took before the first case
        self.notes: list[str] = []  # for the summary: what went wrong before the first case
        self._warming: Optional[threading.Thread] = None  # the backends' once-a-process warm-ups (warm_backends)

    def look(self, busy_cores: Callable[[], Optional[float]] = contention.busy_cores,
             workers_started: bool = False) -> None:
        """The controller, as the session starts: how busy the machine is (`busy_cores`: an xdist
        controller reads the cores before its workers start, then looks at the GPU beside them:
        workers_started, and the processes it started are its workers, not others).
        A busy one gets a warning in the header; the runs row keeps the figure and the threads."""
        if not self.settings.contention:
            return
        self.busy_at_start = busy_cores()
        cores = len(contention.allowed_cpus())
        seen = []
        if self.busy_at_start is not None and round(self.busy_at_start) >= 1:
            threads = self.threads_for(self.busy_at_start)
            seen.append(f"other processes kept {self.busy_at_start:.1f} of {cores} cores busy"
                        + (f" (intra-op threads: {threads})" if self.device.type == "cpu" else ""))
        monitor = self.device.monitor()
        listed = monitor.compute_pids() if self.device.type != "cpu" else None
        gpu = [pid for pid in listed or [] if not _ours(pid, workers_started)]  # this process's context, or its workers'
        if gpu:
            util = monitor.utilization()
            seen.append(f"{len(gpu)} other process{'es' if len(gpu) > 1 else ''} on the GPU (pid "
                        f"{', '.join(map(str, gpu[:5]))})" + (f", utilisation {util}%" if util is not None else ""))
        if seen:
            self.device.warnings.append(f"the machine is busy at the start: {'; '.join(seen)}; rows measured under "
                                        f"contention are flagged `contended` (docs/timing.md)")

    def threads_for(self, busy: Optional[float]) -> int:
        """The intra-op threads of this run's cases: --opperf-threads, else on a CPU at most the cores
        left free by `busy`, shared among the processes (contention.free_threads); else (another device,
        --opperf-contention=off) torch's."""
        import torch

        if self.settings.threads is not None:
            return self.settings.threads
        if self.device.type != "cpu" or not self.settings.contention:
            return torch.get_num_threads()
        return contention.free_threads(len(contention.allowed_cpus()), busy, torch.get_num_threads(),
                                       max(1, self.workers))

    def run_threads(self) -> int:
        """The threads the runs row records: those set, else what this machine would set."""
        return self.threads if self.threads is not None else self.threads_for(self.busy_at_start)

    def _set_threads(self) -> None:
        import torch

        if (self.busy_at_start is None and self.settings.threads is None and self.settings.contention
                and self.device.type == "cpu"):
            self.busy_at_start = contention.busy_cores()  # a worker: its own look, its siblings included
        self.threads = self.threads_for(self.busy_at_start)
        if self.threads != torch.get_num_threads():
            torch.set_num_threads(self.threads)

    def before_first_case(self) -> None:
        """Before this process's first bench case: torch's intra-op threads (threads_for), one Triton
        cache directory for the whole sweep (pin_triton_cache), and the profiler's once-per-process
        start (timers.start_profiler). A failed start is noted in the summary and left to the first
        case's sampling, which meets it again and fails as that case."""
        self._set_threads()
        pin_triton_cache()
        try:
            self.profiler_start_s = timers.start_profiler(self.device.type, self.settings.timer)
        except Exception as exc:  # noqa: BLE001  (the cases report it)
            # In the summary: pytest's warning capture does not cover the run loop.
            self.notes.append(f"WARNING: starting the profiler before the first case failed "
                              f"({type(exc).__name__}: {exc}); the first case's sampling started it")

    def warm_backends(self, backends: list) -> None:
        """Start, in a thread, the distinct once-a-process warm-ups (Backend.warm: a compiler's own
        start) of BACKENDS, the backends this process's cases run: they overlap the rest of its start-up
        (the profiler's start, and under -n the wait for its first kernel case, which comes after the
        collective groups). The packages a warm-up names in its `imports` are imported here first, so
        that no other thread imports them meanwhile. warmed() waits for them before the first kernel
        case; a failure is noted in the summary and left to the first case that meets it again."""
        warms = list(dict.fromkeys(b.warm for b in backends if b is not None and b.warm is not None))
        if not warms or self._warming is not None:
            return
        pin_triton_cache()  # before Inductor's first kernel, which would point Triton at its own directory
        ready = []
        for warm in warms:  # its packages imported here: the thread imports only what no one else will
            try:
                for name in getattr(warm, "imports", ()):
                    importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001  (the first case that needs it meets it again)
                self._failed(warm, exc)
                continue
            ready.append(warm)
        self._warming = threading.Thread(target=self._warm, args=(ready,), name="opperf-warm", daemon=True)
        self._warming.start()

    def _warm(self, warms: list) -> None:
        for warm in warms:
            try:
                warm(self.device.torch)
            except Exception as exc:  # noqa: BLE001  (the first case that needs it meets it again)
                self._failed(warm, exc)

    def _failed(self, warm, exc: Exception) -> None:
        self.notes.append(f"WARNING: warming {getattr(warm, '__name__', warm)} before the first case failed "
                          f"({type(exc).__name__}: {str(exc).strip()[:200]}); the first case paid it")

    def warmed(self) -> None:
        """Wait for warm_backends' thread (a kernel case is timed in this process: nothing may run beside it)."""
        if self._warming is not None:
            self._warming.join()


def backends_of(items: list) -> list:
    """The registered backends of the cases among collected ITEMS, each once."""
    from pytest_opperf.case import case_of
    from pytest_opperf.catalog.registry import BACKENDS

    keys = {(case.op, case.backend) for case in map(case_of, items) if case is not None}
    return [BACKENDS[key] for key in sorted(keys) if key in BACKENDS]


def _ours(pid: int, workers_started: bool) -> bool:
    """The pid is this process or, once it started xdist workers, one it started. (A serial session's
    children are others: a test of the contention probe starts its competing GPU process itself.)"""
    if pid == os.getpid():
        return True
    if not workers_started:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(contention.stat_fields(f.read())[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def pin_triton_cache(environ: Optional[dict] = None) -> Optional[str]:
    """Set TRITON_CACHE_DIR, where it is unset, to the directory Triton uses by default; the
    directory set, or None when the variable was set already.

    Inductor points TRITON_CACHE_DIR at its own directory when it builds its first kernel of a
    process, where the variable is unset, and every Triton kernel compiled after that in the sweep
    (ours, liger's, a user's) is then looked up there and compiled again: a second compile of
    each kernel in every process. Pinned before the first case, Triton and Inductor keep one
    directory. Triton's rule for its default: $TRITON_HOME, else the home directory, then
    .triton/cache.
    """
    environ = os.environ if environ is None else environ
    if environ.get("TRITON_CACHE_DIR"):
        return None
    home = environ.get("TRITON_HOME") or os.path.expanduser("~/")
    path = os.path.join(home, ".triton", "cache")
    environ["TRITON_CACHE_DIR"] = path
    return path


def freeze_heap() -> None:
    """Leave what the process holds before its first case (torch's modules, the plugins, the
    collected cases) out of the garbage collector's full collections from now on (gc.freeze).

    Those objects live until the process ends, yet each full collection walks all of them: the
    collections of pytest's unraisable-exception check at the session's end, the interpreter's
    exit, and a full collection that falls inside a case, at that case's cost.
    The young generations are collected first, so the garbage of the start is not kept; the heap
    thaws at the session's very end (thaw_heap), for a process that goes on after pytest.main().
    """
    gc.collect(1)
    gc.freeze()


def thaw_heap() -> None:
    """The frozen objects back in the collector's care (the last of a session's cleanups)."""
    gc.unfreeze()
