"""Device state around each case: clocks, temperature, power and throttling, read through NVML.

A GPU that throttles mid-case reads slow, and the row should say so rather than pass the
slow-down off as the kernel's. Before and after each case the monitor reads the SM and
memory clocks, the temperature, the power draw and the clock-event ("throttle") reasons;
columns() turns the two readings into the row's columns.

    monitor = open_monitor(torch.device("cuda", 0))   # Monitor: NVML handle of that GPU
    before = monitor.read()
    ...                                               # the case runs
    row.update(columns(before, monitor.read()))

NVML comes from nvidia-ml-py (``import pynvml``; ``pip install pytest-opperf[nvml]``). Without
it, on a device that is not CUDA, or where NVML refuses, the monitor reads nothing and every
column is NULL: a missing reading never fails a case.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from pytest_opperf.columns import DEVICE_STATE, types

# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*; formerly *ThrottleReason*).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that hold the clocks below what the GPU would otherwise run the case at. Idle,
# the application-clocks and display settings are configuration, not a slow-down under load.
# Sync boost is counted: it holds this GPU's clocks down to the slowest of its group.
SLOWDOWN = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80

COLUMNS = types(DEVICE_STATE)


def decode(mask: Optional[int]) -> tuple[Optional[str], Optional[int]]:
    """(reason names joined by ',', throttled 0/1) for an NVML reason mask; (None, None) for None.

    >>> decode(0x1 | 0x20)
    ('gpu_idle,sw_thermal_slowdown', 1)
    >>> decode(0)
    ('', 0)
    """
    if mask is None:
        return None, None
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return ",".join(names), int(bool(mask & SLOWDOWN))


def columns(before: Optional[dict], after: Optional[dict]) -> dict:
    """The row's device-state columns from two readings (either may be None: NULL columns).

    The reasons are those seen at either reading; `throttled` is 1 when either saw a slow-down.
    """
    before, after = before or {}, after or {}
    masks = [r["reasons"] for r in (before, after) if r.get("reasons") is not None]
    mask = None
    for m in masks:
        mask = m if mask is None else mask | m
    reasons, throttled = decode(mask)
    return {
        "sm_clock_mhz_before": before.get("sm_clock_mhz"),
        "sm_clock_mhz_after": after.get("sm_clock_mhz"),
        "mem_clock_mhz": after.get("mem_clock_mhz", before.get("mem_clock_mhz")),
        "temp_c_before": before.get("temp_c"),
        "temp_c_after": after.get("temp_c"),
        "power_w_before": before.get("power_w"),
        "power_w_after": after.get("power_w"),
        "throttle_reasons": reasons,
        "throttled": throttled,
    }


class Monitor:
    """Reads one GPU's state through an NVML module (pynvml, or a stand-in with its names)."""

    def __init__(self, nvml: Any = None, handle: Any = None):
        self.nvml = nvml
        self.handle = handle

    def read(self) -> Optional[dict]:
        """One reading: sm_clock_mhz, mem_clock_mhz, temp_c, power_w, reasons (a mask); None without NVML.

        Each value is read on its own: one the GPU does not report (a MIG slice's clocks,
        say) is None, the others still count.
        """
        if self.handle is None:
            return None
        nv, h = self.nvml, self.handle
        power_mw = _try(nv.nvmlDeviceGetPowerUsage, h)
        return {
            "sm_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "temp_c": _try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "reasons": _reasons(nv, h),
        }

    def sm_clock(self) -> Optional[int]:
        """The SM clock now, in MHz; None without NVML or where the GPU does not report it."""
        if self.handle is None:
            return None
        return _try(self.nvml.nvmlDeviceGetClockInfo, self.handle, self.nvml.NVML_CLOCK_SM)

    def compute_pids(self) -> Optional[list]:
        """The pids of the processes computing on this GPU (compute and MPS clients); None without NVML."""
        if self.handle is None:
            return None
        pids = None
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
            fn = getattr(self.nvml, name, None)
            listed = _try(fn, self.handle) if fn is not None else None
            if listed is not None:
                pids = (pids or set()) | {int(p.pid) for p in listed}
        return None if pids is None else sorted(pids)

    def utilization(self) -> Optional[int]:
        """Percent of NVML's last sample period (1/6 s to 1 s) in which a kernel ran on this GPU; None without NVML."""
        if self.handle is None:
            return None
        rates = _try(self.nvml.nvmlDeviceGetUtilizationRates, self.handle)
        return None if rates is None else int(rates.gpu)

    def sm_clock_target(self) -> Optional[int]:
        """The SM clock a busy GPU is set to reach: its applications clock, else its max clock (MHz)."""
        if self.handle is None:
            return None
        for name in ("nvmlDeviceGetApplicationsClock", "nvmlDeviceGetMaxClockInfo"):
            fn = getattr(self.nvml, name, None)
            value = _try(fn, self.handle, self.nvml.NVML_CLOCK_SM) if fn is not None else None
            if value:
                return int(value)
        return None


def _reasons(nv, handle) -> Optional[int]:
    # Renamed in NVML 12.2 (driver 535); older bindings have only the throttle name.
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is not None:
            value = _try(fn, handle)
            if value is not None:
                return int(value)
    return None


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and kin: this reading is unknown, the rest stands
        return None


def open_monitor(device, nvml: Any = None) -> Monitor:
    """A Monitor for the physical GPU behind a torch device; an empty one when NVML cannot tell.

    The handle is found by the device's UUID (so CUDA_VISIBLE_DEVICES remapping cannot
    point it at another GPU), else by the physical index that CUDA_VISIBLE_DEVICES names.
    `nvml` replaces the pynvml module (tests pass a fake).
    """
    if device.type != "cuda":
        return Monitor()
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return Monitor()
    try:
        nvml.nvmlInit()
    except Exception:  # no driver library, or a ROCm build: no readings
        return Monitor()
    handle = _handle(nvml, device)
    return Monitor(nvml, handle) if handle is not None else Monitor()


def _handle(nvml, device):
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if uuid:
        bare = uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid
        for candidate in (uuid, f"GPU-{bare}", f"MIG-{bare}"):
            handle = _try(nvml.nvmlDeviceGetHandleByUUID, candidate)
            if handle is not None:
                return handle
    return _try(nvml.nvmlDeviceGetHandleByIndex, physical_index(index))


def physical_index(index: int, visible: Optional[str] = None) -> int:
    """The NVML index of the index-th visible CUDA device, from CUDA_VISIBLE_DEVICES.

    >>> physical_index(1, "2,3")
    3
    >>> physical_index(0, "GPU-8d4c...")   # UUIDs: no index to map; the caller tried the UUID first
    0
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if not visible:
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index < len(entries) and entries[index].isdigit():
        return int(entries[index])
    return index
