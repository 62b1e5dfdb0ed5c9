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

    The named spec must run on what this machine has; a detected device without a spec gets a
    bare one named after it (rows are stored, MFU/MBU stay empty) and a warning.
    """
    try:
        specs = hardware.load_specs(hardware_file)
    except hardware.SpecError as exc:
        raise hardware.SpecError(f"{hardware_flag.split('=')[0]}: {exc}") from None
    acc = hardware.detect_accelerator()
    spec, warnings = (_named(specs, acc, name, flag, hardware_flag) if name
                      else _detected(specs, acc, hardware_flag))
    return DeviceContext(spec, acc, _torch_device(spec, acc), warnings)


def check_name(name: Optional[str], hardware_file: Optional[Path]) -> None:
    """What resolve() can say without the device (torch): the specs file reads, and `name`, if
    given, names a spec. An xdist controller checks this before its workers start."""
    try:
        specs = hardware.load_specs(hardware_file)
    except hardware.SpecError as exc:
        raise hardware.SpecError(f"--opperf-hardware: {exc}") from None
    if name:
        _spec_named(specs, name, "--device", "--opperf-hardware=FILE")


def _spec_named(specs: dict, name: str, flag: str, hardware_flag: str) -> hardware.HardwareSpec:
    known = ", ".join(sorted(specs))
    if not hardware.valid_name(name.lower()):
        raise hardware.SpecError(f"{flag}={name}: a device name is lower-case letters, digits, '.', '_' and '-' "
                                 f"(it names results/<device>.db); known: {known}")
    spec = specs.get(name.lower()) or hardware.resolve_alias(specs, name)
    if spec is None:
        raise hardware.SpecError(f"{flag}={name}: unknown device; known: {known} (add your own with {hardware_flag})")
    return spec


def _named(specs: dict, acc: hardware.Accelerator, name: str, flag: str, hardware_flag: str) -> tuple:
    spec = _spec_named(specs, name, flag, hardware_flag)
    if spec.backend != "cpu" and spec.backend != acc.type:
        raise hardware.SpecError(
            f"{flag}={name}: {spec.name} runs on {spec.backend}, but this machine has "
            f"{'no accelerator' if acc.type == 'cpu' else acc.type + ' (' + acc.reported_name + ')'}")
    warnings = []
    detected = hardware.resolve_alias(specs, acc.reported_name) if acc.type != "cpu" else None
    if spec.backend != "cpu" and detected is not None and detected.name != spec.name:
        warnings.append(f"{flag}={spec.name} but the device reports {acc.reported_name!r} ({detected.name}): "
                        f"MFU/MBU use {spec.name}'s peaks")
    return spec, warnings


def _detected(specs: dict, acc: hardware.Accelerator, hardware_flag: str) -> tuple:
    if acc.type == "cpu":
        return specs["cpu"], []
    spec = hardware.resolve_alias(specs, acc.reported_name)
    if spec is not None:
        return spec, []
    spec = hardware.HardwareSpec(hardware.slug(acc.reported_name), title=acc.reported_name, backend=acc.type)
    return spec, [f"no hardware spec for {acc.reported_name!r}: rows go to {spec.name}.db without MFU/MBU; "
                  f"add a spec with {hardware_flag}"]


def _torch_device(spec: hardware.HardwareSpec, acc: hardware.Accelerator):
    import torch

    if spec.backend == "cpu":
        return torch.device("cpu")
    return torch.device(acc.type, torch.accelerator.current_device_index())
