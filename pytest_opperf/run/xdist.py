"""pytest-xdist: one worker per GPU, crash reports that say why, and where each row ran.

Pinning. The controller decides which device a worker owns before the worker starts: it
rewrites xdist's ``popen`` specs into ``popen//env:CUDA_VISIBLE_DEVICES=<entry>``, and
execnet sets the variable in the new interpreter before pytest, conftest.py or torch are
imported there. Setting it later, in the worker's pytest_configure, would be too late for a
conftest that already asked torch.cuda for its devices (the driver reads the variable once);
torch.cuda.set_device would leave code that says "cuda:0" on GPU 0. Pinning by worker id
(gwN -> N % GPUs) breaks on the first crash: xdist names the replacement of gw0 gw2, so on
two GPUs it would land next to gw0's neighbour. A replacement reuses its predecessor's spec,
so here it takes over the same GPU. With CUDA_VISIBLE_DEVICES already set, workers index
into the user's list. Other accelerators get OPPERF_DEVICE_INDEX, applied with
torch.accelerator.set_device_index before the session touches the device.

Crash reports. Each worker writes what it knows when it dies (faulthandler's traceback of a
segfault or a timeout, the error that poisoned its CUDA context) to a file per worker in a
directory the controller owns; when xdist reports "worker crashed while running X", the
controller appends that file to the report.

Exit. A worker whose session is over has handed everything to the controller (its reports, then
its output with the session's end), and the controller waits for its process to end before it
prints the summary. The interpreter's finalization after that (tearing down torch's modules, the
CUDA context, the profiler) is work nobody reads: the worker runs its atexit handlers, as any
exit does, and ends there (exit_without_finalizing).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

HOST_DEVICES = pytest.StashKey[tuple]()  # controller: (variable, entries) the workers were pinned from
INDEX_VARIABLE = "OPPERF_DEVICE_INDEX"  # accelerators without a visibility variable
CRASH_DIR_KEY = "opperf_crash_dir"  # in workerinput
HOST_DEVICES_KEY = "opperf_host_devices"  # in workerinput: (visibility variable, every entry of the host)


def visibility_variable(device_type: str) -> str:
    """The environment variable that restricts which devices a process sees."""
    if device_type == "cuda":
        import torch

        return "HIP_VISIBLE_DEVICES" if getattr(torch.version, "hip", None) else "CUDA_VISIBLE_DEVICES"
    return INDEX_VARIABLE


def visible_entries(variable: str, count: int) -> list[str]:
    """The devices this process may use, as the variable names them ('0', '3', 'GPU-<uuid>', ...).

    >>> visible_entries("OPPERF_TEST_UNSET", 2)
    ['0', '1']
    """
    raw = os.environ.get(variable) if variable != INDEX_VARIABLE else None
    if raw is None:
        return [str(i) for i in range(count)]
    return [e.strip() for e in raw.split(",") if e.strip()][:count]


def worker_specs(workers: int, variable: str, entries: list[str]) -> list[str]:
    """xdist tx specs: worker i owns entry i modulo the number of devices.

    >>> worker_specs(3, "CUDA_VISIBLE_DEVICES", ["2", "5"])
    ['popen//env:CUDA_VISIBLE_DEVICES=2', 'popen//env:CUDA_VISIBLE_DEVICES=5', 'popen//env:CUDA_VISIBLE_DEVICES=2']
    """
    if variable == INDEX_VARIABLE:
        entries = [str(i) for i in range(len(entries))]
    return [f"popen//env:{variable}={entries[i % len(entries)]}" for i in range(workers)]


def pin_workers(config: pytest.Config) -> Optional[str]:
    """Controller, after xdist turned -n into specs: give each worker its device. Returns a header line."""
    workers = getattr(config.option, "numprocesses", None)
    specs = getattr(config.option, "tx", None)
    if not workers or not specs or any(spec != "popen" for spec in specs):
        return None  # no xdist, or the user wrote their own --tx specs
    devices = _devices(config)
    if devices is None:
        return None
    device_type, variable, count = devices
    entries = visible_entries(variable, count)
    if not entries:
        return None  # the variable hides every device: the workers run where torch puts them
    config.option.tx = worker_specs(len(specs), variable, entries)
    if hasattr(config, "stash"):  # the workers' collective cases start ranks on every entry
        config.stash[HOST_DEVICES] = (variable, entries)
    line = f"opperf: {len(specs)} workers on {len(entries)} {device_type} devices: {variable}=" + \
        " | ".join(spec.rsplit("=", 1)[1] for spec in config.option.tx)
    if len(specs) > len(entries):
        line += " (warning: workers share devices, so their timings interfere)"
    return line


def auto_workers(config: pytest.Config) -> Optional[int]:
    """-n auto: one worker per visible accelerator; None on a CPU (xdist then counts cores)."""
    devices = _devices(config)
    if devices is None:
        return None
    device_type, variable, count = devices
    return len(visible_entries(variable, count)) or None


def _devices(config: pytest.Config) -> Optional[tuple[str, str, int]]:
    """(type, visibility variable, count) of the accelerator this run's workers measure on, or
    None: none here, or --device=cpu (the workers then run on the cores, whatever GPUs the host has).

    NVIDIA GPUs are counted through the driver's NVML, without importing torch: the controller
    starts its workers before its own torch import and device work (run/session.py), which then
    run beside their start-up. Other accelerators are asked through torch."""
    from pytest_opperf.hardware.specs import detect_accelerator, nvidia_device_count
    from pytest_opperf.run.options import raw_value

    if raw_value(config, "opperf_device").strip().lower() == "cpu":
        return None
    count = nvidia_device_count()
    if count:
        return "cuda", "CUDA_VISIBLE_DEVICES", count
    acc = detect_accelerator()
    if acc.type == "cpu" or acc.count < 1:
        return None
    return acc.type, visibility_variable(acc.type), acc.count


def host_devices(config: pytest.Config) -> Optional[tuple[str, list[str]]]:
    """Worker: (variable, entries) of every device of the host, where the controller pinned this
    worker to one and told it the others (the rank processes of a collective case need them all);
    None elsewhere."""
    given = getattr(config, "workerinput", {}).get(HOST_DEVICES_KEY)
    return (given[0], list(given[1])) if given else None


def pin_this_worker(config: pytest.Config) -> None:
    """Worker, before the session opens its device: accelerators without a visibility variable."""
    index = os.environ.get(INDEX_VARIABLE)
    if index is None or not hasattr(config, "workerinput"):
        return
    import torch

    torch.accelerator.set_device_index(int(index))


def placement(config: pytest.Config, device) -> dict:
    """Where this process's rows run: xdist worker id, physical GPU index and UUID (None where unknown)."""
    worker = config.workerinput["workerid"] if hasattr(config, "workerinput") else None
    if device.type == "cpu":
        return {"worker": worker, "gpu": None, "gpu_uuid": None}
    import torch

    index = device.index if device.index is not None else torch.accelerator.current_device_index()
    gpu: Optional[int] = index
    variable = visibility_variable(device.type)
    if variable != INDEX_VARIABLE and os.environ.get(variable) is not None:
        entries = visible_entries(variable, index + 1)
        gpu = int(entries[index]) if index < len(entries) and entries[index].isdigit() else None
    return {"worker": worker, "gpu": gpu, "gpu_uuid": _uuid(device.type, index)}


