"""The table of cases, one line a case: the sweep's terminal summary and `opperf report`'s per-case
table. Its columns are chosen by name (--opperf-columns, `opperf report --columns`), fitted to
the terminal (view/fit.py), and a column no row has a value in is left out with one note for
all of them (MFU and MBU on a device without peaks), not one per op.

>>> rows = [{"test_id": "b.py::test_add[torch-fp32-n=8]", "time_us": 2.5, "cv": 0.2, "unstable": 1, "target_met": 1}]
>>> table = case_table(rows, ["case", "time_us", "mfu", "cv", "flags"])
>>> [c.name for c in table.columns], table.rows[0]["flags"]
(['case', 'time_us', 'cv', 'flags'], 'unstable')
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from pytest_opperf import testid
from pytest_opperf.gate.rules import pct
from pytest_opperf.view.fit import Column, Table, flag_colour
from pytest_opperf.view.text import fmt_of_ceiling

# Gate verdicts that a case's flags name (same and new say nothing a reader must know).
FLAGGED_VERDICTS = ("regressed", "improved", "inconclusive")


def _float(digits: int, scale: float = 1.0) -> Callable[[Optional[float]], str]:
    def form(value) -> str:
        return "-" if value is None or math.isnan(value) else f"{value * scale:,.{digits}f}"
    return form


def _pct(value) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def _signed_pct(value) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:+.1%}"


def _text(value) -> str:
    return "-" if value is None else str(value)


def case_name(row: dict) -> str:
    """The case's pytest name (test_gemm[torch-bf16-m=8]) where the row has one, else op[id]."""
    test_id = row.get("test_id") or ""
    return testid.parse(test_id).name if test_id else row.get("case", "")


def dtype(row: dict) -> str:
    return row["dtype_in"] if row.get("dtype_in") == row.get("dtype_out") else f"{row.get('dtype_in')}-{row.get('dtype_out')}"


def utilisation(row: dict) -> str:
    """The utilisation that limits the case: the larger of MFU and MBU (on a roofline, the resource
    the case is closer to exhausting), named; '-' without peaks.

    >>> utilisation({"mfu": 0.61, "mbu": 0.20}), utilisation({"mfu": None, "mbu": 0.8}), utilisation({})
    ('61.0% MFU', '80.0% MBU', '-')
    """
    pairs = [(row.get(k), label) for k, label in (("mfu", "MFU"), ("mbu", "MBU"))]
    pairs = [(v, label) for v, label in pairs if v is not None and not math.isnan(v)]
    if not pairs:
        return "-"
    value, label = max(pairs)
    return f"{value:.1%} {label}"


# A row whose check's detection floor (check_floor) is above this could pass a kernel 1% off.
FLOOR_LIMIT = 0.01


def check_blind(row: dict) -> bool:
    """The row's functional check could not surely catch a kernel 1% off (its check_floor is above 1%)."""
    floor = row.get("check_floor")
    return floor is not None and floor > FLOOR_LIMIT


def flags(row: dict) -> list[str]:
    """What a reader should know before trusting a row's time: unstable (its median moved over 3%
    between the halves of its samples: it does not reproduce), contended (the device was shared
    while it ran), target-missed, throttled(reasons), above-ceiling (an attainable MFU or MBU over
    100%: the calibration is suspect), above-peak (a datasheet MFU or MBU over 100%: the counted
    work did not all happen in the timed call), and the gate's verdict; and what to know before
    trusting its output: check-floor (its check surely catches only larger errors than 1%).

    >>> flags({"mbu": 1.064, "mfu": 0.02}), flags({"mbu": 0.98}), flags({"check_floor": 0.0112})
    (['above-peak(not all counted bytes reached memory)'], [], ['check-floor(1.1%)'])
    """
    out = []
    if check_blind(row):
        out.append(f"check-floor({row['check_floor']:.1%})")
    if row.get("unstable"):
        out.append("unstable")
    if row.get("contended"):
        out.append("contended")
    if row.get("target_met") == 0 or row.get("target_met") is False:
        out.append("target-missed")
    if row.get("throttled"):
        out.append(f"throttled({row.get('throttle_reasons')})")
    if max(row.get("mfu_attainable") or 0, row.get("mbu_attainable") or 0) > 1.0:
        out.append("above-ceiling(calibration suspect)")  # nothing runs faster than its ceiling
    elif (row.get("mbu") or 0) > 1.0 or (row.get("mfu") or 0) > 1.0:
        # More counted bytes (FLOPs) a second than the datasheet peak: not all of them reached memory
        # in the timed call (the L2 kept written lines, or an input was still cached: a hot row), or
        # the op's formula counts more than the kernel does.
        out.append("above-peak(not all counted bytes reached memory)" if (row.get("mbu") or 0) > 1.0
                   else "above-peak(the FLOP formula counts more than ran)")
    verdict = (row.get("gate") or {}).get("verdict") if isinstance(row.get("gate"), dict) else None
    if verdict in FLAGGED_VERDICTS:
        out.append(verdict)
    return out


