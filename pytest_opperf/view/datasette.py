"""`opperf datasette-metadata`: a Datasette metadata file for result databases, so that
``datasette results/h100.db -m metadata.json`` shows what every column means, its unit, and
facets on backend, dtype and timer. Datasette itself is never needed by pytest-opperf.

>>> meta = metadata([Results.open(Path("results/h100.db"))])             # doctest: +SKIP
>>> meta["databases"]["h100"]["tables"]["gemm"]["units"]["time_us"]
'us'
"""

from __future__ import annotations

from pytest_opperf.columns import KEY, MEASURE
from pytest_opperf.store.database import RUNS
from pytest_opperf.view.source import Results

FACETS = ["backend", "dtype_in", "timer"]


def table_metadata(op: str, params: list[str], columns: list[str]) -> dict:
    known = {**KEY, **MEASURE}
    descriptions = {p: f"parameter {p} of {op} (from its config)" for p in params}
    descriptions.update({c: known[c].description for c in columns if c in known})
    return {
        "description": f"one row per measured case of {op}: unique on ({', '.join([*params, *KEY])})",
        "columns": {c: descriptions[c] for c in columns if c in descriptions},
        "units": {c: known[c].unit for c in columns if c in known and known[c].unit},
        "facets": [f for f in FACETS if f in columns],
        "sort_desc": "created_at",
    }


def metadata(opened: list[Results]) -> dict:
    """Datasette metadata for these databases (each named by its file's stem, as Datasette names it)."""
    databases = {}
    for results in opened:
        tables = {}
        for op in results.ops:
            table = results.table(op)
            tables[op] = table_metadata(op, table.params, table.columns)
        if results.runs:
            tables[RUNS] = {"description": "one row per pytest session: its environment (device, driver, "
                                           "torch, libraries, git commit, host, command, settings)",
                            "facets": ["device", "torch"], "sort_desc": "started_at"}
        databases[results.path.stem] = {"description": f"pytest-opperf results of device {results.device}",
                                        "tables": tables}
    return {"title": "pytest-opperf results", "description": "operator performance: one table per op, one row "
            "per case; units in the column headers' hints", "databases": databases}

