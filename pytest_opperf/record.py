"""One measured case, and every form it takes: a database row, a baseline entry, a pytest-benchmark
JSON entry.

A Record is a dict of the op table's columns (columns.py: the op's parameters, KEY, MEASURE) plus
the private keys below. It stays a plain dict so it crosses from xdist workers as is; `Record(d)`
gives the conversions back on the other side.

    >>> r = Record.measured("add", {"n": 8.0}, {}, {"dtype_in": "fp32", "dtype_out": "fp32",
    ...                     "backend": "torch", "knobs": "", "time_us": 1.23456789})
    >>> r.params, r.to_baseline_entry()["time_us"]
    ({'n': 8.0}, 1.23457)
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from pytest_opperf import testid
from pytest_opperf.columns import KEY, MEASURE, key_columns

PARAMS_KEY = "_params"  # the op's parameter names, in its column order
DEFAULTS_KEY = "_defaults"  # the op's parameter defaults: the writer migrates an older table with them
SAMPLES_KEY = "_samples_us"  # the samples, carried only when the pytest-benchmark export is asked for
GATE_KEY = "gate"  # the gate's verdict on the case, where a baseline was given


class Record(dict):
    """One case's row: the op's parameters, its key columns and its measurement."""

    @classmethod
    def measured(cls, op: str, params: dict, defaults: dict, fields: dict) -> "Record":
        """A fresh measurement: the op, its parameters (in the op's order) and defaults, the columns."""
        return cls({"op": op, PARAMS_KEY: list(params), DEFAULTS_KEY: dict(defaults), **params, **fields})

    @classmethod
    def from_row(cls, op: str, param_names: list, row: dict) -> "Record":
        """A row read back from the op's table (its parameter columns named by the caller)."""
        return cls({**row, "op": op, PARAMS_KEY: list(param_names)})

    @property
    def op(self) -> str:
        return self["op"]

    @property
    def param_names(self) -> list:
        return list(self[PARAMS_KEY])

    @property
    def params(self) -> dict:
        return {c: self[c] for c in self[PARAMS_KEY]}

    @property
    def defaults(self) -> dict:
        return self.get(DEFAULTS_KEY) or {}

    @property
    def verdict(self) -> Optional[dict]:
        return self.get(GATE_KEY)

    @property
    def gate_fails(self) -> bool:
        """The gate fails this case: regressed, or inconclusive under --opperf-inconclusive=fail."""
        verdict = self.get(GATE_KEY) or {}
        return bool(verdict.get("fails", verdict.get("verdict") == "regressed"))

    def to_row(self) -> tuple[str, list, dict]:
        """(table, unique-key columns, row): what the writer upserts. Lists and dicts become JSON."""
        row = self.params
        for column in [*KEY, *MEASURE]:
            value = self.get(column)
            row[column] = json.dumps(value) if isinstance(value, (list, dict)) else value
        return self.op, key_columns(self[PARAMS_KEY]), row

    def to_baseline_entry(self, commit: Optional[str] = None) -> dict:
        """A baseline file's case: identity (numbers in one spelling), then the rounded measurement."""
        knobs = self.get("knobs") or {}
        if isinstance(knobs, str):
            knobs = json.loads(knobs)
        entry = {"op": self.op, "backend": self["backend"], "dtype_in": self["dtype_in"],
                 "dtype_out": self["dtype_out"], "params": {c: plain(v) for c, v in self.params.items()}}
        if knobs:
            entry["knobs"] = {k: plain(v) for k, v in knobs.items()}
        entry.update({
            "time_us": significant(self["time_us"], 6),
            "time_us_p95": significant(self.get("time_us_p95"), 6),
            "ci_rel": significant(self.get("ci_rel"), 3),
            "cv": significant(self.get("cv"), 3),
            "samples": self.get("samples"),
            "backend_version": self.get("backend_version"),
            "timer": self.get("timer"),
            "cache": self.get("cache"),
            "commit": commit[:12] if commit else None,
            "created_at": self.get("created_at"),
        })
        return entry

    def to_benchjson(self, stats: dict) -> dict:
        """One `benchmarks[]` entry of pytest-benchmark's JSON (group: the op; name: the test), with
        pytest-benchmark's `stats` of the case's samples (store/benchjson.py computes them)."""
        params = self.params
        params.update({c: self[c] for c in ("dtype_in", "dtype_out", "backend", "backend_version")})
        if self.get("knobs"):
            params["knobs"] = self["knobs"]
        test = testid.parse(self["test_id"])
        return {
            "group": self.op,
            "name": test.name,
            "fullname": self["test_id"],
            "params": params,
            "param": test.params,
            "extra_info": dict(self.get("extra_info") or {}),
            "options": {
                "timer": self["timer"],
                "cache": self["cache"],
                "warmup": self["warmup_calls"],
                "calls_per_sample": self["calls_per_sample"],
                "target_met": bool(self["target_met"]),
            },
            "stats": dict(stats),
        }


def extra_info_of(value: Any) -> dict:
    """A row's extra_info as a dict: it is a dict on a fresh record, JSON text once stored; {} for
    none or for text that is not a JSON object.

    >>> extra_info_of('{"loop_driver": "c"}'), extra_info_of(None), extra_info_of("not json")
    ({'loop_driver': 'c'}, {}, {})
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def plain(value: Any) -> Any:
    """One spelling per number: 4096.0 (a REAL column) and 4096 (a config) are the same parameter."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def significant(value: Optional[float], digits: int) -> Optional[float]:
    """Round to significant digits: a file shows what the measurement resolves, not float noise."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return plain(float(f"{float(value):.{digits}g}"))