def _uuid(device_type: str, index: int) -> Optional[str]:
    if device_type != "cuda":
        return None
    import torch

    try:
        text = str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):
        return None
    if not getattr(torch.version, "hip", None) and not text.startswith("GPU-"):
        text = "GPU-" + text  # as nvidia-smi and CUDA_VISIBLE_DEVICES spell it
    return text


def crash_file(config: pytest.Config) -> Optional[Path]:
    """Worker: the file the controller reads when this worker dies (None outside xdist)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or CRASH_DIR_KEY not in workerinput:
        return None
    return Path(workerinput[CRASH_DIR_KEY]) / f"{workerinput['workerid']}.txt"


def status_file(config: pytest.Config) -> Optional[Path]:
    """Worker: the file its running case's phase goes to, for the controller's progress line."""
    crash = crash_file(config)
    return None if crash is None else crash.with_name(crash.stem + ".phase.json")


def workers_dir(config: pytest.Config) -> Optional[Path]:
    """Controller: the directory of the workers' crash and phase files (None without xdist)."""
    plugin = config.pluginmanager.get_plugin("opperf-crash-reports")
    return getattr(plugin, "dir", None)


class CrashReports:
    """Controller hooks: hand each worker its crash file, and read it into the crash report."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.dir = Path(tempfile.mkdtemp(prefix="opperf-workers-"))

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[CRASH_DIR_KEY] = str(self.dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched) -> None:
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        path = self.dir / f"{worker}.txt"
        text = path.read_text(errors="replace").strip() if worker and path.is_file() else ""
        if text.startswith("Timeout ("):  # faulthandler's words when --opperf-timeout ended the worker
            text = "opperf: the case ran past --opperf-timeout and its worker was stopped; it was here:\n" + text
        if text:
            report.longrepr = f"{report.longrepr}\n{text}"
        self._refund_restart()

    def _refund_restart(self) -> None:
        # xdist stops replacing workers after --max-worker-restart crashes (default 4 per worker),
        # a guard against workers that die while collecting. A crash inside a case costs that
        # case only, so unless the user set a limit, it does not count against the guard: a sweep
        # with many crashing cases runs to the end. _failed_nodes_count is xdist's counter
        # (3.5-3.8); without it, xdist's default stands.
        if self.config.option.maxworkerrestart is not None:
            return
        dsession = self.config.pluginmanager.getplugin("dsession")
        if isinstance(getattr(dsession, "_failed_nodes_count", None), int):
            dsession._failed_nodes_count -= 1

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def stop_workers(config: pytest.Config) -> None:
    """Controller: end the workers xdist started (the session failed to open after it started them)."""
    dsession = config.pluginmanager.getplugin("dsession")
    if dsession is not None:
        dsession.pytest_sessionfinish()  # xdist's own end: its workers are told to exit and waited for


def exit_without_finalizing() -> None:
    """Worker, at its session's end: once the interpreter starts to exit, run every atexit handler
    (logging's flush, coverage's save, a user's), flush stdout and stderr, and end the process
    there, without the interpreter's finalization, which the controller would wait for."""

    def end() -> None:
        atexit.unregister(end)
        atexit._run_exitfuncs()  # the handlers registered before this one: what a normal exit runs next
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(0)

    atexit.register(end)  # the last registered runs first


def is_distributed(config: pytest.Config) -> bool:
    """This process is an xdist controller with workers."""
    return getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
