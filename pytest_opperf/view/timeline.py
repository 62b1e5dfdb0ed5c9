"""`opperf timeline`: a swimlane of a sweep - which case ran when on which worker and GPU, and its phases.

Each stored row carries when its case began and ended on the host's clock (`started_unix_s`,
`ended_unix_s`) and where its time went (`phase_*_ms`, measure/phases.py). One lane per xdist
worker and GPU; one bar per case, split into its phases in the order they begin (set-up, inputs,
check, warm-up, device state, sampling, timed-call check, record), and a grey rest for the time
in no phase (pytest's own work). The device-state readings happen before and after sampling;
the bar draws them as one piece, so each bar's phases read left to right in one colour each.

Two outputs: PNG (matplotlib, the [plot] extra) and a self-contained HTML page whose SVG is
written here, with the case's id and phases as each bar's tooltip (no matplotlib needed).

>>> sweep = load(Path("results/h100.db"))                 # doctest: +SKIP
>>> write(sweep, Path("timeline.html"))                   # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pytest_opperf.measure.phases import LABELS, PHASES, totals, wall_ms
from pytest_opperf.view.source import Results, ViewError, case_id

# One colour per phase (colour-blind-safe Okabe-Ito order), and grey for the rest.
COLOURS = {"setup": "#999933", "inputs": "#E69F00", "check": "#D55E00", "warmup": "#F0E442",
           "devstate": "#CC79A7", "sampling": "#0072B2", "verify": "#56B4E9", "record": "#009E73"}
OTHER = "#DDDDDD"
STARTUP = "#F4F4F4"  # the session's start-up before a lane's first case
FORMATS = (".html", ".png")


@dataclass
class Bar:
    """One case on the timeline: start and end in seconds from the sweep's start, its phases in ms."""

    lane: str
    label: str  # op: case id
    start_s: float
    end_s: float
    phase_ms: dict[str, float]


@dataclass
class Sweep:
    database: Path
    run_id: str
    run: dict
    bars: list[Bar] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # the stored rows drawn, for the totals
    started: bool = False  # x = 0 is the session's start (the runs row has it), not its first case

    def startup_s(self, lane: str) -> float:
        """Seconds from the session's start to the lane's first case (0 without the session's start)."""
        return min(b.start_s for b in self.bars if b.lane == lane) if self.started else 0.0

    @property
    def lanes(self) -> list[str]:
        return sorted({b.lane for b in self.bars}, key=_lane_order)

    @property
    def span_s(self) -> float:
        return max((b.end_s for b in self.bars), default=0.0)


def load(path: Path, run_id: Optional[str] = None) -> Sweep:
    """The rows of one run (default: the latest run with timed rows) placed on a common clock."""
    results = Results.open(path)
    rows: list[dict] = []
    for op in results.ops:
        table = results.table(op)
        if "started_unix_s" not in table.columns:
            continue
        for row in table.rows:
            if wall_ms(row) is not None:
                rows.append({**row, "_label": f"{op}: {case_id(row, table.params)}"})
    if not rows:
        raise ViewError(f"{path}: no row has the timeline columns (started_unix_s, ended_unix_s): "
                        f"they are written by pytest-opperf from this version on; run the sweep again")
    runs = {r["run_id"] for r in rows}
    if run_id is None:
        run_id = max(runs, key=lambda r: max(x["started_unix_s"] for x in rows if x["run_id"] == r))
    elif run_id not in runs:
        raise ViewError(f"--run={run_id}: no timed rows of that run in {path} (runs with timed rows: "
                        f"{', '.join(sorted(runs))})")
    rows = [r for r in rows if r["run_id"] == run_id]
    origin = min(r["started_unix_s"] for r in rows)
    run = results.runs.get(run_id, {})
    session_start = run.get("started_unix_s")
    started = isinstance(session_start, (int, float)) and session_start <= origin
    sweep = Sweep(Path(path), run_id, run, rows=rows, started=started)
    origin = session_start if started else origin
    for r in sorted(rows, key=lambda r: r["started_unix_s"]):
        phase_ms = {p: r.get(f"phase_{p}_ms") or 0.0 for p in PHASES}
        sweep.bars.append(Bar(_lane(r), r["_label"], r["started_unix_s"] - origin, r["ended_unix_s"] - origin, phase_ms))
    return sweep


