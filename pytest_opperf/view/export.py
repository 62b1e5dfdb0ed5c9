"""`opperf export`: an op's rows as CSV (with a header) or JSON (a list of row objects, as
``pandas.read_json(path)`` and ``pandas.read_csv(path)`` take them).

>>> export(Results.open(Path("results/cpu.db")), "gemm", "json")[:40]   # doctest: +SKIP
'[\\n  {\\n    "m": 256,\\n    "n": 256,\\n    "k": 256,'
"""

from __future__ import annotations

import csv
import io
import json

from pytest_opperf.view.source import Results, ViewError

FORMATS = ("csv", "json", "hcom")


def export(results: Results, op: str, form: str) -> str:
    """The rows of `op`'s table in the stored column order, as text in `form` (csv or json)."""
    if form not in FORMATS:
        raise ViewError(f"--format={form}: expected one of {', '.join(FORMATS)}")
    table = results.table(op)
    if form == "hcom":
        from pytest_opperf.view.hcom import hcom_csv

        return hcom_csv(table)
    rows = [{c: row[c] for c in table.columns} for row in table.rows]
    if form == "json":
        return json.dumps(rows, indent=2) + "\n"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=table.columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
