"""The catalogue as a table, for docs/catalog.md and `opperf catalog`.

One row per built-in op: its family (the folder of its module), parameters (with defaults),
backends, and the FLOP and byte formulas, read from the op module's docstring: the first line
starting with ``FLOPs:`` and the first starting with ``Bytes:`` (keep each formula on that line;
explanations may follow on the next ones).

    >>> print(markdown())                                   # doctest: +SKIP
    | op | family | params | backends | FLOPs | bytes |
    ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from pytest_opperf.catalog.registry import BACKENDS, OPS, Op

BEGIN, END = "<!-- catalog -->", "<!-- /catalog -->"
LABELS = {"flops": "FLOPs:", "bytes": "Bytes:"}
_OPS_PACKAGE = "pytest_opperf.catalog.ops."


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
    """A terminal listing: op, family, backends."""
    return "\n".join(f"{r['op']:<16} {r['family']:<12} {' '.join(r['backends'])}" for r in rows())


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