# name -> (Column, cell of a row). keep: the higher, the later a narrow terminal loses it.
COLUMNS: dict[str, tuple[Column, Callable[[dict], str]]] = {
    "case": (Column("case", "case", right=False, keep=100, shrink=2, min_width=24, shorten=testid.distinct), case_name),
    "op": (Column("op", "op", right=False, keep=35), lambda r: _text(r.get("op"))),
    "backend": (Column("backend", "backend", right=False, keep=45, shrink=3, min_width=8, cut_middle=False),
                lambda r: _text(r.get("backend"))),
    "dtype": (Column("dtype", "dtype", right=False, keep=30), dtype),
    "time_us": (Column("time_us", "time_us", keep=95), lambda r: _float(2)(r.get("time_us"))),
    "time_us_p95": (Column("time_us_p95", "p95_us", keep=20), lambda r: _float(2)(r.get("time_us_p95"))),
    "time_us_mean": (Column("time_us_mean", "mean_us", keep=20), lambda r: _float(2)(r.get("time_us_mean"))),
    "time_us_min": (Column("time_us_min", "min_us", keep=20), lambda r: _float(2)(r.get("time_us_min"))),
    "gflops": (Column("gflops", "GFLOP/s", keep=50), lambda r: _float(1)(r.get("gflops"))),
    "gbytes_per_s": (Column("gbytes_per_s", "GB/s", keep=50), lambda r: _float(1)(r.get("gbytes_per_s"))),
    "util": (Column("util", "utilisation", "util", keep=75), utilisation),
    "mfu": (Column("mfu", "MFU", keep=60), lambda r: _pct(r.get("mfu"))),
    "mbu": (Column("mbu", "MBU", keep=60), lambda r: _pct(r.get("mbu"))),
    "mfu_attainable": (Column("mfu_attainable", "aMFU", keep=40), lambda r: fmt_of_ceiling(r.get("mfu_attainable"))),
    "mbu_attainable": (Column("mbu_attainable", "aMBU", keep=40), lambda r: fmt_of_ceiling(r.get("mbu_attainable"))),
    "cv": (Column("cv", "CV", keep=70), lambda r: _float(3)(r.get("cv"))),
    "ci_rel": (Column("ci_rel", "CI", keep=25), lambda r: _pct(r.get("ci_rel"))),
    "median_drift": (Column("median_drift", "median_drift", keep=22), lambda r: _signed_pct(r.get("median_drift"))),
    "outliers": (Column("outliers", "outliers", "out", keep=22), lambda r: _text(r.get("outliers"))),
    "samples": (Column("samples", "samples", "n", keep=25), lambda r: _text(r.get("samples"))),
    "first_call_ms": (Column("first_call_ms", "first_call_ms", "1st_ms", keep=15),
                      lambda r: _float(1)(r.get("first_call_ms"))),
    "flags": (Column("flags", "flags", right=False, keep=90, shrink=1, min_width=10, cut_middle=False),
              lambda r: " ".join(flags(r))),
}
NAMES = tuple(COLUMNS)
# The sweep's summary by default; the attainable pair joins when the run has a calibration.
SUMMARY_DEFAULT = ("case", "time_us", "gflops", "gbytes_per_s", "mfu", "mbu", "cv", "flags")
ATTAINABLE = ("mfu_attainable", "mbu_attainable")
# `opperf report`'s per-case table by default (the op is the section's).
REPORT_DEFAULT = ("case", "backend", "time_us", "util", "gflops", "gbytes_per_s", "cv", "flags")


def case_table(rows: list[dict], names: list[str], chosen: bool = False) -> Table:
    """The table of `rows` in the columns `names`. Unless the user chose them (chosen), a column
    without a value in any row is left out (empty_columns says which)."""
    if not chosen:
        names = [n for n in names if n not in empty_columns(rows, names)]
    cells = [{n: COLUMNS[n][1](r) for n in names} for r in rows]
    colours = {}
    if "flags" in names:
        for i, r in enumerate(rows):
            colour = flag_colour(flags(r))
            if colour:
                colours[(i, "flags")] = colour
    return Table([COLUMNS[n][0] for n in names], cells, colours)


def empty_columns(rows: list[dict], names: list[str]) -> list[str]:
    """The value columns among `names` that no row fills ('-' in every cell)."""
    values = [n for n in names if n not in ("case", "flags", "op", "backend", "dtype")]
    return [n for n in values if rows and all(COLUMNS[n][1](r) == "-" for r in rows)]


# The gate's table: one line per case whose verdict is not `same` (gate/report.py's verdicts).
VERDICT_COLUMNS = (
    Column("case", "case", right=False, keep=100, shrink=2, min_width=24, shorten=testid.distinct),
    Column("base_us", "base_us", keep=60),
    Column("time_us", "time_us", keep=90),
    Column("ratio", "ratio", keep=95),
    Column("max", "max", keep=40),
    Column("noise", "noise", keep=50),
    Column("verdict", "verdict", right=False, keep=99),
    Column("notes", "", right=False, keep=30, shrink=1, min_width=12, cut_middle=False),
)
VERDICT_COLOURS = {"regressed": "red", "improved": "green", "inconclusive": "yellow"}


def verdict_table(verdicts: list[dict]) -> Table:
    """The gate's verdicts (rules.judge's dicts) as a table; a verdict's notes follow it (the first
    to be cut, or left out, in a narrow terminal)."""
    rows, colours = [], {}
    for i, v in enumerate(verdicts):
        ratio = v.get("ratio")
        rows.append({"case": v["case"], "base_us": _float(2)(v.get("base_time_us")),
                     "time_us": _float(2)(v.get("time_us")), "ratio": "-" if ratio is None else f"{ratio:.3f}x",
                     "max": "-" if v.get("threshold") is None else pct(v["threshold"]), "noise": _pct(v.get("noise_rel")),
                     "verdict": v["verdict"].upper(), "notes": f"({v['notes']})" if v.get("notes") else ""})
        if v["verdict"] in VERDICT_COLOURS:
            colours[(i, "verdict")] = VERDICT_COLOURS[v["verdict"]]
    columns = [c for c in VERDICT_COLUMNS if c.name != "notes" or any(r["notes"] for r in rows)]
    return Table(columns, rows, colours)
