"""Cases -> ``cases:`` config files, one per op, that ``pytest benches/ --opperf-config=FILE`` runs.

A config crosses its backends and dtypes with its cases, so when one op's cases need different
(backend, dtype) pairs the file lists the pairs and an ``exclude`` expression keeps each case
with its own pair only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlannedCase:
    op: str
    backend: str
    dtype: str
    params: tuple  # ((name, value), ...) in the op's parameter order
    comment: str = ""


def write(cases: list[PlannedCase], directory: Path, header: str) -> list[Path]:
    """Write ``<directory>/<op>.yaml`` per op; returns the files in op order."""
    directory.mkdir(parents=True, exist_ok=True)
    by_op: dict[str, dict[tuple, PlannedCase]] = {}
    comments: dict[tuple, list[str]] = {}
    for case in cases:
        key = (case.backend, case.dtype, case.params)
        by_op.setdefault(case.op, {}).setdefault(key, case)
        if case.comment:
            comments.setdefault((case.op, key), []).append(case.comment)
    files = []
    for op in sorted(by_op):
        chosen = by_op[op]
        backends = sorted({k[0] for k in chosen})
        dtypes = sorted({k[1] for k in chosen})
        names = [name for name, _ in next(iter(chosen))[2]]
        lines = [f"# {line}" for line in header.splitlines()]
        lines.append(f"op: {op}")
        lines.append(f"backends: [{', '.join(backends)}]")
        lines.append(f"dtypes: [{', '.join(_dtype_yaml(d) for d in dtypes)}]")
        lines.append("cases:")
        for key in chosen:
            body = ", ".join(f"{name}: {json.dumps(value)}" for name, value in key[2])
            origins = list(dict.fromkeys(comments.get((op, key), [])))
            note = "; ".join(origins[:3]) + (f"; and {len(origins) - 3} more" if len(origins) > 3 else "")
            lines.append(f"  - {{{body}}}" + (f"   # {note}" if note else ""))
        if len(backends) * len(dtypes) > 1:
            # Keep each case with the backend and dtype it was planned for, not their cross product.
            allowed = sorted({(k[0], *_dtype_pair(k[1]), *[v for _, v in k[2]]) for k in chosen}, key=repr)
            columns = ", ".join(["backend", "dtype_in", "dtype_out", *names])
            lines.append("exclude: " + json.dumps(f"({columns}) not in {allowed!r}"))
        path = directory / f"{op}.yaml"
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    return files


def _dtype_pair(label: str) -> tuple:
    """A dtype label's input and output: "bf16" -> (bf16, bf16), "bf16-fp32" -> (bf16, fp32)."""
    first, _, second = label.partition("-")
    return first, second or first


def _dtype_yaml(label: str) -> str:
    first, second = _dtype_pair(label)
    return first if first == second else f"{{input: {first}, output: {second}}}"


def pytest_command(files: list[Path], bench_dir: str = "benches/") -> str:
    """The sweep that runs exactly these configs' cases (-m keeps the ops they name)."""
    ops = [f.stem for f in files]
    configs = " ".join(f"--opperf-config={f.resolve()}" for f in files)
    return f"pytest {bench_dir} {configs} -m \"{' or '.join(ops)}\""
