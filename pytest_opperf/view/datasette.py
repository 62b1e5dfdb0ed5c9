"""`opperf datasette-metadata`: a Datasette metadata file for result databases, so that
``datasette results/h100.db -m metadata.json`` shows what every column means, its unit, and
facets on backend, dtype and timer. Datasette itself is never needed by pytest-opperf.

>>> meta = metadata([Results.open(Path("results/h100.db"))])             # doctest: +SKIP
>>> meta["databases"]["h100"]["tables"]["gemm"]["units"]["time_us"]
'us'

The page of a table keeps Datasette's defaults where they serve: every column sortable (no
`sort_desc`: Datasette then builds its next-page query on a column the page may not show, and
`?_col=time_us` over more than a page is HTTP 400), rows in the order they were written. The
column notes are in each column header's menu and in one collapsed list under the table's
description, not in a list above the rows (70 of them filled about 2,900 px). Ratios and
GFLOP/s are shown rounded by the plugin view/datasette_plugin.py (`opperf_digits`).
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from pytest_opperf.columns import KEY, MEASURE
from pytest_opperf.store.database import RUNS
from pytest_opperf.view.source import Results

FACETS = ["backend", "dtype_in", "timer"]
# Digits after the point each column is shown with (view/datasette_plugin.py reads this key);
# the stored values stay as measured. Columns with a unit are shown by Datasette itself.
DIGITS = {"gflops": 1, "flops": 0, "mfu": 4, "mbu": 4, "mfu_attainable": 4, "mbu_attainable": 4, "cv": 3,
          "ci_rel": 4, "busbw_util": 4, "outlier_share": 3, "median_drift": 4}
# Datasette lists every column's note above the rows; the notes are in the header menus and the
# collapsed list instead, so that list is hidden (a stylesheet inline: the metadata stays one file).
HIDE_NOTES_CSS = "data:text/css," + quote("dl.column-descriptions{display:none}")


def table_metadata(op: str, params: list[str], columns: list[str]) -> dict:
    known = {**KEY, **MEASURE}
    descriptions = {p: f"parameter {p} of {op} (from its config)" for p in params}
    descriptions.update({c: known[c].description for c in columns if c in known})
    notes = {c: descriptions[c] for c in columns if c in descriptions}
    summary = f"one row per measured case of {op}: unique on ({', '.join([*params, *KEY])})"
    return {
        "description_html": f"<p>{escape(summary)}</p>" + _notes_html(notes),
        "columns": notes,
        "units": {c: known[c].unit for c in columns if c in known and known[c].unit},
        "opperf_digits": {c: d for c, d in DIGITS.items() if c in columns},
        "facets": [f for f in FACETS if f in columns],
    }


def _notes_html(notes: dict) -> str:
    """The column notes as one collapsed list: the table's rows come right after its summary line."""
    items = "".join(f"<dt>{escape(c)}</dt><dd>{escape(text)}</dd>" for c, text in notes.items())
    return f"<details><summary>what the {len(notes)} columns mean</summary><dl>{items}</dl></details>"


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
                            "facets": ["device", "torch"]}
        databases[results.path.stem] = {"description": f"pytest-opperf results of device {results.device}",
                                        "tables": tables}
    return {"title": "pytest-opperf results", "description": "operator performance: one table per op, one row "
            "per case; units in the column headers' hints", "databases": databases,
            "extra_css_urls": [HIDE_NOTES_CSS]}
