"""Contention: did something else compete for the machine while a case was measured?

A row measured while other processes took the cores its threads needed, or while another
process computed on its GPU, times the neighbours as much as the kernel. The probe reads, before
and after a case's measurement (warm-up, sampling, the check of one timed call):

- the CPU time other processes took on the CPUs this process may run on: busy time of those
  CPUs in /proc/stat (steal included: a VM's host ran someone else) minus this process's own
  (/proc/self/stat), in core-equivalents over the window;
- how long the threads the measured work runs on waited in the run queue for a CPU (schedstat,
  nanoseconds): the delay the case itself suffered. One thread (an accelerator's launches, a CPU
  op on one intra-op thread): the calling thread's (/proc/thread-self); more: every thread of
  the process (/proc/self/task/*), since the intra-op pool's threads cannot be told apart;
- how long some runnable thread, anyone's, waited for a CPU (/proc/pressure/cpu, PSI's `some`
  total, microseconds): the machine had more runnable threads than CPUs. Precise on windows of any
  length, where /proc/stat's 10 ms ticks are not;
- on a GPU (NVML, measure/devstate.py): the other compute processes on the device, and its
  utilisation before the case (said, not judged: the previous case's work is in it).

A case is **contended** when any of these holds (docs/timing.md, "Contention"):

- others took more than the cores the case's threads left free, by more than OTHERS_SLACK of a
  core: ``others > cores - threads + 0.1`` (judged on windows of MIN_WINDOW_S or more, where
  /proc/stat's ticks resolve a tenth of a core);
- its threads waited for a CPU more than WAIT_SHARE of the window, while the CPUs were
  oversubscribed or others ran (where PSI is kept: waits alone also hold wake-up latencies);
- the CPUs were oversubscribed (some thread waited for one) more than PRESSURE_SHARE of the
  window while others took CPU time (more than OTHERS_SLACK of a core, so that this process's own
  threads cannot flag themselves): a neighbour that takes only the cores left free still shares
  the memory system and SMT siblings with the case;
- its own threads outnumber the cores (it oversubscribes the machine itself);
- another process computed on its GPU.

    probe = Probe(monitor)          # monitor: devstate.Monitor (an empty one off CUDA)
    probe.start(own_threads(device.type))
    ...                             # the case is measured
    row.update(probe.stop())        # {"contended": 0 or 1, "contention": "cpu: others 0.04 of 2 cores ..."}

Where /proc cannot be read (not Linux) and no GPU reading exists, both columns are NULL.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

OTHERS_SLACK = 0.1  # cores: others may take this much of the cores the case needs (daemons, tick rounding)
WAIT_SHARE = 0.1  # of the window: the case's threads may wait this long for a CPU
PRESSURE_SHARE = 0.1  # of the window: runnable threads may wait for a CPU this long (PSI `some`)
MIN_WINDOW_S = 0.1  # shorter windows hold too few clock ticks to judge others' share of the CPUs
BUSY_WINDOW_S = 0.1  # how long busy_cores() watches the machine at the start of a run
PROC = Path("/proc")


@dataclass
class CpuReading:
    """One look at the CPUs: clock ticks of the allowed CPUs and of this process, threads' waits."""

    wall_s: float
    busy_ticks: int  # busy ticks of the CPUs this process may run on (user, nice, system, irq, softirq, steal)
    total_ticks: int  # busy and idle ticks of those CPUs
    own_ticks: int  # this process's user and system ticks (every thread)
    waits_ns: dict = field(default_factory=dict)  # thread id -> its run-queue wait so far (None: no schedstat)
    pressure_us: Optional[int] = None  # PSI: microseconds some runnable thread waited for a CPU (None: no PSI)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity); every CPU where affinity is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def read_cpu(cpus: list[int], proc: Path = PROC, calling_thread: bool = False) -> Optional[CpuReading]:
    """A CpuReading of the given CPUs, or None where /proc cannot be read (not Linux).
    calling_thread: the waits of the calling thread alone, not of every thread of the process
    (a process on a GPU has dozens)."""
    try:
        stat = _read(proc / "stat")
        own = _read(proc / "self" / "stat")
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            # user nice system idle iowait irq softirq steal (guest time is inside user already)
            v = [int(x) for x in rest.split()[:8]]
            v += [0] * (8 - len(v))
            busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            total += sum(v)
    fields = stat_fields(own)
    own_ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    waits = _thread_wait(proc) if calling_thread else _waits(proc)
    return CpuReading(time.monotonic(), busy, total, own_ticks, waits, _pressure_us(proc))


