"""Hardware specs (peaks from data/hardware.yaml, each with its source) and device detection.

>>> spec = load_specs()["h100"]
>>> spec.peak_flops("bf16", "matrix") > 9e14
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf import files

DATA_FILE = Path(__file__).parent / "data" / "hardware.yaml"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class HardwareSpec:
    name: str  # the key: --device=NAME and results/NAME.db
    title: str = ""
    backend: str = "cpu"  # torch device type it runs on
    aliases: tuple = ()
    matrix_tflops: dict = field(default_factory=dict)
    vector_tflops: dict = field(default_factory=dict)
    mem_bw_gbytes_per_s: Optional[float] = None
    mem_gbytes: Optional[float] = None
    l2_mbytes: Optional[float] = None
    source: str = ""
    # One direction of the device's scale-up links (NVLink, Infinity Fabric, HCCS), in GB/s: the
    # peak a collective's busbw is compared with.
    link_gbytes_per_s: Optional[float] = None

    def peak_flops(self, dtype: str, kind: str = "matrix") -> Optional[float]:
        """Dense peak in FLOP/s for dtype on the matrix or vector units, or None if unknown."""
        table = self.matrix_tflops if kind == "matrix" else self.vector_tflops
        value = table.get(dtype)
        return None if value is None else float(value) * 1e12

    @property
    def mem_bw_bytes_per_s(self) -> Optional[float]:
        return None if self.mem_bw_gbytes_per_s is None else float(self.mem_bw_gbytes_per_s) * 1e9


class SpecError(Exception):
    pass


def valid_name(name: str) -> bool:
    """A device name is also a file name under results/: no separators, no dots first."""
    return bool(_NAME.match(name)) and ".." not in name


def load_specs(extra: Optional[Path] = None) -> dict[str, HardwareSpec]:
    """The built-in specs, plus (overriding) those of a user file in the same format."""
    specs = _read(DATA_FILE)
    if extra is not None:
        specs.update(_read(Path(extra)))
    return specs


def _read(path: Path) -> dict[str, HardwareSpec]:
    try:
        raw = files.load_yaml(path)
    except files.FileError as exc:
        raise SpecError(f"{path}: cannot read hardware specs: {exc.reason}") from None
    devices = raw.get("devices") if isinstance(raw, dict) else None
    if not isinstance(devices, dict):
        raise SpecError(f"{path}: expected a top-level 'devices:' mapping of name -> spec")
    out = {}
    known = {f for f in HardwareSpec.__dataclass_fields__} - {"title"} | {"notes"}
    for name, body in devices.items():
        name = str(name).lower()
        if not valid_name(name):
            raise SpecError(f"{path}: devices.{name}: a device name is lower-case letters, digits, '.', '_', '-'")
        if not isinstance(body, dict):
            raise SpecError(f"{path}: devices.{name}: expected a mapping")
        unknown = sorted(set(body) - known - {"name"})
        if unknown:
            raise SpecError(f"{path}: devices.{name}.{unknown[0]}: unknown key; expected one of {sorted(known)}")
        out[name] = HardwareSpec(
            name=name,
            title=str(body.get("name", name)),
            backend=str(body.get("backend", "cuda")),
            aliases=tuple(str(a) for a in body.get("aliases") or ()),
            matrix_tflops=dict(body.get("matrix_tflops") or {}),
            vector_tflops=dict(body.get("vector_tflops") or {}),
            mem_bw_gbytes_per_s=body.get("mem_bw_gbytes_per_s"),
            mem_gbytes=body.get("mem_gbytes"),
            l2_mbytes=body.get("l2_mbytes"),
            source=str(body.get("source", "")),
            link_gbytes_per_s=body.get("link_gbytes_per_s"),
        )
    return out


def resolve_alias(specs: dict[str, HardwareSpec], reported: str) -> Optional[HardwareSpec]:
    """Map a name the driver reports ("NVIDIA H100 80GB HBM3") to a spec."""
    wanted = reported.strip().lower()
    for spec in specs.values():
        if wanted == spec.name or any(wanted == a.lower() for a in spec.aliases):
            return spec
    return None


@dataclass(frozen=True)
class Accelerator:
    """What torch sees: its device type and the name the driver reports."""

    type: str  # "cuda", "npu", "xpu", ... or "cpu"
    reported_name: str
    count: int


def detect_accelerator() -> Accelerator:
    import torch

    current = getattr(torch, "accelerator", None)
    acc = current.current_accelerator() if current is not None and current.is_available() else None
    if acc is None or acc.type == "cpu":
        return Accelerator("cpu", _cpu_name(), 1)
    module = getattr(torch, acc.type, None)
    name = acc.type
    if module is not None and hasattr(module, "get_device_name"):
        name = module.get_device_name(0)
    return Accelerator(acc.type, name, current.device_count())


def nvidia_device_count() -> Optional[int]:
    """The NVIDIA GPUs this process may see as the driver's NVML counts them, without importing
    torch (the count torch.cuda.device_count() starts from, before CUDA_VISIBLE_DEVICES); None
    without NVIDIA's driver library, or when it does not answer.

    >>> nvidia_device_count() is None or nvidia_device_count() >= 0
    True
    """
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        count = ctypes.c_uint(0)
        try:
            return int(count.value) if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
        finally:
            nvml.nvmlShutdown()
    except (OSError, AttributeError):
        return None


def slug(reported: str) -> str:
    """A spec name for a device we have no data for: 'NVIDIA RTX 6000 Ada' -> 'nvidia-rtx-6000-ada'."""
    s = re.sub(r"[^a-z0-9]+", "-", reported.lower()).strip("-")
    return (s or "device")[:64]


def resolve_device(name: Optional[str], extra: Optional[Path] = None, flag: str = "--device",
                   hardware_flag: str = "--opperf-hardware=FILE") -> tuple[HardwareSpec, Accelerator, list]:
    """The spec of `flag`=NAME (a spec name or alias), or of the detected device without a name,
    with what this machine has and the warnings to say: the device a sweep measures on, and
    `opperf predict --measure`'s. A problem with the name or the specs file is a SpecError naming
    the option (`flag`, `hardware_flag`: each caller's own spelling).

    The named spec must run on what this machine has; a detected device without a spec gets a
    bare one named after it (rows are stored, MFU/MBU stay empty) and a warning.

    >>> spec, acc, warnings = resolve_device(None)   # on a machine without an accelerator:
    >>> spec.name, acc.type                          # doctest: +SKIP
    ('cpu', 'cpu')
    """
    try:
        specs = load_specs(extra)
    except SpecError as exc:
        raise SpecError(f"{hardware_flag.split('=')[0]}: {exc}") from None
    acc = detect_accelerator()
    spec, warnings = (_named(specs, acc, name, flag, hardware_flag) if name
                      else _detected(specs, acc, hardware_flag))
    return spec, acc, warnings


def spec_named(specs: dict, name: str, flag: str, hardware_flag: str) -> HardwareSpec:
    """The spec `flag`=NAME names (a spec name or alias), whatever this machine has."""
    known = ", ".join(sorted(specs))
    if not valid_name(name.lower()):
        raise SpecError(f"{flag}={name}: a device name is lower-case letters, digits, '.', '_' and '-' "
                        f"(it names results/<device>.db); known: {known}")
    spec = specs.get(name.lower()) or resolve_alias(specs, name)
    if spec is None:
        raise SpecError(f"{flag}={name}: unknown device; known: {known} (add your own with {hardware_flag})")
    return spec


def _named(specs: dict, acc: Accelerator, name: str, flag: str, hardware_flag: str) -> tuple:
    spec = spec_named(specs, name, flag, hardware_flag)
    if spec.backend != "cpu" and spec.backend != acc.type:
        raise SpecError(
            f"{flag}={name}: {spec.name} runs on {spec.backend}, but this machine has "
            f"{'no accelerator' if acc.type == 'cpu' else acc.type + ' (' + acc.reported_name + ')'}")
    warnings = []
    detected = resolve_alias(specs, acc.reported_name) if acc.type != "cpu" else None
    if spec.backend != "cpu" and detected is not None and detected.name != spec.name:
        warnings.append(f"{flag}={spec.name} but the device reports {acc.reported_name!r} ({detected.name}): "
                        f"MFU/MBU use {spec.name}'s peaks")
    return spec, warnings


def _detected(specs: dict, acc: Accelerator, hardware_flag: str) -> tuple:
    if acc.type == "cpu":
        return specs["cpu"], []
    spec = resolve_alias(specs, acc.reported_name)
    if spec is not None:
        return spec, []
    spec = HardwareSpec(slug(acc.reported_name), title=acc.reported_name, backend=acc.type)
    return spec, [f"no hardware spec for {acc.reported_name!r}: rows go to {spec.name}.db without MFU/MBU; "
                  f"add a spec with {hardware_flag}"]


def _cpu_name() -> str:
    import platform

    return platform.processor() or platform.machine() or "cpu"
