"""Ascend profiler output: ``kernel_details*.csv`` files, or a profiling directory holding them.

Each row is one kernel: ``Type`` (the kernel type, e.g. ``MatMulV2``), ``Duration(us)`` and its
tensors (``Input Shapes``, ``Input Data Types``, ``Input Formats``, ``Output Shapes``,
``Output Data Types``), as the public torch_npu profiler writes them. The fields are kept as
written: empty slots stay, FRACTAL_NZ stays a format (the mapping reads NZ shapes, see
mapping.py and matmul.py); only the type loses a variant suffix (``_0``, ``_1``), ``N/A``
becomes empty, and a shape's brackets go (``[2,4096]`` -> ``2,4096``; ``[]``, a 0-dim scalar,
is an empty slot as the profiler writes scalars anyway). A row without a type (``N/A``, as a
Level0 profile writes communication kernels) takes it from its name (``hcom_allReduce__868_0_1``
-> ``hcom_allReduce_``).

A row with more or fewer fields than the header is refused with its line: read on, its
durations and shapes would be another column's. The device count of the run, which the
collectives (``hcom_*``) replay with, comes from ``--world-size`` when given, else from the
``profiler_metadata.json`` of the rank directory the CSV sits in (``distributed_args.world_size``,
or the ranks of ``parallel_group_info``'s ``default_group``); each signature records which. An
hcom kernel whose tensors are N/A is sized, and its group found, from the ``communication.json``
beside the CSV (hccl.py): that goes into its signature's ``input_values`` as JSON, so calls of
different sizes or groups are different signatures, and the mapping reads it as ``comm``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Optional

from pytest_opperf import files
from pytest_opperf.files import short
from pytest_opperf.pipeline.reading import hccl
from pytest_opperf.pipeline.reading.signature import Instance, ProfileError, Signature, aggregate, normalise_type

REQUIRED = ("Type", "Duration(us)", "Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types")
OPTIONAL = ("Input Formats",)
_HCOM = re.compile(r"(hcom_[A-Za-z]+_)")
_SHAPE_JUNK = str.maketrans("", "", "[]() ")


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


def read(path: Path, world_size: Optional[int] = None) -> list[Signature]:
    """Signatures of every kernel in the kernel_details files of PATH.

    ``world_size`` (``--world-size``) is the device count the collectives replay with; without it,
    the profiling directory's metadata gives it, if it has one.
    """
    instances: list[Instance] = []
    found = find_files(path)
    for file in found:
        instances.extend(read_file(file))
    if not instances:
        raise ProfileError(f"{path}: no kernel rows")
    signatures = aggregate(instances, source="ascend", time_source="kernel")
    context = _world(found, world_size)
    for sig in signatures:
        sig.context = dict(context)
    return signatures


def read_file(path: Path) -> list[Instance]:
    """The kernel rows of one kernel_details CSV; ProfileError naming the file (and line) otherwise."""
    try:
        text = files.read_text(path)
    except files.FileError as exc:
        raise ProfileError(str(exc)) from None
    try:
        return _rows(path, text)
    except csv.Error as exc:
        raise ProfileError(f"{path}: not a CSV file: {exc}") from None


def _rows(path: Path, text: str) -> list[Instance]:
    with io.StringIO(text.removeprefix("\ufeff"), newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            hint = " (a Level0 profile records no shapes: profile with profiler_level Level1 or above)" \
                if "Input Shapes" in missing else ""
            raise ProfileError(f"{path}: missing column(s) {missing}; a kernel_details.csv has {list(REQUIRED)}{hint}")
        out = []
        comm = _Comm(path.parent)
        line = reader.line_num
        for fields in reader:
            start, line = line + 1, reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise ProfileError(f"{path}:{start}: {len(fields)} fields where the header has {len(header)} "
                                   f"(a field {'missing' if len(fields) < len(header) else 'too many'}: the row "
                                   "would be read shifted); fix or remove this row")
            row = dict(zip(header, fields))
            try:
                duration = float(row["Duration(us)"])
            except ValueError:
                raise ProfileError(f"{path}:{start}: Duration(us): expected a number, "
                                   f"got {short(row['Duration(us)'])}") from None
            op_type, shapes = _type(row), _shapes(row, "Input Shapes", path, start)
            out.append(Instance(
                op_type=op_type,
                input_shapes=shapes,
                input_dtypes=_field(row, "Input Data Types"),
                input_formats=_field(row, "Input Formats"),
                output_shapes=_shapes(row, "Output Shapes", path, start),
                output_dtypes=_field(row, "Output Data Types"),
                duration_us=duration,
                input_values=comm(_field(row, "Name"), op_type) if op_type.startswith("hcom_") and not shapes else "",
            ))
    return out


class _Comm:
    """An hcom kernel's size and group from the communication files beside the CSV (hccl.py), as
    the JSON text its signature keeps in ``input_values``; read once per file, on first need."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.run: Optional[hccl.Run] = None
        self.read = False

    def __call__(self, name: str, op_type: str) -> str:
        if not self.read:
            self.run, self.read = hccl.read_run(self.directory), True
        return json.dumps(hccl.describe(self.run, name, op_type), sort_keys=True)


def _type(row: dict) -> str:
    kind = _field(row, "Type")
    if kind:
        return normalise_type(kind)
    name = _field(row, "Name")
    hcom = _HCOM.match(name)
    return hcom.group(1) if hcom else normalise_type(name)


def _field(row: dict, name: str) -> str:
    value = (row.get(name) or "").strip().strip('"').strip()
    return "" if value == "N/A" else value


def _shapes(row: dict, name: str, path: Path, line: int) -> str:
    """A shape field in the canonical form: ``;`` between slots, ``,`` between int dims."""
    text = _field(row, name).translate(_SHAPE_JUNK)
    for slot in text.split(";"):
        for dims in slot.split("+"):
            if dims and not all(d.isdigit() for d in dims.split(",")):
                raise ProfileError(f"{path}:{line}: {name}: {text!r} is not a shape list "
                                   "(expected dims like 136,7168;7168,3584)")
    return text


def _world(files: list[Path], given: Optional[int]) -> dict:
    """The device count and where it came from: the option, else the metadata of the run."""
    if given is not None:
        if given <= 0:
            raise ProfileError(f"--world-size={given}: expected a positive int")
        return {"world_size": given, "world_size_from": "--world-size"}
    found = {}
    for file in files:
        for directory in (file.parent, file.parent.parent):
            meta = directory / "profiler_metadata.json"
            if meta.is_file():
                size = _metadata_world(meta)
                if size:
                    found[size] = meta
                break
    if len(found) == 1:
        size, meta = found.popitem()
        return {"world_size": size, "world_size_from": f"{meta.name} of {meta.parent.name}"}
    if len(found) > 1:
        raise ProfileError(f"the profiles disagree on the device count ({', '.join(f'{m}: {s}' for s, m in found.items())}): "
                           "pass --world-size N")
    return {}


def _metadata_world(meta: Path) -> Optional[int]:
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ProfileError(f"{meta}: not readable JSON; remove it or pass --world-size N") from None
    if not isinstance(data, dict):
        return None
    size = (data.get("distributed_args") or {}).get("world_size")
    if isinstance(size, int) and size > 0:
        return size
    for group in (data.get("parallel_group_info") or {}).values():
        if isinstance(group, dict) and group.get("group_name") == "default_group":
            ranks = group.get("global_ranks")
            if isinstance(ranks, list) and ranks:
                return len(ranks)
    return None
