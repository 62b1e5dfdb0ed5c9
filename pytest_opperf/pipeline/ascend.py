"""Ascend profiler output: ``kernel_details*.csv`` files, or a profiling directory holding them.

Each row is one kernel: ``Type`` (the kernel type, e.g. ``MatMulV2``), ``Duration(us)`` and its
tensors (``Input Shapes``, ``Input Data Types``, ``Input Formats``, ``Output Shapes``,
``Output Data Types``), as the public torch_npu profiler writes them. The fields are kept as
written: empty slots stay, FRACTAL_NZ stays a format (the mapping reads NZ shapes, see
mapping.py); only the type loses a variant suffix (``_0``, ``_1``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pytest_opperf import files
from pytest_opperf.files import short
from pytest_opperf.pipeline.signature import Instance, ProfileError, Signature, aggregate, normalise_type

REQUIRED = ("Type", "Duration(us)", "Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types")
OPTIONAL = ("Input Formats",)


def find_files(path: Path) -> list[Path]:
    """The kernel_details CSVs of PATH: the file itself, or every one under a directory."""
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.rglob("*.csv") if "kernel_details" in p.name)
        if not found:
            raise ProfileError(f"{path}: no kernel_details*.csv file under this directory")
        return found
    raise ProfileError(f"{path}: no such file or directory")


def read(path: Path) -> list[Signature]:
    """Signatures of every kernel in the kernel_details files of PATH."""
    instances: list[Instance] = []
    for file in find_files(path):
        instances.extend(read_file(file))
    if not instances:
        raise ProfileError(f"{path}: no kernel rows")
    return aggregate(instances, source="ascend", time_source="kernel")


def read_file(path: Path) -> list[Instance]:
    """The kernel rows of one kernel_details CSV; ProfileError naming the file (and line) otherwise."""
    try:
        text = files.read_text(path)
    except files.FileError as exc:
        raise ProfileError(str(exc)) from None
    try:
        return _rows(path, csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise ProfileError(f"{path}: not a CSV file: {exc}") from None


def _rows(path: Path, reader: csv.DictReader) -> list[Instance]:
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {missing}; a kernel_details.csv has {list(REQUIRED)}")
    reader.fieldnames = header
    out = []
    for line, row in enumerate(reader, start=2):
        try:
            duration = float(row["Duration(us)"])
        except (TypeError, ValueError):
            raise ProfileError(f"{path}:{line}: Duration(us): expected a number, got {short(row['Duration(us)'])}") from None
        out.append(Instance(
            op_type=normalise_type(row["Type"] or ""),
            input_shapes=_field(row, "Input Shapes"),
            input_dtypes=_field(row, "Input Data Types"),
            input_formats=_field(row, "Input Formats"),
            output_shapes=_field(row, "Output Shapes"),
            output_dtypes=_field(row, "Output Data Types"),
            duration_us=duration,
        ))
    return out


def _field(row: dict, name: str) -> str:
    value = row.get(name)
    return "" if value is None or value == "N/A" else value.strip().strip('"')
