"""Cases -> ``cases:`` config files, one per op, that ``pytest benches/ --opperf-config=FILE`` runs.

Each file is built as data and written by YAML's safe dumper, then read back by the loader users'
configs go through (pytest_opperf/config): a file it refuses, or one whose cases are not the ones
planned, is a bug here and raises naming the file. When one op's cases need different backends or
dtypes, each row names its own (``{m: 64, n: 512, backend: torch, dtypes: bf16}``) rather than
crossing every backend and dtype of the file with every row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from pytest_opperf import config
from pytest_opperf.dtypes import lookup


@dataclass(frozen=True)
class PlannedCase:
    op: str
    backend: str
    dtype: str
    params: tuple  # ((name, value), ...) in the op's parameter order
    comment: str = ""
    resident: tuple = ()  # the row's `resident:`: input tensors the cache state "resident" reads first


class WrittenConfigError(RuntimeError):
    """A config this module wrote does not load, or loads as other cases than planned: our bug."""


def write(cases: list[PlannedCase], directory: Path, header: str, settings: Optional[dict] = None) -> list[Path]:
    """Write ``<directory>/<op>.yaml`` per op, each checked by loading it back; the files in op order.

    `settings`: further top-level keys every file gets (``{"cache": "hot"}``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    by_op: dict[str, dict[tuple, PlannedCase]] = {}
    comments: dict[tuple, list[str]] = {}
    for case in cases:
        key = (case.backend, case.dtype, case.params)
        by_op.setdefault(case.op, {}).setdefault(key, case)  # one case, one row: the first one's resident
        if case.comment:
            comments.setdefault((case.op, key), []).append(case.comment)
    files = []
    for op in sorted(by_op):
        chosen = [(*key, case.resident) for key, case in by_op[op].items()]
        notes = [_note(comments.get((op, key[:3]), [])) for key in chosen]
        path = directory / f"{op}.yaml"
        data = {**document(op, chosen), **(settings or {})}
        # Flow style for the rows (one line each); a width no value reaches, so a long args text stays whole.
        body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=1 << 16, allow_unicode=True)
        path.write_text(_preamble(header, notes) + body, encoding="utf-8")
        check(path, op, chosen)
        files.append(path)
    return files


def document(op: str, chosen: list[tuple]) -> dict:
    """The config of one op's planned (backend, dtype label, params, resident) keys, as YAML data.

    >>> document("gemm", [("torch", "bf16", (("m", 1),), ()), ("triton", "bf16-fp32", (("m", 2),), (0,))])
    {'op': 'gemm', 'backends': ['torch', 'triton'], 'dtypes': ['bf16', {'input': 'bf16', 'output': 'fp32'}], \
'cases': [{'m': 1, 'backend': 'torch', 'dtypes': 'bf16'}, {'m': 2, 'backend': 'triton', 'dtypes': {'input': 'bf16', \
'output': 'fp32'}, 'resident': [0]}]}
    """
    backends = sorted({backend for backend, _, _, _ in chosen})
    dtypes = sorted({label for _, label, _, _ in chosen})
    rows = []
    for backend, label, params, resident in chosen:
        row = dict(params)
        if len(backends) > 1:
            row["backend"] = backend
        if len(dtypes) > 1:
            row["dtypes"] = _dtype_spec(label)
        if resident:
            row["resident"] = list(resident)
        rows.append(row)
    return {"op": op, "backends": backends, "dtypes": [_dtype_spec(d) for d in dtypes], "cases": rows}


def check(path: Path, op: str, chosen: list[tuple]) -> None:
    """Load the written file as a sweep would and compare its cases with the planned ones."""
    from pytest_opperf.catalog import load_builtin
    from pytest_opperf.catalog.registry import OPS
    from pytest_opperf.measure.inputs import CACHES

    load_builtin()
    if op not in OPS:
        raise WrittenConfigError(f"{path}: written for op {op!r}, which is not registered")
    spec = OPS[op]
    try:
        cfg = config.load(path, spec.params, spec.defaults, op_name=op, op_types=spec.types, caches=CACHES)
        got = {(c.backend, c.dtype_in, c.dtype_out, c.params, c.resident) for c in cfg.expand(spec.params, device="any")}
    except config.ConfigError as exc:
        raise WrittenConfigError(f"{path}: the config opperf wrote does not load ({exc}): a bug in pytest-opperf") from None
    full = ({**spec.defaults, **dict(params)} for _, _, params, _ in chosen)
    planned = {(backend, *(lookup(d).name for d in _dtype_pair(label)), tuple((p, f[p]) for p in spec.params),
                tuple(resident)) for (backend, label, _, resident), f in zip(chosen, full)}
    if got != planned:
        raise WrittenConfigError(f"{path}: the config opperf wrote loads as {len(got)} cases, not the {len(planned)} "
                                 f"planned ({len(got - planned)} unplanned): a bug in pytest-opperf")


def _preamble(header: str, notes: list[str]) -> str:
    """The header, and where each row came from, as YAML comments above the data."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"# cases[{i}]: {note}" for i, note in enumerate(notes) if note]
    return "".join(line + "\n" for line in lines)


def _note(origins: list[str]) -> str:
    origins = list(dict.fromkeys(" ".join(o.splitlines()) for o in origins))  # one comment line each
    return "; ".join(origins[:3]) + (f"; and {len(origins) - 3} more" if len(origins) > 3 else "")


def _dtype_pair(label: str) -> tuple:
    """A dtype label's input and output: "bf16" -> (bf16, bf16), "bf16-fp32" -> (bf16, fp32)."""
    first, _, second = label.partition("-")
    return first, second or first


def _dtype_spec(label: str):
    first, second = _dtype_pair(label)
    return first if first == second else {"input": first, "output": second}


def pytest_command(files: list[Path], bench_dir: str = "benches/") -> str:
    """The sweep that runs exactly these configs' cases (-m keeps the ops they name)."""
    ops = [f.stem for f in files]
    configs = " ".join(f"--opperf-config={f.resolve()}" for f in files)
    return f"pytest {bench_dir} {configs} -m \"{' or '.join(ops)}\""
