"""The one dtype table: every spelling of a dtype -> its name, torch dtype, size and text forms.

A case runs in the dtypes a config may name (`fp16`, `bf16`, `int8`, ...); a replayed call's
tensors may hold a few more (`bool`, `uint8`, `int16`, `complex64`), which only the replay text and
the profilers spell. Every spelling a file or a profiler writes resolves here: the config name, torch's
attribute (`bfloat16`, `torch.bfloat16`), the replay text's short form (`bf16`, `i64`), Ascend's
(`DT_BF16`), the C++ type names torch.profiler records (`c10::BFloat16`, `long int`), case-insensitively.
Nothing here imports torch: `DType.torch` resolves the attribute when asked.

>>> lookup("bfloat16").name, lookup("torch.int64").short, lookup("DT_FLOAT16").itemsize
('bf16', 'i64', 2)
>>> lookup("bool", any_tensor=True).short   # lookup("bool") alone: UnknownDType, listing the case dtypes
'b1'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DType:
    name: str  # canonical config/column spelling
    torch_name: str  # attribute of the torch module
    itemsize: int  # bytes per element
    short: Optional[str]  # the replay text's form ("T:bf16[4,8]"); None: written as another row's
    kind: str = "float"  # float, int, bool or complex
    ascend: Optional[str] = None  # Ascend's (CANN's) name, as its profiler and HCCL write it
    scalar_type: Optional[int] = None  # c10::ScalarType's code: how torch.profiler records a dtype argument
    aliases: tuple = ()  # further spellings: C++ type names torch.profiler records, common names
    case: bool = True  # a case may run in it (a config may name it); else a replayed tensor's only
    nccl: Optional[int] = None  # ncclDataType_t (nccl.h): how the nccl backend names it to the library

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def torch(self):
        import torch

        return getattr(torch, self.torch_name)


TABLE = (
    DType("fp64", "float64", 8, "fp64", ascend="DT_DOUBLE", nccl=8, scalar_type=7, aliases=("double",)),
    DType("fp32", "float32", 4, "fp32", ascend="DT_FLOAT", nccl=7, scalar_type=6, aliases=("float",)),
    # float32 tensors computed with TF32 matmuls: torch's float32 reads back as fp32, not as this.
    DType("tf32", "float32", 4, None),
    DType("fp16", "float16", 2, "fp16", ascend="DT_FLOAT16", nccl=6, scalar_type=5, aliases=("half", "c10::half")),
    DType("bf16", "bfloat16", 2, "bf16", ascend="DT_BF16", nccl=9, scalar_type=15, aliases=("c10::bfloat16",)),
    DType("fp8", "float8_e4m3fn", 1, "fp8", nccl=10, scalar_type=24,
          aliases=("fp8_e4m3", "e4m3", "float8_e4m3", "c10::float8_e4m3fn")),
    DType("fp8_e5m2", "float8_e5m2", 1, "fp8_e5m2", nccl=11, scalar_type=23, aliases=("e5m2", "c10::float8_e5m2")),
    DType("int8", "int8", 1, "i8", kind="int", ascend="DT_INT8", nccl=0, scalar_type=1,
          aliases=("signed char", "char")),
    DType("int32", "int32", 4, "i32", kind="int", ascend="DT_INT32", nccl=2, scalar_type=3, aliases=("int",)),
    # Token and expert ids (sampling's output): torch's index dtype.
    DType("int64", "int64", 8, "i64", kind="int", ascend="DT_INT64", nccl=4, scalar_type=4,
          aliases=("long int", "long")),
    DType("int16", "int16", 2, "i16", kind="int", scalar_type=2, aliases=("short int", "short"), case=False),
    DType("uint8", "uint8", 1, "u8", kind="int", nccl=1, scalar_type=0, aliases=("unsigned char",), case=False),
    DType("bool", "bool", 1, "b1", kind="bool", scalar_type=11, case=False),
    DType("complex64", "complex64", 8, "c64", kind="complex", scalar_type=9, aliases=("c10::complex<float>",),
          case=False),
)

DTYPES: dict[str, DType] = {d.name: d for d in TABLE if d.case}


class UnknownDType(KeyError):
    """A spelling no row of the table has; the message names it and the known names."""

    def __str__(self) -> str:
        return str(self.args[0])


def _spellings() -> dict[str, DType]:
    out: dict[str, DType] = {}
    for d in TABLE:
        # A torch dtype's names belong to the first row that has them (float32 is fp32's, not tf32's).
        for spelling in (d.torch_name, f"torch.{d.torch_name}"):
            out.setdefault(spelling, d)
        for spelling in (d.name, d.short, d.ascend, *d.aliases):
            if spelling is None:
                continue
            key = spelling.lower()
            if out.get(key, d) is not d:
                raise ValueError(f"dtype table: {spelling!r} spells both {out[key].name} and {d.name}")
            out[key] = d
    return out


_SPELLINGS = _spellings()
_SCALAR_TYPES = {d.scalar_type: d for d in TABLE if d.scalar_type is not None}


def lookup(name: str, any_tensor: bool = False) -> DType:
    """The DType for any spelling of one (case-insensitive); UnknownDType (a KeyError) naming it and
    the known names otherwise. Only the dtypes a case runs in, unless `any_tensor` (a replayed
    call's tensors: bool, uint8, ...)."""
    found = _SPELLINGS.get(str(name).strip().lower())
    if found is None or not (found.case or any_tensor):
        known = sorted(d.name for d in TABLE if d.case or any_tensor)
        raise UnknownDType(f"unknown dtype {str(name)[:80]!r}; expected one of {known}")
    return found


def of_scalar_type(code: int) -> Optional[DType]:
    """The dtype of a c10::ScalarType code (how torch.profiler records a dtype argument), or None."""
    return _SCALAR_TYPES.get(code)


def of_torch(dtype) -> Optional[DType]:
    """The DType of a torch.dtype (None for one the table lacks)."""
    name = str(dtype).removeprefix("torch.")
    return next((d for d in TABLE if d.torch_name == name and d.name != "tf32"), None)


def of_itemsize(itemsize: int, kind: str = "int") -> Optional[DType]:
    """The first dtype of that kind and size (an int of 2 bytes: int16), or None."""
    return next((d for d in TABLE if d.kind == kind and d.itemsize == itemsize and d.short is not None), None)


def known_names() -> list[str]:
    """The dtype names a config may give, sorted."""
    return sorted(DTYPES)


def check_chunk() -> int:
    """Elements the functional check compares at a time (measure/check.py), which the collectives'
    memory estimates count too: 2^24, or OPPERF_CHECK_CHUNK."""
    import os

    return max(1, int(os.environ.get("OPPERF_CHECK_CHUNK", 1 << 24)))
