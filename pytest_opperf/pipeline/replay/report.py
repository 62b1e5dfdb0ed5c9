"""The replay report: profiled against replayed time per signature, and where the profile's time went.

Per signature: ``gap = replayed_us / profiled_us_median - 1`` (the replay's median against the
profile's median: +0.10 means the replay took 10% longer), and ``share = profiled_total_us /
the profile's total`` (count x mean time, over all signatures). Rows are sorted by share. The
totals split the profiled time into: mapped and replayed (exact, and by a stand-in op),
mapped but not replayed yet, unreplayable, and unmapped.

Signatures of at least ``NOTE_MIN_US`` whose |gap| exceeds ``NOTE_GAP`` get a note with what
the data can tell: a stand-in op, different kernels in the profile and in the replay, several
kernels per profiled call, CPU time.

After ``opperf sequence`` the report also sets, over the signatures replayed in sequence, the
profile's sum beside the in-sequence sum and the isolated sum, and lists the signatures whose
context factor (``sequence_us / replayed_us``) is furthest from 1.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pytest_opperf.pipeline.mapping import profile

NOTE_MIN_US = 20.0
NOTE_GAP = 0.25
CSV_COLUMNS = ("rank", "op_type", "input_shapes", "input_dtypes", "count", "profiled_us_mean", "profiled_us_median",
               "replayed_us", "gap", "profiled_total_us", "share", "status", "op", "params", "dtype", "backend",
               "proxy", "replayed_timer", "cache", "sequence_us", "context_factor", "note")


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


@dataclass
class ModelFigures:
    """The model's time rebuilt from the replays: over the replayed signatures, the sum of replayed
    time x count against the sum of profiled time x count, and the time-weighted |error|."""

    replayed_sum_us: float
    profiled_sum_us: float
    abs_error_us: float  # sum over signatures of |replayed x count - profiled total|
    covered: float  # the replayed signatures' share of the profile's time
    dominant: list  # (signature row, its |error| us), largest first

    @property
    def ratio(self) -> Optional[float]:
        return self.replayed_sum_us / self.profiled_sum_us if self.profiled_sum_us else None

    @property
    def weighted_error(self) -> Optional[float]:
        return self.abs_error_us / self.profiled_sum_us if self.profiled_sum_us else None


def model_figures(rows: list[dict], dominant: int = 5) -> ModelFigures:
    """The model-level figures of the replayed signatures (see ModelFigures).

    >>> m = model_figures([{"replayed_us": 12.0, "count": 10, "profiled_total_us": 100.0, "status": "mapped"},
    ...                    {"replayed_us": 8.0, "count": 5, "profiled_total_us": 50.0, "status": "mapped"}])
    >>> (m.replayed_sum_us, m.profiled_sum_us, round(m.ratio, 4), round(m.weighted_error, 4))
    (160.0, 150.0, 1.0667, 0.2)
    """
    done = [r for r in rows if r["status"] == "mapped" and r.get("replayed_us") is not None]
    errors = sorted(((r, abs(r["replayed_us"] * r["count"] - r["profiled_total_us"])) for r in done),
                    key=lambda x: -x[1])
    total = sum(r["profiled_total_us"] for r in rows)
    profiled = sum(r["profiled_total_us"] for r in done)
    return ModelFigures(sum(r["replayed_us"] * r["count"] for r in done), profiled, sum(e for _, e in errors),
                        profiled / total if total else 0.0, errors[:dominant])


@dataclass
class Bounds:
    """The model's sum under the chosen cache states beside its all-cold and all-hot sums, over the
    signatures replayed in all three: all cold reads every input from device memory, all hot every
    input from the L2, so the model, whose inputs are some of each, lies between."""

    signatures: int
    covered: float  # their share of the profile's time
    chosen: ModelFigures
    cold: ModelFigures
    hot: ModelFigures


def bounds(rows: list[dict], times: dict) -> Optional[Bounds]:
    """Bounds from TIMES ({signature id: {cache state: replayed us}}, backfill.replayed_by_state);
    None when no signature was replayed in both cold and hot.

    >>> rows = [{"id": 1, "status": "mapped", "cache": "resident", "count": 1, "profiled_total_us": 10.0}]
    >>> b = bounds(rows, {1: {"cold": 12.0, "hot": 8.0, "resident": 9.5}})
    >>> (b.cold.ratio, b.hot.ratio, b.chosen.ratio)
    (1.2, 0.8, 0.95)
    """
    both = [r for r in rows if r["status"] == "mapped"
            and {"cold", "hot", r.get("cache") or "cold"} <= set(times.get(r["id"], {}))]
    if not both:
        return None
    total = sum(r["profiled_total_us"] for r in rows)

    def under(pick) -> ModelFigures:
        return model_figures([{**r, "replayed_us": times[r["id"]][pick(r)]} for r in both])

    return Bounds(len(both), sum(r["profiled_total_us"] for r in both) / total if total else 0.0,
                  under(lambda r: r.get("cache") or "cold"), under(lambda r: "cold"), under(lambda r: "hot"))


def bounds_line(b: Optional[Bounds]) -> str:
    """The bounds in one sentence, or how to get them."""
    if b is None:
        return ("All-cold and all-hot bounds: not measured. Run each replay sweep again with --opperf-cache=cold "
                "and with --opperf-cache=hot (the rows are tagged all the same), then pass the results database to "
                "opperf replay-report --results.")
    return (f"Over the {b.signatures} signatures replayed all cold, all hot and in their chosen states "
            f"({100 * b.covered:.1f}% of the profiled time): sum ratio {b.chosen.ratio:.4f} in the chosen states, "
            f"between {b.hot.ratio:.4f} all hot and {b.cold.ratio:.4f} all cold (the model's inputs are some of each); "
            f"time-weighted |error| {100 * b.chosen.weighted_error:.1f}%, all hot {100 * b.hot.weighted_error:.1f}%, "
            f"all cold {100 * b.cold.weighted_error:.1f}%.")


@dataclass
class InContext:
    """Over the signatures replayed in sequence: the profile's sum, the in-sequence sum and, over
    those also replayed alone, the isolated sum beside the profile's sum of the same signatures."""

    signatures: int
    covered: float          # their share of the profile's time
    profiled_us: float
    sequence_us: float
    isolated: int           # of them, replayed alone too
    isolated_profiled_us: float
    isolated_sequence_us: float
    isolated_us: float
    furthest: list          # rows, context factor furthest from 1 first (at least FACTOR_MIN_SHARE of the time)


