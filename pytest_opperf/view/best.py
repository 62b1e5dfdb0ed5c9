"""`opperf best`: per shape, a tuned backend's fastest knob set, and what tuning bought.

For every backend with knob sweeps and every shape it ran (parameters, dtypes, timer, cache):
the fastest knob set and its time, the runner-up and the margin over it, and the default (the
row run without knobs: `default: true` in the config) and the speedup over it. `--export`
writes the winners as the JSON table our Triton kernels read at run time (`catalog.tuned`).

>>> sweeps = best_per_shape(Results.open(Path("results/h100.db")).table("rmsnorm"))  # doctest: +SKIP
>>> sweeps[0].best["knobs"], sweeps[0].speedup_over_default                           # doctest: +SKIP
('{"block_size": 4096, "num_warps": 8}', 1.31)
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.catalog import tuned
from pytest_opperf.view import significance
from pytest_opperf.view.source import OpTable, Results, ViewError, case_id, knobs_of, shape_key, sort_key
from pytest_opperf.view.text import Section, fmt


@dataclass
class Sweep:
    """One backend's rows on one shape, fastest first."""

    backend: str
    shape: str  # the case id without backend and knobs, with timer and cache when they are not alone
    rows: list[dict]

    @property
    def best(self) -> dict:
        return self.rows[0]

    @property
    def runner_up(self) -> Optional[dict]:
        return self.rows[1] if len(self.rows) > 1 else None

    @property
    def default(self) -> Optional[dict]:
        return next((r for r in self.rows if not r.get("knobs")), None)

    @property
    def margin(self) -> Optional[float]:
        """The runner-up's time over the best's (1.10: the best is 10% faster)."""
        return None if self.runner_up is None else self.runner_up["time_us"] / self.best["time_us"]

    @property
    def within_noise(self) -> bool:
        """The best and the runner-up do not differ significantly (their medians' 95% confidence
        intervals overlap, or one is unstable or contended): the order may be chance."""
        return self.runner_up is not None and significance.why_not(self.best, self.runner_up) is not None

    @property
    def default_not_significant(self) -> Optional[str]:
        """Why the speedup over the default may be chance (significance.why_not); None when it is not."""
        if self.default is None or self.default is self.best:
            return None
        return significance.why_not(self.best, self.default)

    @property
    def speedup_over_default(self) -> Optional[float]:
        return None if self.default is None else self.default["time_us"] / self.best["time_us"]


def best_per_shape(table: OpTable, backend: Optional[str] = None, timer: Optional[str] = None,
                   cache: Optional[str] = None) -> list[Sweep]:
    """The sweeps of every backend that ran knobs (or only `backend`), in shape order."""
    rows = [r for r in table.rows if r.get("time_us") is not None
            and (timer is None or r["timer"] == timer) and (cache is None or r["cache"] == cache)]
    tuned_backends = {r["backend"] for r in rows if r.get("knobs")}
    if backend is not None:
        tuned_backends &= {backend}
    groups: dict[tuple, list[dict]] = {}
    for row in sorted(rows, key=lambda r: sort_key(r, table.params)):
        if row["backend"] in tuned_backends:
            groups.setdefault((row["backend"], shape_key(row, table.params)), []).append(row)
    many = {(r["timer"], r["cache"]) for rs in groups.values() for r in rs}
    sweeps = []
    for (name, _), group in groups.items():
        label = case_id({**group[0], "knobs": ""}, table.params, backend=False)
        if len(many) > 1:
            label += f" ({group[0]['timer']}, {group[0]['cache']})"
        sweeps.append(Sweep(name, label, sorted(group, key=lambda r: r["time_us"])))
    return sweeps


def knob_label(row: dict) -> str:
    """'block_size=4096-num_warps=8'; 'default' for a row run without knobs."""
    knobs = knobs_of(row)
    return "-".join(f"{k}={v}" for k, v in knobs.items()) if knobs else "default"


