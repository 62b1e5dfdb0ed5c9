"""Tuned knobs at run time: the table `opperf best --export` writes, looked up per shape.

A kernel that was called without knobs asks for the best ones measured on its shape:

    knobs = tuned.knobs("rmsnorm", "triton", {"m": m, "n": n}, x.dtype)   # {} when none is known
    block_size = knobs.get("block_size")                                   # None: the kernel's default

The tables come from `--opperf-tuned=FILE` in a pytest session, else from the environment
variable OPPERF_TUNED (files separated by the path separator, ':' on Linux), read once at the
first lookup. A lookup matches the shape exactly (every parameter and the dtypes); a shape that
was not tuned gets {} and the kernel's own defaults. The file's format:

    {"opperf_tuned": 1, "device": "h100", "source": "results/h100.db",
     "tables": {"rmsnorm/triton": {"params": ["m", "n"], "timer": "profiler", "cache": "cold",
                                   "shapes": {"bf16-m=4096-n=4096": {"knobs": {"block_size": 4096,
                                                                              "num_warps": 8}, ...}}}}}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional

from pytest_opperf.files import FileError, load_json
from pytest_opperf import dtypes

ENV = "OPPERF_TUNED"
FORMAT = 1


class TunedError(ValueError):
    """A tuned table that cannot be used; the message names the file and what is wrong."""


class _Tables:
    def __init__(self):
        self.loaded = False
        self.files: list[Path] = []
        self.entries: dict[tuple[str, str], tuple[dict, str]] = {}  # (op/backend, shape) -> (knobs, file name)
        self.hit: Optional[tuple[dict, str]] = None  # the last lookup that found knobs
        # A kernel looks up on every call: remember each shape's answer, so later calls cost one dict lookup.
        self.memo: dict = {}


_TABLES = _Tables()


def use(paths: Optional[Iterable]) -> list[Path]:
    """Load these tables (None: those OPPERF_TUNED names), replacing any loaded before; the files.

    A later file's shape wins over an earlier one's. TunedError on a file that is not a table.
    """
    if paths is None:
        paths = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    entries = {}
    files = [Path(p) for p in paths]
    for path in files:
        for key, knobs in load(path).items():
            entries[key] = (knobs, path.name)
    _TABLES.files, _TABLES.entries, _TABLES.loaded, _TABLES.hit = files, entries, True, None
    _TABLES.memo = {}
    return files


def load(path: Path) -> dict[tuple[str, str], dict]:
    """A table file's entries: (op/backend, shape key) -> knobs."""
    try:
        data = load_json(Path(path))
    except FileError as exc:
        raise TunedError(str(exc)) from None
    if not isinstance(data, dict) or data.get("opperf_tuned") != FORMAT or not isinstance(data.get("tables"), dict):
        raise TunedError(f"{path}: not a tuned-knobs table (expected {{\"opperf_tuned\": {FORMAT}, \"tables\": ...}}, "
                         f"as `opperf best DB --op OP --export FILE` writes)")
    out = {}
    for name, table in data["tables"].items():
        shapes = table.get("shapes") if isinstance(table, dict) else None
        if not isinstance(shapes, dict):
            raise TunedError(f"{path}: tables.{name}: expected a mapping with 'shapes'")
        for shape, entry in shapes.items():
            knobs = entry.get("knobs") if isinstance(entry, dict) else None
            if not isinstance(knobs, dict) or not all(isinstance(v, (int, float, str)) for v in knobs.values()):
                raise TunedError(f"{path}: tables.{name}.shapes.{shape}.knobs: expected a mapping knob -> value")
            out[(name, shape)] = dict(knobs)
    return out


def shape_key(params: dict, dtype_in: Any, dtype_out: Any = None) -> str:
    """How a table names a shape: the case id without its backend and knobs.

    >>> shape_key({"m": 4096, "n": 4096}, "bf16"), shape_key({"m": 1}, "bfloat16", "fp8")
    ('bf16-m=4096-n=4096', 'bf16-fp8-m=1')
    """
    din = _dtype_name(dtype_in)
    dout = din if dtype_out is None else _dtype_name(dtype_out)
    label = din if din == dout else f"{din}-{dout}"
    return "-".join([label, *(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())])


def knobs(op: str, backend: str, params: dict, dtype_in: Any, dtype_out: Any = None) -> dict:
    """The tuned knobs of this shape ({} when no table has it); params in the op's column order."""
    if not _TABLES.loaded:
        use(None)
    if not _TABLES.entries:
        return {}
    memo = (op, backend, tuple(params.items()), dtype_in, dtype_out)
    if memo not in _TABLES.memo:
        _TABLES.memo[memo] = _TABLES.entries.get((f"{op}/{backend}", shape_key(params, dtype_in, dtype_out)))
    found = _TABLES.memo[memo]
    if found is None:
        return {}
    _TABLES.hit = found
    return dict(found[0])


def take_hit() -> Optional[tuple[dict, str]]:
    """(knobs, file name) of the last lookup that found knobs since the last take, and forget it:
    the bench fixture records in the row which knobs a call without knobs really ran with."""
    hit, _TABLES.hit = _TABLES.hit, None
    return hit


def files() -> list[Path]:
    """The table files in use (after a lookup or use())."""
    return list(_TABLES.files)


def _dtype_name(dtype: Any) -> str:
    """'bf16' from 'bf16', 'bfloat16' or torch.bfloat16."""
    return dtypes.lookup(str(dtype).removeprefix("torch.")).name
