"""What a sequence run measured (sequence.Outcome), summed: per phase, per signature, and into the profile database.

Each replayed signature gets ``sequence_us`` (one call's mean time in the sequence) and
``context_factor`` (``sequence_us`` over the isolated ``replayed_us``) in the profile database;
each phase the time of one step of its replayed calls, in the profile and in the sequence (and in
the what-if, where one ran).
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.mapping import profile
from pytest_opperf.pipeline.reading.signature import ProfileError
from pytest_opperf.pipeline.replay.plan import Plan
from pytest_opperf.pipeline.replay.sequence import Outcome


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    steps: int
    calls: int
    profiled_us: float      # the profile's time of the replayed calls
    sequence_us: float      # the same calls in the sequence (mean of the repetitions)
    what_if_us: Optional[float]
    all_profiled_us: float  # the profile's time of every call of the phase, replayed or not


def phases(outcome: Outcome, calls: list[dict]) -> list[PhaseTime]:
    """Per phase (in order of first call), the time of one repetition of its calls."""
    replayed = {c.position for c in outcome.plan.calls}
    base, alt = outcome.times["base"], outcome.times.get("what-if")
    order, acc = [], {}
    for c in calls:
        ph = c["phase"] or ""
        if ph not in acc:
            order.append(ph)
            acc[ph] = {"steps": set(), "calls": 0, "prof": 0.0, "seq": 0.0, "alt": 0.0, "all": 0.0}
        a = acc[ph]
        a["steps"].add(c["step"])
        a["all"] += c["profiled_us"]
        if c["position"] in replayed:
            a["calls"] += 1
            a["prof"] += c["profiled_us"]
            a["seq"] += _mean(base.get(c["position"]))
            if alt is not None:
                a["alt"] += _mean(alt.get(c["position"]))
    return [PhaseTime(ph, len(acc[ph]["steps"]), acc[ph]["calls"], acc[ph]["prof"], acc[ph]["seq"],
                      acc[ph]["alt"] if alt is not None else None, acc[ph]["all"]) for ph in order]


def _mean(values) -> float:
    return sum(values) / len(values) if values else 0.0


def per_signature(outcome: Outcome) -> dict:
    """signature id -> one call's mean time in the sequence (us), over its calls and the repetitions."""
    sums: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    base = outcome.times["base"]
    for c in outcome.plan.calls:
        for us in base.get(c.position, ()):
            sums[c.signature] += us
            counts[c.signature] += 1
    return {s: sums[s] / counts[s] for s in sums if counts[s]}


def write(path: Path, outcome: Outcome, rows: list[dict]) -> int:
    """sequence_us, sequence_kernels, context_factor, sequence_device, sequence_at of each replayed
    signature; and NULL for the others (a signature no longer replayed keeps no stale time).
    Returns rows written."""
    times = per_signature(outcome)
    seen: dict = defaultdict(lambda: defaultdict(int))
    for c in outcome.plan.calls:
        for name in outcome.kernels.get(c.position, ()):
            seen[c.signature][name] += 1
    replayed = {r["id"]: r.get("replayed_us") for r in rows}
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    updates = [(us, json.dumps(dict(seen[s])) if s in seen else None, us / replayed[s] if replayed.get(s) else None,
                outcome.device, now, s) for s, us in times.items()]
    try:
        with sqlite3.connect(path) as db:
            profile.upgrade(db)
            db.execute("UPDATE signatures SET sequence_us = NULL, sequence_kernels = NULL, context_factor = NULL, "
                       "sequence_device = NULL, sequence_at = NULL")
            db.executemany("UPDATE signatures SET sequence_us = ?, sequence_kernels = ?, context_factor = ?, "
                           "sequence_device = ?, sequence_at = ? WHERE id = ?", updates)
            db.execute("UPDATE calls SET sequence_us = NULL")
            db.executemany("UPDATE calls SET sequence_us = ? WHERE position = ?",
                           [(_mean(us), position) for position, us in outcome.times["base"].items() if us])
        db.close()
    except sqlite3.Error as exc:
        raise ProfileError(f"{path}: cannot write the in-sequence times ({exc})") from None
    return len(updates)


def summary(path: Path, rows: list[dict], p: Plan, outcome: Outcome, table: list, what_if: bool,
            written: int) -> str:
    """The run in lines: the calls replayed, the time per phase and step, the signatures left out."""
    by_id = {r["id"]: r for r in rows}
    total = sum(r["profiled_total_us"] for r in rows) or 1.0
    left = sum(by_id[s]["profiled_total_us"] for s in p.left_out if s in by_id)
    lines = [f"opperf sequence: {len(p.calls)} calls of {written} signatures replayed in their order on "
             f"{outcome.device}, {outcome.repeats} repetitions; {len(p.left_out)} signatures left out "
             f"({100 * left / total:.1f}% of the profiled time)"]
    head = f"  {'phase':<12} {'steps':>5} {'calls':>6} {'profiled us/step':>17} {'in-sequence':>12} {'ratio':>7}"
    if outcome.times.get("what-if") is not None:
        head += f" {'what-if':>12} {'change':>8} {'predicted step':>15}"
    lines.append(head)
    all_rows = table + ([PhaseTime("(all)", sum(t.steps for t in table), sum(t.calls for t in table),
                                   sum(t.profiled_us for t in table), sum(t.sequence_us for t in table),
                                   None if table[0].what_if_us is None else sum(t.what_if_us for t in table),
                                   sum(t.all_profiled_us for t in table))] if len(table) > 1 else [])
    for t in all_rows:
        steps = max(t.steps, 1)
        ratio = t.sequence_us / t.profiled_us if t.profiled_us else float("nan")
        line = (f"  {t.phase or '(none)':<12} {t.steps:>5} {t.calls:>6} {t.profiled_us / steps:>17.1f} "
                f"{t.sequence_us / steps:>12.1f} {ratio:>7.3f}")
        if t.what_if_us is not None:
            change = (t.what_if_us - t.sequence_us) / t.sequence_us if t.sequence_us else float("nan")
            predicted = (t.all_profiled_us + t.what_if_us - t.sequence_us) / steps
            line += f" {t.what_if_us / steps:>12.1f} {100 * change:>+7.2f}% {predicted:>15.1f}"
        lines.append(line)
    if what_if:
        swapped = [f"{op} {a} -> {b}" for op, a, b in sorted({v for v in p.swapped.values()})]
        swapped += [f"{cls} -> {op} on {backend} ({n} module calls)" for cls, (op, backend, n) in p.replaced.items()]
        lines.append("  what-if: " + "; ".join(swapped) +
                     f" ({len(p.swapped)} signatures); predicted step = the profile's step (every call) + "
                     f"what-if - in-sequence")
    reasons: dict = defaultdict(float)
    for s, why in p.left_out.items():
        reasons[why.split(":")[0]] += by_id[s]["profiled_total_us"] if s in by_id else 0.0
    for why, us in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"  left out: {why} ({100 * us / total:.1f}% of the profiled time)")
    lines.append(f"  sequence_us and context_factor of {written} signatures -> {path} (opperf replay-report shows them)")
    return "\n".join(lines)