FACTOR_MIN_SHARE = 0.001


def in_context(rows: list[dict], top: int = 10) -> Optional[InContext]:
    """The in-sequence figures (see InContext); None before opperf sequence ran.

    >>> c = in_context([{"sequence_us": 11.0, "replayed_us": 10.0, "count": 2, "profiled_total_us": 21.0,
    ...                  "share": 0.7, "context_factor": 1.1},
    ...                 {"sequence_us": 3.0, "replayed_us": None, "count": 3, "profiled_total_us": 9.0,
    ...                  "share": 0.3, "context_factor": None}])
    >>> (c.profiled_us, c.sequence_us, c.isolated_profiled_us, c.isolated_us, len(c.furthest))
    (30.0, 31.0, 21.0, 20.0, 1)
    """
    seq = [r for r in rows if r.get("sequence_us") is not None]
    if not seq:
        return None
    total = sum(r["profiled_total_us"] for r in rows)
    both = [r for r in seq if r.get("replayed_us") is not None]
    factors = [r for r in both if r.get("context_factor") and (r.get("share") or 0) >= FACTOR_MIN_SHARE]
    factors.sort(key=lambda r: -abs(math.log(r["context_factor"])))
    return InContext(len(seq), sum(r["profiled_total_us"] for r in seq) / total if total else 0.0,
                     sum(r["profiled_total_us"] for r in seq), sum(r["sequence_us"] * r["count"] for r in seq),
                     len(both), sum(r["profiled_total_us"] for r in both),
                     sum(r["sequence_us"] * r["count"] for r in both), sum(r["replayed_us"] * r["count"] for r in both),
                     factors[:top])


