"""The one dtype table: config names -> torch dtypes, sizes and check tolerances.

>>> lookup("bfloat16").name
'bf16'
>>> lookup("fp8").itemsize
1
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # canonical config/column spelling
    torch_name: str  # attribute of the torch module
    itemsize: int  # bytes per element
    # Normwise relative error ||out - ref|| / ||ref|| a correct kernel stays under.
    # float32 lands far under 1e-4; fp16 rounding is ~5e-4; bf16 ~4e-3; fp8 ~6e-2.
    max_rel_err: float
    is_float: bool = True

    @property
    def torch(self):
        import torch

        return getattr(torch, self.torch_name)


_TABLE = [
    DType("fp64", "float64", 8, 1e-10),
    DType("fp32", "float32", 4, 1e-4),
    DType("tf32", "float32", 4, 2e-3),
    DType("fp16", "float16", 2, 3e-3),
    DType("bf16", "bfloat16", 2, 2e-2),
    DType("fp8", "float8_e4m3fn", 1, 1.5e-1),
    DType("fp8_e5m2", "float8_e5m2", 1, 2.5e-1),
    DType("int8", "int8", 1, 0.0, is_float=False),
    DType("int32", "int32", 4, 0.0, is_float=False),
    # Token and expert ids (sampling's output): torch's index dtype.
    DType("int64", "int64", 8, 0.0, is_float=False),
]

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}

_ALIASES = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8", "e4m3": "fp8", "float8_e4m3fn": "fp8",
    "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
}


def lookup(name: str) -> DType:
    """The DType for a config spelling; KeyError for an unknown one."""
    key = str(name).strip().lower()
    return DTYPES[_ALIASES.get(key, key)]


def known_names() -> list[str]:
    return sorted(DTYPES)
