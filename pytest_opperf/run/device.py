"""The device a run measures on: its hardware spec, the torch device, and the per-process helpers
that read it (device-state monitor, clock warm-up, memory budget).

A sweep (run/session.py) and `opperf calibrate` (run/calibration.py) resolve it the same way:

    >>> ctx = resolve(None, None)          # the detected device; on a machine without one:
    >>> ctx.spec.name, ctx.torch.type      # doctest: +SKIP
    ('cpu', 'cpu')

A problem with the name or the specs file is a SpecError whose message names the option
(`flag` and `hardware_flag`, so each caller's message uses its own spelling).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pytest_opperf.hardware import specs as hardware
from pytest_opperf.measure import budget, clocks, contention, devstate


@dataclass
class DeviceContext:
    spec: hardware.HardwareSpec  # peaks, bandwidth: --device=NAME or the detected device's spec
    accelerator: hardware.Accelerator  # what this machine has, as the driver names it
    torch: Any  # torch.device the cases run on
    warnings: list = field(default_factory=list)  # said in the header: a spec that does not match, none found
    _monitor: Optional[devstate.Monitor] = None
    _warmer: Optional[clocks.ClockWarmer] = None
    _budget: Optional[tuple] = None
    _probe: Optional[contention.Probe] = None

    @property
    def type(self) -> str:
        return self.torch.type

    @property
    def capability(self) -> tuple:
        """CUDA compute capability, (0, 0) elsewhere: what backends' `unsupported` checks read."""
        if self.torch.type != "cuda":
            return (0, 0)
        import torch

        return torch.cuda.get_device_capability(self.torch)

    def cache_bytes(self) -> Optional[int]:
        """The last-level cache a cold measurement must clear: the GPU's L2, or the spec's figure."""
        if self.torch.type == "cuda":
            import torch

            return torch.cuda.get_device_properties(self.torch).L2_cache_size
        return int(self.spec.l2_mbytes * 1e6) if self.spec.l2_mbytes else None

    def monitor(self) -> devstate.Monitor:
        """This process's device-state monitor (NVML), opened on first use."""
        if self._monitor is None:
            self._monitor = devstate.open_monitor(self.torch)
        return self._monitor

    def contention_probe(self) -> contention.Probe:
        """This process's contention probe (the CPUs it may use; its GPU through the monitor)."""
        if self._probe is None:
            self._probe = contention.Probe(self.monitor())
        return self._probe

    def clock_warmer(self, settings) -> clocks.ClockWarmer:
        """This process's clock warm-up (--opperf-clock-warmup), made on first use."""
        if self._warmer is None:
            self._warmer = clocks.open_warmer(settings, self.torch, self.monitor())
        return self._warmer

    def memory_budget(self, settings) -> tuple[Optional[float], str]:
        """(bytes a case may use or None, where the number comes from); read once, at first use."""
        if self._budget is None:
            self._budget = budget.device_budget(settings, self.torch)
        return self._budget


def resolve(name: Optional[str], hardware_file: Optional[Path], flag: str = "--device",
            hardware_flag: str = "--opperf-hardware=FILE") -> DeviceContext:
    """The device of `--device=NAME` (a spec name or alias), or the detected one without a name.

    hardware.resolve_device picks the spec; this adds the torch device the cases run on.
    """
    spec, acc, warnings = hardware.resolve_device(name, hardware_file, flag, hardware_flag)
    return DeviceContext(spec, acc, _torch_device(spec, acc), warnings)


def check_name(name: Optional[str], hardware_file: Optional[Path]) -> None:
    """What resolve() can say without the device (torch): the specs file reads, and `name`, if
    given, names a spec. An xdist controller checks this before its workers start."""
    try:
        specs = hardware.load_specs(hardware_file)
    except hardware.SpecError as exc:
        raise hardware.SpecError(f"--opperf-hardware: {exc}") from None
    if name:
        hardware.spec_named(specs, name, "--device", "--opperf-hardware=FILE")


def _torch_device(spec: hardware.HardwareSpec, acc: hardware.Accelerator):
    import torch

    if spec.backend == "cpu":
        return torch.device("cpu")
    return torch.device(acc.type, torch.accelerator.current_device_index())
