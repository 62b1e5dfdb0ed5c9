"""The catalogue as a table, for docs/catalog.md and `opperf catalog`; one op in detail for
`opperf catalog OP`, with the files that hold its code.

One row per built-in op: its family (the folder of its module), parameters (with defaults),
backends, and the FLOP and byte formulas, read from the op module's docstring: the first line
starting with ``FLOPs:`` and the first starting with ``Bytes:`` (keep each formula on that line;
explanations may follow on the next ones). The detail of one op adds the parameters' types and
each backend's availability on a device: the dtypes it runs there, or why it cannot; and the
files of the op and of each backend (the op's folder, and the shared modules a backend comes from).

    >>> print(markdown())                                   # doctest: +SKIP
    | op | family | params | backends | FLOPs | bytes |
    ...
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Optional

from pytest_opperf.dtypes import DTYPES
from pytest_opperf.catalog.registry import BACKENDS, OPS, Backend, DTypes, Op, library_version

BEGIN, END = "<!-- catalog -->", "<!-- /catalog -->"
LABELS = {"flops": "FLOPs:", "bytes": "Bytes:"}
_OPS_PACKAGE = "pytest_opperf.catalog.ops."
WIDTH = 100  # the plain listing's lines, backends wrapped


class TableError(Exception):
    pass


def formulas(op: Op) -> dict[str, Optional[str]]:
    """{'flops': text, 'bytes': text} from the op module's docstring; None where a line is missing."""
    doc = sys.modules[op.inputs.__module__].__doc__ or ""
    lines = [line.strip() for line in doc.splitlines()]
    return {key: next((line[len(label):].strip() for line in lines if line.startswith(label)), None)
            for key, label in LABELS.items()}


def rows() -> list[dict]:
    """The built-in ops (and their built-in backends), by family then name: call load_builtin() first."""
    out = []
    for op in OPS.values():
        module = op.inputs.__module__
        if not module.startswith(_OPS_PACKAGE):
            continue  # a user's op (a conftest registered it in this process)
        family = module[len(_OPS_PACKAGE):].split(".")[0]
        backends = sorted(b.name for b in BACKENDS.values()
                          if b.op == op.name and getattr(b.fn, "__module__", "").startswith("pytest_opperf."))
        params = [f"{p}={op.defaults[p]}" if p in op.defaults else p for p in op.params]
        out.append({"op": op.name, "family": family, "params": params, "backends": backends, **formulas(op)})
    return sorted(out, key=lambda r: (r["family"], r["op"]))