def _lane(row: dict) -> str:
    worker = row.get("worker") or "main"
    return f"{worker} / GPU {row['gpu']}" if row.get("gpu") is not None else worker


def _lane_order(lane: str) -> tuple:
    head = lane.split(" ")[0]
    digits = head[2:] if head.startswith("gw") else ""
    return (0, int(digits), lane) if digits.isdigit() else (1, 0, lane)


def segments(bar: Bar) -> list[tuple[str, float, float]]:
    """(phase or 'other', start s, length s) for a bar, the phases back to back from its start,
    the rest of its wall time last. Phases that add up past the wall time (clock reads apart by
    microseconds) are cut at the bar's end.

    >>> [(p, round(s, 3), round(n, 3)) for p, s, n in segments(Bar("main", "x", 1.0, 1.1, {"check": 20.0, "sampling": 50.0}))]
    [('check', 1.0, 0.02), ('sampling', 1.02, 0.05), ('other', 1.07, 0.03)]
    """
    out, at = [], bar.start_s
    for phase in PHASES:
        length = min(bar.phase_ms.get(phase, 0.0) / 1e3, bar.end_s - at)
        if length > 0:
            out.append((phase, at, length))
            at += length
    if bar.end_s - at > 0:
        out.append(("other", at, bar.end_s - at))
    return out


def write(sweep: Sweep, output: Path) -> Path:
    """Draw the sweep to output: .html (self-contained) or .png (needs matplotlib)."""
    suffix = output.suffix.lower()
    if suffix not in FORMATS:
        raise ViewError(f"-o {output}: the timeline is written as {' or '.join(FORMATS)}, by the file's suffix")
    output.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".png":
        _png(sweep, output)
    else:
        output.write_text(page(sweep), encoding="utf-8")
    return output


