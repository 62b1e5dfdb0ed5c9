"""The first section of `opperf report`: one line per op, so a long report opens with what it
holds (how many cases, which backends, the time range, how many rows to be wary of) and where
to look next, before the sections of each op.

>>> rows = [{"backend": "torch", "time_us": 12.5, "unstable": 1}, {"backend": "triton", "time_us": 9.0}]
>>> overview_row("add", rows)
['add', '2', 'torch, triton', '9', '12.5', '1', '-']
"""

from __future__ import annotations

from pytest_opperf.view.source import OpTable
from pytest_opperf.view.text import Section, fmt

HEADERS = ["op", "cases", "backends", "fastest_us", "slowest_us", "unstable", "contended"]


def overview_row(op: str, rows: list[dict]) -> list[str]:
    """An op's line: cases, backends, fastest and slowest median time, unstable and contended rows."""
    times = [r["time_us"] for r in rows if r.get("time_us") is not None]
    backends = ", ".join(sorted({r["backend"] for r in rows}))

    def count(column: str) -> str:
        return str(sum(1 for r in rows if r.get(column))) if any(r.get(column) for r in rows) else "-"

    return [op, str(len(rows)), backends, fmt(min(times)) if times else "-", fmt(max(times)) if times else "-",
            count("unstable"), count("contended")]


def overview_section(tables: list[OpTable], source: str) -> Section:
    """The report's summary: a line per op, then how to read one op alone."""
    rows = [overview_row(t.op, t.rows) for t in tables if t.rows]
    total = sum(len(t.rows) for t in tables)
    s = Section(f"summary: {total} cases of {len(rows)} ops in {source}", HEADERS, rows, level=2)
    s.notes.append("the sections below take the ops one by one; `opperf report DB --op OP` shows one op, "
                   "`--limit N` more cases of each")
    return s