def markdown() -> str:
    """The table of docs/catalog.md."""
    lines = ["| op | family | params | backends | FLOPs | bytes |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows():
        cells = [f"`{r['op']}`", r["family"], ", ".join(r["params"]), ", ".join(f"`{b}`" for b in r["backends"]),
                 _cell(r["flops"]), _cell(r["bytes"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def text() -> str:
    """A terminal listing: op, family, backends; then where the detail is."""
    listing = [_fill([" ".join(r["backends"])], f"{r['op']:<17} {r['family']:<12} ", 31) for r in rows()]
    return "\n".join([*listing, "", "opperf catalog OP: its parameters, FLOP and byte formulas, and its backends on "
                                     "this machine"])


def details(name: str, device_type: str, capability: tuple = (0, 0)) -> str:
    """One built-in op: description, parameters with types and defaults, formulas, and each
    backend on `device_type`: its library's version, the dtypes it runs, or why it cannot."""
    row = next((r for r in rows() if r["op"] == name), None)
    if row is None:
        raise TableError(f"unknown op {name!r}; the built-in ops: {', '.join(r['op'] for r in rows())}")
    op = OPS[name]
    lines = [f"{name} ({row['family']}){': ' + op.description if op.description else ''}",
             _fill([_param(op, p) for p in op.params], "  parameters: ", 14),
             f"  FLOPs: {row['flops'] or '(missing)'}",
             f"  bytes: {row['bytes'] or '(missing)'}",
             f"  peak: {op.peak} (the peak its utilisation is taken against)",
             _fill(code(name), "  code: ", 8),
             f"  backends on this machine ({device_type}):"]
    width = max(len(b) for b in row["backends"])
    for backend in row["backends"]:
        lines.append(_fill([availability(BACKENDS[(name, backend)], device_type, capability)],
                           f"    {backend:<{width}}  ", width + 6))
    if any(line.endswith(SHAPED) or f"{SHAPED}," in line for line in lines):
        lines.append(f"  {SHAPED}: for some shapes only (the backend checks each case's parameters)")
    return "\n".join(lines)


def code(name: str) -> list[str]:
    """Where op `name` and its built-in backends are written: 'FILE (WHAT)' per file, the op's own
    file first, paths from the directory that holds the package."""
    op = OPS[name]
    home = _source(op.inputs.__module__)
    files: dict[str, list[str]] = {home: []}
    for backend in sorted((b for b in BACKENDS.values() if b.op == name), key=lambda b: b.name):
        module = getattr(backend.fn, "__module__", "")
        if module.startswith("pytest_opperf."):
            files.setdefault(_source(module), []).append(backend.name)
    folder = home.rsplit("/", 1)[0] + "/" if home.endswith("/__init__.py") else home
    order = sorted(files, key=lambda path: (path != home, not path.startswith(folder), path))
    return [f"{path} ({'; '.join(filter(None, ['the op' if path == home else '', ', '.join(files[path])]))})"
            for path in order]


def _source(module: str) -> str:
    path = Path(sys.modules[module].__file__).resolve()
    return path.relative_to(_ROOT).as_posix()


_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the pytest_opperf package


SHAPED = "*"  # marks a dtype whose support depends on the case's parameters


class _ShapeRead(Exception):
    pass


class _NoCase(dict):
    """The parameters of no case: a `supports` that reads one depends on the shape."""

    def __missing__(self, key):
        raise _ShapeRead(key)


def availability(backend: Backend, device_type: str, capability: tuple) -> str:
    """'LIBRARY VERSION  runs: DTYPES' or 'unavailable: WHY' for a backend on a device type,
    from the same checks collection makes (library installed, device types, `supports`)."""
    version = library_version(backend.library)
    if version is None:
        return f"unavailable: library {backend.library!r} is not installed"
    if backend.devices is not None and device_type not in backend.devices:
        return f"unavailable: runs on {', '.join(sorted(backend.devices))}, not {device_type}"
    runs, reasons = [], {}
    for dt in (DTypes(i, o) for i in DTYPES.values() for o in DTYPES.values()):
        try:
            reason = backend.unsupported(device_type, dt, capability, _NoCase(OPS[backend.op].defaults))
        except (_ShapeRead, KeyError, TypeError):
            if dt.input == dt.output:  # a mixed pair is listed only where it surely runs
                runs.append(dt.label + SHAPED)
            continue
        if reason:
            reasons.setdefault(dt.label, reason)
        else:
            runs.append(dt.label)
    where = f"{backend.library} {version}"
    if runs:
        return f"{where}  runs: {', '.join(runs)}"
    return f"{where}  unavailable: {reasons.get('bf16') or reasons.get('fp32') or next(iter(reasons.values()))}"


def _fill(items: list[str], first: str, indent: int) -> str:
    """items joined with ', ' in lines of at most WIDTH, broken only between items (and between
    the words of an item that does not fit a line alone, as an availability's dtype list)."""
    glued = [item.replace(" ", "\0") if len(item) < WIDTH - indent else item for item in items]
    text = textwrap.fill(", ".join(glued), WIDTH, initial_indent=first, subsequent_indent=" " * indent,
                         break_on_hyphens=False, break_long_words=False)
    return text.replace("\0", " ")


def _param(op: Op, name: str) -> str:
    kind = op.types.get(name, int)
    text = f"{name}: {getattr(kind, '__name__', kind)}"
    return f"{text} = {op.defaults[name]!r}" if name in op.defaults else text


def readme_table(readme: str) -> str:
    """The text between the catalogue markers of a markdown page (stripped)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise TableError(f"no {BEGIN} ... {END} markers")
    return readme[start + len(BEGIN):end].strip()


def update_readme(path: Path) -> bool:
    """Replace the table between the markers of the file at `path`; True if it changed."""
    readme = path.read_text()
    try:
        old = readme_table(readme)
    except TableError as exc:
        raise TableError(f"{path}: {exc}") from None
    new = markdown()
    if old == new:
        return False
    start, end = readme.find(BEGIN) + len(BEGIN), readme.find(END)
    path.write_text(readme[:start] + "\n" + new + "\n" + readme[end:])
    return True


def _cell(value: Optional[str]) -> str:
    if value is None:
        return "(missing)"
    # '*' would start emphasis in the products (2*m*n*k), '|' would end the cell.
    return value.replace("|", "\\|").replace("*", "\\*")