def _png(sweep: Sweep, output: Path) -> None:
    from pytest_opperf.view.plots import _figure

    lanes = sweep.lanes
    fig = _figure(12, 1.6 + 0.45 * len(lanes))
    ax = fig.add_subplot()
    for i, lane in enumerate(lanes):
        ax.broken_barh([(0, sweep.startup_s(lane))], (i - 0.4, 0.8), facecolors=STARTUP, edgecolor="#BBBBBB",
                       hatch="//", linewidth=0)
        pieces: dict[str, list] = {}
        for bar in sweep.bars:
            if bar.lane == lane:
                for phase, start, length in segments(bar):
                    pieces.setdefault(phase, []).append((start, length))
        for phase, spans in pieces.items():
            ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=COLOURS.get(phase, OTHER), linewidth=0)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlim(0, max(sweep.span_s, 1e-3))
    ax.set_xlabel("seconds from the session's start" if sweep.started else "seconds from the sweep's first case")
    ax.set_title(_title(sweep))
    from matplotlib.patches import Patch

    handles = [Patch(color=COLOURS[p], label=LABELS[p]) for p in PHASES] + [Patch(color=OTHER, label="other")]
    if sweep.started:
        handles.insert(0, Patch(facecolor=STARTUP, edgecolor="#BBBBBB", hatch="//", label="start-up"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.savefig(output, dpi=120)


def _title(sweep: Sweep) -> str:
    device = sweep.run.get("device") or sweep.database.stem
    return (f"{device}: run {sweep.run_id}, {len(sweep.bars)} cases, lanes: {len(sweep.lanes)}, "
            f"in {sweep.span_s:.1f} s")


# --- HTML ----------------------------------------------------------------------------------

LANE_PX, LEFT_PX, WIDTH_PX = 28, 150, 1100


def svg(sweep: Sweep) -> str:
    """The swimlane as an <svg> element: a rect per phase of each case, the case's tooltip on its group."""
    lanes = sweep.lanes
    span = max(sweep.span_s, 1e-3)
    scale = WIDTH_PX / span
    height = LANE_PX * len(lanes) + 30
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{LEFT_PX + WIDTH_PX + 10}' height='{height}' "
             f"font-family='sans-serif' font-size='11'>"]
    for i, lane in enumerate(lanes):
        y = i * LANE_PX
        parts.append(f"<text x='4' y='{y + LANE_PX * 0.65:.1f}'>{html.escape(lane)}</text>")
        startup = sweep.startup_s(lane)
        if startup > 0:
            parts.append(f"<rect x='{LEFT_PX}' y='{y + 3}' width='{startup * scale:.2f}' height='{LANE_PX - 6}' "
                         f"fill='{STARTUP}' stroke='#BBBBBB'><title>{html.escape(lane)}: start-up, "
                         f"{startup:.2f} s from the session's start to its first case</title></rect>")
    row_of = {lane: i for i, lane in enumerate(lanes)}
    for bar in sweep.bars:
        y = row_of[bar.lane] * LANE_PX + 3
        parts.append(f"<g><title>{html.escape(_tooltip(bar))}</title>")
        for phase, start, length in segments(bar):
            parts.append(f"<rect x='{LEFT_PX + start * scale:.2f}' y='{y}' width='{max(length * scale, 0.3):.2f}' "
                         f"height='{LANE_PX - 6}' fill='{COLOURS.get(phase, OTHER)}'/>")
        parts.append("</g>")
    axis_y = LANE_PX * len(lanes) + 14
    for k in range(6):
        t = span * k / 5
        parts.append(f"<text x='{LEFT_PX + t * scale:.1f}' y='{axis_y}' text-anchor='middle'>{t:.3g} s</text>")
    parts.append("</svg>")
    return "".join(parts)


def _tooltip(bar: Bar) -> str:
    wall = (bar.end_s - bar.start_s) * 1e3
    phases = ", ".join(f"{LABELS[p]} {bar.phase_ms[p]:.1f}" for p in PHASES if bar.phase_ms.get(p))
    return f"{bar.label}\n{bar.lane}, {bar.start_s:.3f}-{bar.end_s:.3f} s, wall {wall:.1f} ms\n{phases} ms"


def page(sweep: Sweep) -> str:
    """The whole HTML page: title, the swimlane, its legend and where the time went in total."""
    t = totals(sweep.rows)
    legend = "".join(f"<span class='key'><i style='background:{COLOURS[p]}'></i>{LABELS[p]}</span>" for p in PHASES)
    legend += f"<span class='key'><i style='background:{OTHER}'></i>other</span>"
    if sweep.started:
        legend = f"<span class='key'><i style='background:{STARTUP};border:1px solid #BBB'></i>start-up</span>" + legend
        startups = ", ".join(f"{html.escape(lane)} {sweep.startup_s(lane):.2f} s" for lane in sweep.lanes)
        legend += f"<p>Start-up, from the session's start to each lane's first case: {startups}.</p>"
    cells = "".join(f"<tr><td>{LABELS[p]}</td><td>{t[p] / 1e3:.2f}</td><td>{_share(t[p], t['wall'])}</td></tr>"
                    for p in PHASES)
    cells += f"<tr><td>other</td><td>{t['other'] / 1e3:.2f}</td><td>{_share(t['other'], t['wall'])}</td></tr>"
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    title = html.escape(_title(sweep))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
.key {{ margin-right: 1.2em; font-size: 0.9em; white-space: nowrap; }}
.key i {{ display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.3em; vertical-align: middle; }}
table {{ border-collapse: collapse; margin-top: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
.svg {{ overflow-x: auto; margin-top: 0.8em; }}
</style></head><body>
<h1>{title}</h1>
<p>{html.escape(str(sweep.database))}, written {stamp}. One lane per worker and GPU, one bar per case; hover a
bar for its case and phases. Phases are drawn back to back in the order they begin; grey is time in none.</p>
<div>{legend}</div>
<div class="svg">{svg(sweep)}</div>
<table><thead><tr><th>phase</th><th>seconds, all cases</th><th>share of their wall time</th></tr></thead>
<tbody>{cells}</tbody></table>
</body></html>
"""


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "-"