def sections(results: Results, ops: Optional[list[str]], backend: Optional[str] = None, timer: Optional[str] = None,
             cache: Optional[str] = None, limit: int = 50) -> list[Section]:
    """The tables of `opperf best`: per op, a line per (backend, shape)."""
    out = []
    for op in _ops(results, ops):
        sweeps = best_per_shape(results.table(op), backend, timer, cache)
        s = Section(f"{op}: fastest knobs per shape", ["shape", "backend", "best knobs", "time_us", "next knobs",
                                                        "next time_us", "margin", "default time_us", "vs default"],
                    level=2)
        for w in sweeps[:limit]:
            nxt = w.runner_up
            margin = "-" if w.margin is None else f"{w.margin:.2f}x" + (" (noise)" if w.within_noise else "")
            s.rows.append([w.shape, w.backend, knob_label(w.best), fmt(w.best["time_us"]),
                           knob_label(nxt) if nxt else "-", fmt(nxt["time_us"]) if nxt else "-", margin,
                           fmt(w.default["time_us"]) if w.default else "-",
                           significance.ratio_text(w.speedup_over_default, w.default_not_significant)])
        if len(sweeps) > limit:
            s.notes.append(f"... {len(sweeps) - limit} more shapes (--limit N shows more)")
        if not sweeps:
            s.notes.append("no backend ran knobs here" + (f" (--backend {backend})" if backend else ""))
        if any(w.default is None for w in sweeps):
            s.notes.append("vs default '-': no row without knobs on that shape; `default: true` under the backend in "
                           "the config runs one")
        if any(w.within_noise for w in sweeps):
            s.notes.append("(noise): the best and the next are not significantly apart: the medians' 95% confidence "
                           "intervals overlap, or a row is unstable (its median moved between the halves of its "
                           "samples), contended or without a CI")
        if any(w.default_not_significant for w in sweeps):
            s.notes.append(significance.NOTE)
        out.append(s)
    return out


def export(results: Results, ops: Optional[list[str]], backend: Optional[str] = None, timer: Optional[str] = None,
           cache: Optional[str] = None) -> dict:
    """The tuned-knobs table (catalog.tuned's format) of the winners of every sweep."""
    tables: dict[str, dict] = {}
    for op in _ops(results, ops):
        table = results.table(op)
        for w in best_per_shape(table, backend, timer, cache):
            row = w.best
            entry = tables.setdefault(f"{op}/{w.backend}", {"params": list(table.params), "shapes": {}})
            key = tuned.shape_key({p: row[p] for p in table.params}, row["dtype_in"], row["dtype_out"])
            if key in entry["shapes"]:
                raise ViewError(f"{results.path}: {op} shape {key} of {w.backend} was measured with timers or caches "
                                f"{sorted({(r['timer'], r['cache']) for r in table.rows})}: pick one with --timer "
                                f"and --cache")
            entry["shapes"][key] = {
                "knobs": knobs_of(row), "time_us": row["time_us"], "timer": row["timer"], "cache": row["cache"],
                "next_time_us": w.runner_up["time_us"] if w.runner_up else None,
                "default_time_us": w.default["time_us"] if w.default else None,
                "speedup_over_default": w.speedup_over_default, "backend_version": row["backend_version"],
                "run_id": row.get("run_id"),
            }
    if not tables:
        searched = ", ".join(results.pick(ops)) or "no op table"
        raise ViewError(f"{results.path}: no backend ran knobs in {searched}: nothing to export")
    return {"opperf_tuned": tuned.FORMAT, "device": results.device, "source": str(results.path),
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "tables": tables}


def write_export(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _ops(results: Results, ops: Optional[list[str]]) -> list[str]:
    """The ops asked for; without --op, those whose tables hold rows with knobs."""
    if ops:
        return results.pick(ops)
    return [op for op in results.ops if any(r.get("knobs") for r in results.table(op).rows)]
