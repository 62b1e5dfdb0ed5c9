"""The replay report: profiled against replayed time per signature, and where the profile's time went.

Per signature: ``gap = replayed_us / profiled_us_median - 1`` (the replay's median against the
profile's median: +0.10 means the replay took 10% longer), and ``share = profiled_total_us /
the profile's total`` (count x mean time, over all signatures). Rows are sorted by share. The
totals split the profiled time into: mapped and replayed (exact, and by a stand-in op),
mapped but not replayed yet, unreplayable, and unmapped.

Signatures of at least ``NOTE_MIN_US`` whose |gap| exceeds ``NOTE_GAP`` get a note with what
the data can tell: a stand-in op, different kernels in the profile and in the replay, several
kernels per profiled call, CPU time.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline import profile

NOTE_MIN_US = 20.0
NOTE_GAP = 0.25
CSV_COLUMNS = ("rank", "op_type", "input_shapes", "input_dtypes", "count", "profiled_us_mean", "profiled_us_median",
               "replayed_us", "gap", "profiled_total_us", "share", "status", "op", "params", "dtype", "backend",
               "proxy", "replayed_timer", "note")


@dataclass
class Totals:
    total_us: float
    exact_us: float  # mapped to the same computation, replayed
    proxy_us: float  # mapped to a stand-in, replayed
    unreplayed_us: float  # mapped, no replayed time yet
    unreplayable_us: float
    unmapped_us: float

    @property
    def mapped_us(self) -> float:
        return self.exact_us + self.proxy_us + self.unreplayed_us

    def share(self, us: float) -> float:
        return us / self.total_us if self.total_us else 0.0


def gap(sig: dict) -> Optional[float]:
    """Replayed against profiled median, as a fraction; None when not replayed.

    >>> gap({"replayed_us": 110.0, "profiled_us_median": 100.0})
    0.1
    """
    if sig.get("replayed_us") is None or not sig.get("profiled_us_median"):
        return None
    return round(sig["replayed_us"] / sig["profiled_us_median"] - 1, 12)


def totals(rows: list[dict]) -> Totals:
    t = Totals(sum(r["profiled_total_us"] for r in rows), 0.0, 0.0, 0.0, 0.0, 0.0)
    for r in rows:
        us = r["profiled_total_us"]
        if r["status"] == "unmapped":
            t.unmapped_us += us
        elif r["status"] == "unreplayable":
            t.unreplayable_us += us
        elif r["replayed_us"] is None:
            t.unreplayed_us += us
        elif r["proxy"]:
            t.proxy_us += us
        else:
            t.exact_us += us
    return t


def explain(sig: dict) -> str:
    """What the data says about a large gap; empty when it says nothing."""
    reasons = []
    if sig.get("proxy"):
        reasons.append(f"replayed by a stand-in op ({sig.get('note') or sig['op']})")
    profiled = json.loads(sig["kernels"]) if sig.get("kernels") else {}
    replayed = json.loads(sig["replayed_kernels"]) if sig.get("replayed_kernels") else []
    if profiled and sig.get("count"):
        per_call = sum(profiled.values()) / sig["count"]
        if per_call > 1.01:
            reasons.append(f"the profiled op ran {per_call:.1f} kernels per call (a fused or split computation)")
    if profiled and replayed and set(profiled) != set(replayed):
        reasons.append(f"different kernels: the profile ran {', '.join(sorted(profiled))}; "
                       f"the replay ran {', '.join(sorted(set(replayed)))} (another algorithm or library)")
    if sig.get("time_source") == "cpu_op":
        reasons.append("CPU self time of the op (host overhead included)")
    return "; ".join(reasons)


def write(profile_db: Path, out_dir: Path, top: int = 30) -> tuple[Path, Path]:
    """``replay_report.md`` and ``duration_gap.csv`` in OUT_DIR; returns their paths."""
    rows = profile.load(profile_db)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "duration_gap.csv", out_dir / "replay_report.md"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for rank, r in enumerate(rows, start=1):
            g = gap(r)
            writer.writerow([rank, r["op_type"], r["input_shapes"], r["input_dtypes"], r["count"],
                             _num(r["profiled_us_mean"]), _num(r["profiled_us_median"]), _num(r["replayed_us"]),
                             _num(g), _num(r["profiled_total_us"]), _num(r["share"]), r["status"], r["op"] or "",
                             r["params"] or "", r["dtype"] or "", r["backend"] or "", r["proxy"],
                             r["replayed_timer"] or "", r["note"] or r["reason"] or ""])
    md_path.write_text(markdown(rows, profile_db, top))
    return md_path, csv_path


def markdown(rows: list[dict], source: Path, top: int = 30) -> str:
    t = totals(rows)
    time_source = rows[0]["time_source"] if rows else "?"
    lines = [f"# Replay report: {source}", "",
             f"{len(rows)} signatures, {t.total_us:.1f} us profiled ({time_source} time).", "",
             "| profiled time | us | share |", "| --- | ---: | ---: |"]
    for label, us in (("mapped, replayed (same computation)", t.exact_us),
                      ("mapped, replayed by a stand-in op", t.proxy_us),
                      ("mapped, not replayed yet", t.unreplayed_us),
                      ("mapped (all of the above)", t.mapped_us),
                      ("unreplayable", t.unreplayable_us),
                      ("unmapped", t.unmapped_us)):
        lines.append(f"| {label} | {us:.1f} | {100 * t.share(us):.1f}% |")
    big = [r for r in rows if gap(r) is not None and r["profiled_us_median"] >= NOTE_MIN_US]
    if big:
        gaps = [abs(gap(r)) for r in big]
        beyond = [r for r in big if abs(gap(r)) > NOTE_GAP]
        lines += ["", f"Signatures of {NOTE_MIN_US:g} us or more with a replay: {len(big)}; median |gap| "
                      f"{100 * statistics.median(gaps):.1f}%; {len(beyond)} beyond {100 * NOTE_GAP:.0f}% (see the notes)."]
    lines += ["", f"## Signatures by share of the profiled time (top {top})", "",
              "| # | op type | input shapes | dtypes | count | profiled us (median) | replayed us | gap | share | "
              "replayed as |", "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for rank, r in enumerate(rows[:top], start=1):
        g = gap(r)
        lines.append(f"| {rank} | `{r['op_type']}` | `{r['input_shapes']}` | {r['input_dtypes']} | {r['count']} | "
                     f"{r['profiled_us_median']:.2f} | {_cell(r['replayed_us'], '.2f')} | "
                     f"{'-' if g is None else f'{100 * g:+.1f}%'} | {100 * r['share']:.2f}% | {_as(r)} |")
    notes = [r for r in rows if gap(r) is not None and r["profiled_us_median"] >= NOTE_MIN_US
             and abs(gap(r)) > NOTE_GAP]
    lines += ["", f"## Notes: gaps beyond {100 * NOTE_GAP:.0f}% at {NOTE_MIN_US:g} us or more", ""]
    if not notes:
        lines.append("None.")
    for r in notes:
        lines.append(f"- `{r['op_type']}` `{r['input_shapes']}` ({100 * gap(r):+.1f}%, {100 * r['share']:.2f}% of "
                     f"the profile): {explain(r) or 'nothing in the data explains it'}")
    for status, title in (("unreplayable", "Unreplayable"), ("unmapped", "Unmapped op types")):
        picked = [r for r in rows if r["status"] == status]
        lines += ["", f"## {title}", ""]
        if not picked:
            lines.append("None.")
            continue
        by_type: dict[str, list] = {}
        for r in picked:
            by_type.setdefault(r["op_type"], []).append(r)
        ordered = sorted(by_type.items(), key=lambda kv: -sum(r["profiled_total_us"] for r in kv[1]))
        for op_type, group in ordered[:top]:
            us = sum(r["profiled_total_us"] for r in group)
            why = f": unreplayable: {group[0]['reason']}" if status == "unreplayable" else ""
            lines.append(f"- `{op_type}`: {len(group)} signature(s), {us:.1f} us, {100 * t.share(us):.2f}%{why}")
    return "\n".join(lines) + "\n"


def _as(r: dict) -> str:
    if r["status"] != "mapped":
        return r["status"]
    params = "-".join(f"{k}={v}" for k, v in json.loads(r["params"]).items())
    return f"{r['op']}[{r['backend']}-{r['dtype']}-{params}]" + (" (stand-in)" if r["proxy"] else "")


def _num(value) -> str:
    return "" if value is None else f"{value:.6g}"


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)
