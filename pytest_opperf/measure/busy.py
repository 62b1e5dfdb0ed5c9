"""Was the machine busy with other work during a stretch of time? For measurements that set a
reference for others (the calibration's ceilings): a ceiling measured beside other work is low,
and every row held against it then reads above 100%.

On the host: the CPU time all processes took (/proc/stat) less this process's own
(/proc/self/stat), over the machine's CPU time in the stretch. On a GPU (NVML): other processes
holding a context on it, and its utilisation when the stretch began (this process idle then).

>>> watch = BusyWatch(proc=Path("/nonexistent"))
>>> watch.start(); watch.stop() is None      # nothing readable: nothing to report
True
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

OTHERS_CPU_SHARE = 0.10  # others' share of the machine's CPU time above which it was busy
GPU_BUSY_PERCENT = 10  # GPU utilisation (NVML, percent) at the start above which it was busy


class BusyWatch:
    """start(), then stop(): what else ran in between, in words, or None when the machine was quiet."""

    def __init__(self, monitor: Any = None, proc: Path = Path("/proc"), cpus: Optional[int] = None):
        self.monitor = monitor  # a devstate.Monitor (its nvml and handle), or None: host only
        self.proc = proc
        self.cpus = cpus or os.cpu_count() or 1
        self._start: Optional[tuple] = None
        self._gpu_start: list[str] = []

    def start(self) -> None:
        self._start = (time.perf_counter(), _machine_ticks(self.proc), _own_ticks(self.proc))
        self._gpu_start = self._gpu_busy()

    def stop(self) -> Optional[str]:
        seen = list(self._gpu_start)
        if self._start is not None:
            t0, machine0, own0 = self._start
            machine1, own1 = _machine_ticks(self.proc), _own_ticks(self.proc)
            wall = time.perf_counter() - t0
            if None not in (machine0, own0, machine1, own1) and wall > 0:
                others_s = max((machine1 - machine0) - (own1 - own0), 0) / _tick_hz()
                share = others_s / (wall * self.cpus)
                if share > OTHERS_CPU_SHARE:
                    seen.append(f"other processes took {share:.0%} of the {self.cpus} CPUs' time")
        seen += [s for s in self._gpu_others() if s not in seen]
        return "; ".join(seen) or None

    def _gpu_busy(self) -> list[str]:
        nv, h = _nvml(self.monitor)
        if h is None:
            return []
        util = _try(nv.nvmlDeviceGetUtilizationRates, h)
        gpu = getattr(util, "gpu", None)
        return [f"GPU {gpu}% busy at the start"] if gpu is not None and gpu > GPU_BUSY_PERCENT else []

    def _gpu_others(self) -> list[str]:
        nv, h = _nvml(self.monitor)
        if h is None:
            return []
        procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
        others = sorted({p.pid for p in procs if getattr(p, "pid", os.getpid()) != os.getpid()})
        return [f"other processes on the GPU (pids {', '.join(map(str, others))})"] if others else []


def _nvml(monitor) -> tuple:
    if monitor is None or getattr(monitor, "handle", None) is None:
        return None, None
    return monitor.nvml, monitor.handle


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # a reading the GPU or driver does not give
        return None


def _machine_ticks(proc: Path) -> Optional[int]:
    """Busy clock ticks of all CPUs since boot: user, nice, system, irq, softirq and steal (another
    guest's time on a VM's cores) from /proc/stat's first line; None where unreadable."""
    try:
        fields = (proc / "stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError, IndexError):
        return None
    return user + nice + system + irq + softirq + steal


def _own_ticks(proc: Path) -> Optional[int]:
    """This process's user and system clock ticks, all its threads (/proc/self/stat fields 14, 15)."""
    try:
        after_name = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
        return int(after_name[11]) + int(after_name[12])
    except (OSError, ValueError, IndexError):
        return None


def _tick_hz() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100