def stat_fields(text: str) -> list[str]:
    """A /proc/<pid>/stat line's fields after the command name (which may hold spaces and parentheses):
    the process state first, then the parent's pid, ... (field 3 of proc(5) on).

    >>> stat_fields("42 (py thon) S 7 42")
    ['S', '7', '42']
    """
    return text.rsplit(")", 1)[-1].split()


def _read(path: Path) -> str:
    """A small /proc file's text, read in one system call (pathlib's read_text costs several)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


def _pressure_us(proc: Path) -> Optional[int]:
    """PSI's `some` total for the CPU (Linux 4.20+, CONFIG_PSI): microseconds during which some runnable
    thread waited for a CPU; None where the kernel does not keep it."""
    try:
        first = _read(proc / "pressure" / "cpu").splitlines()[0].split()
    except (OSError, IndexError):
        return None
    for item in first[1:] if first and first[0] == "some" else ():
        key, _, value = item.partition("=")
        if key == "total" and value.isdigit():
            return int(value)
    return None


def _waits(proc: Path) -> dict:
    """Thread id -> nanoseconds it waited on a run queue (schedstat's second field); {} without schedstat."""
    waits = {}
    try:
        tids = os.listdir(proc / "self" / "task")
    except OSError:
        return {}
    for tid in tids:
        try:
            waits[tid] = int(_read(proc / "self" / "task" / tid / "schedstat").split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile, or no schedstat in this kernel
    return waits


def _thread_wait(proc: Path) -> dict:
    """{"self": nanoseconds the calling thread waited on a run queue}; {} without schedstat."""
    try:
        return {"self": int(_read(proc / "thread-self" / "schedstat").split()[1])}
    except (OSError, IndexError, ValueError):
        return {}


def cpu_seen(before: CpuReading, after: CpuReading, threads: int, cores: int, tick_hz: int) -> tuple[bool, str]:
    """(contended, what was seen) between two readings of `cores` CPUs, with `threads` threads of ours.

    >>> a = CpuReading(0.0, 0, 0, 0, {"1": 0}, 0)
    >>> b = CpuReading(0.5, 90, 100, 25, {"1": 150_000_000}, 250_000)   # 65 ticks not ours in 0.5 s at 100 Hz: 1.3 cores
    >>> cpu_seen(a, b, threads=1, cores=2, tick_hz=100)
    (True, 'cpu: others took 1.30 of 2 cores (1 free beside 1 thread); our threads waited 30% of 0.50 s; CPUs oversubscribed 50% of the time')
    """
    window = max(after.wall_s - before.wall_s, 1e-9)
    seen, contended = [], False
    free = max(cores - threads, 0)
    if threads > cores:
        contended = True
        seen.append(f"{threads} threads oversubscribe {cores} cores")
    others = max(after.busy_ticks - before.busy_ticks - (after.own_ticks - before.own_ticks), 0) / tick_hz / window
    others = min(others, cores)  # ticks counted at a window's edges can read past the whole machine
    text = f"others took {others:.2f} of {cores} cores ({free} free beside {threads} thread{'s' if threads > 1 else ''})"
    if window >= MIN_WINDOW_S:
        contended = contended or others > free + OTHERS_SLACK
    else:
        text += f" [{window:.2f} s window: ticks too coarse to judge]"
    seen.append(text)
    pressure = None
    if before.pressure_us is not None and after.pressure_us is not None:
        pressure = min(max(after.pressure_us - before.pressure_us, 0) / 1e6 / window, 1.0)
    if before.waits_ns and after.waits_ns:
        waited = sum(w - before.waits_ns.get(tid, 0) for tid, w in after.waits_ns.items()) / 1e9 / window
        # Summed over every thread of ours, waits include each wake-up's scheduling latency, which
        # many threads waking on idle CPUs add up. They count where PSI, if kept, saw the CPUs
        # oversubscribed or others ran.
        crowded = pressure is None or pressure > PRESSURE_SHARE or others > OTHERS_SLACK
        contended = contended or (waited > WAIT_SHARE and crowded)
        seen.append(f"our threads waited {waited:.0%} of {window:.2f} s")
    if pressure is not None:
        # Others' share, tick-coarse on short windows, only tells a neighbour from this process's own threads.
        contended = contended or (pressure > PRESSURE_SHARE and others > OTHERS_SLACK)
        seen.append(f"CPUs oversubscribed {pressure:.0%} of the time")
    return contended, "cpu: " + "; ".join(seen)


def other_processes(pids: Optional[list], mine: Optional[set] = None) -> Optional[list]:
    """The pids on a GPU that are neither this process nor its parent (an xdist controller that
    calibrated holds a context); None when unknown.

    In a container NVML lists the host's pids, where this process has another: when neither pid
    is listed, one of the listed processes is taken to be this one (it holds a context).

    >>> other_processes([10, 42], mine={42, 7}), other_processes([900], mine={42}), other_processes([901, 902], mine={42})
    ([10], [], [902])
    """
    if pids is None:
        return None
    mine = {os.getpid(), os.getppid()} if mine is None else mine
    if mine & set(pids):
        return [p for p in pids if p not in mine]
    return sorted(pids)[1:]


class Probe:
    """Contention around one case: start() before it is measured, stop() after; stop() gives the columns."""

    def __init__(self, monitor=None, proc: Path = PROC, cpus: Optional[list] = None):
        self.monitor = monitor  # devstate.Monitor: an empty one reads no GPU
        self.proc = proc
        self.cpus = allowed_cpus() if cpus is None else cpus
        self.tick_hz = _tick_hz()
        self.threads = 1
        self._cpu: Optional[CpuReading] = None
        self._gpu: Optional[list] = None
        self._util: Optional[int] = None

    def start(self, threads: int) -> None:
        """threads: the measured work's own (own_threads())."""
        self.threads = threads
        self._gpu, self._util = self._gpu_others(), None
        if self.monitor is not None and self.monitor.handle is not None:
            self._util = self.monitor.utilization()
        self._cpu = read_cpu(self.cpus, self.proc, calling_thread=threads == 1)

    def stop(self) -> dict:
        """{"contended": 0/1, "contention": what was seen}; both None when nothing could be read."""
        after = read_cpu(self.cpus, self.proc, calling_thread=self.threads == 1)
        gpu_after = self._gpu_others()
        contended, seen = False, []
        if self._cpu is not None and after is not None:
            busy, text = cpu_seen(self._cpu, after, self.threads, len(self.cpus), self.tick_hz)
            contended, seen = busy, [text]
        if self._gpu is not None or gpu_after is not None:
            others = sorted(set(self._gpu or []) | set(gpu_after or []))
            contended = contended or bool(others)
            text = (f"gpu: {len(others)} other process{'es' if len(others) > 1 else ''} (pid "
                    f"{', '.join(map(str, others[:5]))})" if others else "gpu: no other process")
            if self._util is not None:
                text += f", utilisation {self._util}% before the case"
            seen.append(text)
        if not seen:
            return {"contended": None, "contention": None}
        return {"contended": int(contended), "contention": "; ".join(seen)}

    def _gpu_others(self) -> Optional[list]:
        if self.monitor is None or self.monitor.handle is None:
            return None
        return other_processes(self.monitor.compute_pids())


def own_threads(device_type: str) -> int:
    """The threads measured work runs on: torch's intra-op threads on a CPU, one host thread launching
    an accelerator's kernels."""
    import torch

    return torch.get_num_threads() if device_type == "cpu" else 1


def busy_cores(window_s: float = BUSY_WINDOW_S, proc: Path = PROC, cpus: Optional[list] = None) -> Optional[float]:
    """Core-equivalents that other processes kept busy over the next window_s seconds (this one sleeps);
    None without /proc."""
    cpus = allowed_cpus() if cpus is None else cpus
    before = read_cpu(cpus, proc)
    if before is None:
        return None
    time.sleep(window_s)
    after = read_cpu(cpus, proc)
    window = max(after.wall_s - before.wall_s, 1e-9)
    others = after.busy_ticks - before.busy_ticks - (after.own_ticks - before.own_ticks)
    return max(others, 0) / _tick_hz() / window


def free_threads(cores: int, busy: Optional[float], current: int, workers: int = 1) -> int:
    """Intra-op threads for a run: at most `current` (torch's, or the user's), at most the cores left
    free by the busy ones (rounded), shared among `workers` processes; at least one.

    >>> free_threads(8, 0.05, 8), free_threads(8, 2.6, 8), free_threads(2, 2.4, 2), free_threads(8, 0.0, 8, workers=3)
    (8, 5, 1, 2)
    """
    free = cores - round(busy or 0.0)
    return max(1, min(current, free // max(workers, 1)))


def _tick_hz() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100