def _context_lines(rows: list[dict], top: int) -> list[str]:
    c = in_context(rows, top)
    lines = ["", "## In context: the sequence replay", ""]
    if c is None:
        return lines + ["Not replayed in sequence yet (opperf sequence PROFILE_DB replays the calls in their order)."]
    lines += [f"Over the {c.signatures} signatures replayed in their recorded order ({100 * c.covered:.1f}% of the "
              f"profiled time): in-sequence {c.sequence_us:.1f} us against profiled {c.profiled_us:.1f} us, "
              f"a sum ratio of {c.sequence_us / c.profiled_us:.4f}." if c.profiled_us else "No profiled time."]
    if c.isolated:
        lines += ["", "| over the same calls | us | over the profile's |", "| --- | ---: | ---: |",
                  f"| profiled ({c.isolated} signatures replayed both ways) | {c.isolated_profiled_us:.1f} | 1.0000 |",
                  f"| in sequence | {c.isolated_sequence_us:.1f} | {_ratio(c.isolated_sequence_us, c.isolated_profiled_us)} |",
                  f"| isolated (the replay sweep) | {c.isolated_us:.1f} | {_ratio(c.isolated_us, c.isolated_profiled_us)} |"]
    if c.furthest:
        lines += ["", f"Context factors furthest from 1 (sequence_us / replayed_us; signatures of "
                      f"{100 * FACTOR_MIN_SHARE:g}% of the profile or more):", "",
                  "| op type | input shapes | cache | count | profiled us | in sequence us | isolated us | "
                  "context factor | share |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in c.furthest:
            lines.append(f"| `{r['op_type']}` | `{r['input_shapes']}` | {r.get('cache') or '-'} | {r['count']} | "
                         f"{r['profiled_us_mean']:.2f} | {r['sequence_us']:.2f} | {r['replayed_us']:.2f} | "
                         f"{r['context_factor']:.3f} | {100 * r['share']:.2f}% |")
    return lines


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.4f}" if b else "-"


def _model_lines(rows: list[dict], cache_bounds: Optional[Bounds] = None) -> list[str]:
    m = model_figures(rows)
    lines = ["", "## The model", ""]
    if m.ratio is None:
        lines.append("No signature is replayed yet (opperf backfill fills them).")
    else:
        lines.append(f"Over the replayed signatures ({100 * m.covered:.1f}% of the profiled time): replayed x count "
                     f"{m.replayed_sum_us:.1f} us against profiled {m.profiled_sum_us:.1f} us, a sum ratio of "
                     f"{m.ratio:.4f} ({100 * (m.ratio - 1):+.1f}%); time-weighted |error| "
                     f"{100 * m.weighted_error:.1f}% (fast and slow replays do not cancel in it).")
        lines += ["", "What dominates the |error|:", "", "| op type | input shapes | cache | profiled us x count | "
                  "replayed us x count | share of the error |", "| --- | --- | --- | ---: | ---: | ---: |"]
        for r, err in m.dominant:
            lines.append(f"| `{r['op_type']}` | `{r['input_shapes']}` | {r.get('cache') or '-'} | "
                         f"{r['profiled_total_us']:.1f} | {r['replayed_us'] * r['count']:.1f} | "
                         f"{100 * err / m.abs_error_us if m.abs_error_us else 0:.1f}% |")
        lines += ["", bounds_line(cache_bounds)]
    even = [r for r in rows if r["status"] == "mapped" and _EVEN in (r.get("note") or "")
            or "routed evenly" in (r.get("note") or "")]
    if even:
        us = sum(r["profiled_total_us"] for r in even)
        total = sum(r["profiled_total_us"] for r in rows) or 1.0
        lines += ["", f"Assumed: {len(even)} grouped-GEMM signature(s) ({100 * us / total:.1f}% of the profile) "
                      f"replay with tokens split evenly over the experts: the trace does not hold the routing. "
                      f"Profile inside pytest_opperf.pipeline.reading.capture to replay the routing that ran."]
    return lines


_EVEN = "equal groups"


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


def write(profile_db: Path, out_dir: Path, top: int = 30, cache_bounds: Optional[Bounds] = None) -> tuple[Path, Path]:
    """``replay_report.md`` and ``duration_gap.csv`` in OUT_DIR; returns their paths. CACHE_BOUNDS:
    the all-cold and all-hot sums beside the estimate (see bounds), when measured."""
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
                             r["replayed_timer"] or "", r.get("cache") or "", _num(r.get("sequence_us")),
                             _num(r.get("context_factor")), r["note"] or r["reason"] or ""])
    md_path.write_text(markdown(rows, profile_db, top, cache_bounds))
    return md_path, csv_path


def markdown(rows: list[dict], source: Path, top: int = 30, cache_bounds: Optional[Bounds] = None) -> str:
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
    lines += _model_lines(rows, cache_bounds)
    lines += _context_lines(rows, min(top, 10))
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
