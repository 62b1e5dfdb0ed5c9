"""`opperf plot`: figures of an op's rows, made with matplotlib (the `[plot]` extra).

Every function returns a matplotlib Figure (on the Agg canvas, never pyplot's global state), so
a caller saves it, embeds it, or inspects its axes:

- roofline(table, spec, device): arithmetic intensity (FLOP/byte) against achieved FLOP/s, both
  log, one point per row coloured by backend, under the device's compute and bandwidth roofs;
- lines(table, x=None, y="time_us"): a line per backend over one swept parameter, one panel per
  combination of the other parameters (and dtypes), as triton's perf_report draws them;
- speedup(table, a, b): per shape, backend A's speedup over backend B (B's time / A's time);
- devices(table_a, table_b): per case of the same key in both databases, B's speedup over A.

>>> fig = roofline(Results.open(Path("results/h100.db")).table("gemm"), load_specs()["h100"], "h100")  # doctest: +SKIP
>>> save(fig, Path("plots"), "gemm-roofline-h100", ["png", "svg"])                                      # doctest: +SKIP
[PosixPath('plots/gemm-roofline-h100.png'), PosixPath('plots/gemm-roofline-h100.svg')]
"""

from __future__ import annotations

import io
import math
import re
from collections import Counter
from pathlib import Path
from typing import Optional

from pytest_opperf.columns import key_columns
from pytest_opperf.view import significance
from pytest_opperf.view.source import OpTable, ViewError, best_by_shape, case_id, knobs_of, sort_key

KINDS = ("roofline", "lines", "speedup", "devices")
FORMATS = ("png", "svg")
METRICS = {"time_us": "time per call (us, median)", "gflops": "GFLOP/s", "gbytes_per_s": "GB/s",
           "mfu": "MFU (fraction of peak FLOP/s)", "mbu": "MBU (fraction of peak bandwidth)"}
MARKERS = "osD^v<>ph*"
NOT_SIGNIFICANT = "0.65"  # the grey of a ratio that noise could explain


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ViewError("plots need matplotlib: pip install 'pytest-opperf[plot]'") from None


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colours(names: list[str]) -> dict[str, str]:
    """A fixed colour per name (backend), the same in every figure of the op."""
    palette = [f"C{i}" for i in range(10)]
    return {name: palette[i % len(palette)] for i, name in enumerate(sorted(names))}


def _dtype(row: dict) -> str:
    return row["dtype_in"] if row["dtype_in"] == row["dtype_out"] else f"{row['dtype_in']}-{row['dtype_out']}"


# --- roofline ---------------------------------------------------------------------------------

# One line style per dtype's roof: gemm draws five (bf16, fp16, fp32, fp8, int8).
ROOF_STYLES = ("-", "--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)))


def roofline(table: OpTable, spec, device: str, calibration=None):
    """The op's rows measured on `device` against its roofs; `spec` is its HardwareSpec or None.

    With `calibration` (the device's measured ceilings, hardware/calibrate.py) its roofs are
    drawn too, dashed, under the datasheet's.
    """
    rows = [r for r in table.rows if r["device"] == device and _positive(r, "flops", "bytes", "time_us")]
    if not rows:
        raise ViewError(f"{table.source}: op {table.op!r} has no row on {device} with flops, bytes and time "
                        f"above zero: nothing to place on a roofline")
    fig = _figure(8, 5.5)
    ax = fig.add_subplot()
    colours = _colours(table.distinct("backend"))
    dtypes = sorted({_dtype(r) for r in rows})
    xs = [r["flops"] / r["bytes"] for r in rows]
    lo, hi = min(xs) / 2, max(xs) * 2
    for backend in sorted({r["backend"] for r in rows}):
        for i, dt in enumerate(dtypes):
            points = [(r["flops"] / r["bytes"], r["flops"] / (r["time_us"] * 1e-6)) for r in rows
                      if r["backend"] == backend and _dtype(r) == dt]
            if points:
                ax.scatter(*zip(*points), color=colours[backend], marker=MARKERS[i % len(MARKERS)],
                           label=f"{backend} {dt}", zorder=3, alpha=0.85, edgecolors="none")
    roofs, missing = _roofs(rows, spec)
    bw = spec.mem_bw_bytes_per_s if spec is not None else None
    for _, peak in roofs:
        if bw:
            lo, hi = min(lo, peak / bw / 4), max(hi, peak / bw * 4)
    measured = _measured_roofs(rows, calibration)
    mbw = calibration.mem_bytes_per_s if calibration is not None else None
    for _, peak in measured:
        if mbw:
            lo, hi = min(lo, peak / mbw / 4), max(hi, peak / mbw * 4)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for (label, peak), style in zip(roofs, ROOF_STYLES * 4):
        ys = [min(peak, bw * x) if bw else peak for x in grid]
        ax.plot(grid, ys, color="0.25", linestyle=style, linewidth=1.2, label=label, zorder=2)
    if bw and not roofs:
        ax.plot(grid, [bw * x for x in grid], color="0.25", linewidth=1.2,
                label=f"memory {spec.mem_bw_gbytes_per_s:g} GB/s", zorder=2)
    for label, peak in measured:
        ax.plot(grid, [min(peak, mbw * x) if mbw else peak for x in grid], color="darkred", linestyle="--",
                linewidth=1.2, label=label + (f", {mbw / 1e9:.4g} GB/s" if mbw else ""), zorder=2)
    if mbw and not measured:
        ax.plot(grid, [mbw * x for x in grid], color="darkred", linestyle="--", linewidth=1.2,
                label=f"measured memory {mbw / 1e9:.4g} GB/s", zorder=2)
    if hi / lo < 10:  # at least a decade, so the axis has a labelled tick
        middle = math.sqrt(lo * hi)
        lo, hi = middle / math.sqrt(10), middle * math.sqrt(10)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    title = f"{table.op} roofline on {device}"
    if spec is not None and spec.name != device:
        title += f" ({spec.name} peaks)"
    if missing:
        title += f"\n{missing}" + ("" if roofs or bw or measured or mbw else ": points only")
    if calibration is not None:
        title += f"\nmeasured roofs (dashed): calibration {calibration.id} of {calibration.created_at[:10]}"
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def _plain_log_ticks(axis) -> None:
    """Label a log axis at 1, 2, 5 of each decade as plain numbers (0.5, 1, 2, 5, 10, 1M), not 10^k."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: tick_label(v)))
    axis.set_minor_formatter(NullFormatter())


def tick_label(value: float) -> str:
    """A tick's number as a person reads it: as is below 10,000; above, a whole power-of-two
    multiple (a swept size) in Ki, Mi, Gi, else k, M, G to three figures; never 1.04858e+06.

    >>> [tick_label(v) for v in (512, 4096, 16384, 1048576, 1e6, 2.5e9, 0.5, 12345)]
    ['512', '4096', '16Ki', '1Mi', '1M', '2.5G', '0.5', '12.3k']
    """
    v = float(value)
    if abs(v) < 10_000:
        return f"{v:g}"
    if v.is_integer():
        for unit, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
            if int(v) % (1 << shift) == 0:
                return f"{int(v) >> shift}{unit}"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:g}"


def _positive(row: dict, *columns: str) -> bool:
    return all(isinstance(row.get(c), (int, float)) and row[c] > 0 for c in columns)


def _measured_roofs(rows: list[dict], calibration) -> list[tuple[str, float]]:
    """[(legend label, measured FLOP/s ceiling)] for the peaks the rows' attainable MFU uses."""
    if calibration is None:
        return []
    wanted = sorted({(r.get("peak_kind") or "matrix", r.get("peak_dtype") or r["dtype_in"]) for r in rows})
    roofs = []
    for kind, dtype in wanted:
        peak = calibration.peak_flops(dtype, kind)
        if peak is not None:
            roofs.append((f"measured {dtype} {kind} {peak / 1e12:.4g} TFLOP/s", peak))
    return roofs


def measured_ceilings(path: Path, device: str):
    """The newest calibration of `device` in the database at path, or None (none, or unreadable)."""
    from pytest_opperf.store import ceilings
    from pytest_opperf.store.database import StorageError

    try:
        return ceilings.latest(path, device)
    except StorageError:
        return None


def _roofs(rows: list[dict], spec) -> tuple[list[tuple[str, float]], str]:
    """[(legend label, peak FLOP/s)] of the peaks the rows' MFU uses, and what is missing."""
    if spec is None:
        return [], "no hardware spec for this device"
    bw = spec.mem_bw_bytes_per_s
    wanted = sorted({(r.get("peak_kind") or "matrix", r.get("peak_dtype") or r["dtype_in"]) for r in rows})
    roofs, lacking = [], []
    for kind, dtype in wanted:
        peak = spec.peak_flops(dtype, kind)
        if peak is None:
            lacking.append(f"{dtype} {kind}")
            continue
        label = f"{dtype} {kind} peak {peak / 1e12:g} TFLOP/s"
        roofs.append((label + (f", {spec.mem_bw_gbytes_per_s:g} GB/s" if bw else ""), peak))
    if not roofs and not bw:
        return [], f"the {spec.name} spec has no peaks"
    missing = []
    if lacking:
        missing.append(f"no {', '.join(lacking)} peak")
    if not bw:
        missing.append("no memory bandwidth")
    return roofs, f"the {spec.name} spec has " + " and ".join(missing) if missing else ""


# --- lines ------------------------------------------------------------------------------------


def default_x(table: OpTable) -> str:
    """The parameter with the most distinct values (the first of those in the op's order)."""
    if not table.params:
        raise ViewError(f"{table.source}: op {table.op!r} has no parameter columns to draw lines over")
    return max(table.params, key=lambda p: (len(table.distinct(p)), -table.params.index(p)))


def lines(table: OpTable, x: Optional[str] = None, y: str = "time_us", max_panels: int = 12):
    """A line per backend over parameter `x`; one panel per combination of what else varies."""
    x = x or default_x(table)
    if x not in table.params:
        raise ViewError(f"--x={x}: op {table.op!r} has no parameter {x!r} (parameters: {', '.join(table.params)})")
    if y not in METRICS:
        raise ViewError(f"--y={y}: expected one of {', '.join(METRICS)}")
    rows = [r for r in table.rows if r.get(y) is not None and r.get(x) is not None]
    if not rows:
        raise ViewError(f"{table.source}: op {table.op!r} has no row with {x} and {y}")
    movers = [p for p in table.params if p != x and _follows(rows, x, p)]
    fixed_cols = [c for c in [*table.params, "dtype", "timer", "cache"] if c != x and c not in movers]
    varying = [c for c in fixed_cols if len({_cell(r, c) for r in rows}) > 1]
    constant = [c for c in fixed_cols if c not in varying]
    panels: dict[tuple, list[dict]] = {}
    for row in sorted(rows, key=lambda r: sort_key(r, table.params)):
        panels.setdefault(tuple(_cell(row, c) for c in varying), []).append(row)
    shown = list(panels.items())[:max_panels]
    ncols = 2 if len(shown) == 4 else min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig = _figure(4.6 * ncols + 0.6, 3.4 * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    colours = _colours(table.distinct("backend"))
    xlog = _wide(r[x] for r in rows)
    ylog = _wide(r[y] for r in rows)
    label_of = _line_labeller(rows)
    for ax, (values, panel_rows) in zip(axes.flat, shown):
        series: dict[str, list[dict]] = {}
        for row in panel_rows:
            series.setdefault(label_of(row), []).append(row)
        for label, points in sorted(series.items()):
            points.sort(key=lambda r: r[x])
            colour = colours[points[0]["backend"]]
            ax.plot([r[x] for r in points], [r[y] for r in points], marker="o", markersize=4, color=colour,
                    label=label)
            bands = [(r[x], spread(r, y)) for r in points]
            bands = [(xv, band) for xv, band in bands if band is not None]
            if bands:
                ax.fill_between([xv for xv, _ in bands], [b[0] for _, b in bands], [b[1] for _, b in bands],
                                color=colour, alpha=0.18, linewidth=0)
        ax.set_title(", ".join(_shown(c, v) for c, v in zip(varying, values)) or table.op, fontsize="medium")
        ax.set_xlabel(x + (f" ({', '.join(movers)} with it)" if movers else ""))
        ax.set_ylabel(METRICS[y])
        if xlog:
            ax.set_xscale("log", base=2)
        _tick_at_values(ax, sorted({r[x] for r in panel_rows}))
        if ylog:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    title = f"{table.op}: {METRICS[y]} over {x}"
    same = ", ".join(_shown(c, _cell(rows[0], c)) for c in constant)
    if same:
        title += f"\n{same}"
    if len(panels) > len(shown):
        title += f"\n(first {len(shown)} of {len(panels)} panels: --max-panels N)"
    title += "\nbands: " + ("p5-p95 of the samples" if any(r.get("time_us_p5") is not None for r in rows)
                            else "the median's 95% confidence interval")
    fig.suptitle(title)
    return fig


def spread(row: dict, y: str) -> Optional[tuple[float, float]]:
    """(low, high) of metric y for the row's band: p5-p95 of the time where both are stored, else
    the median's 95% CI; a throughput moves inversely with the time. None without either.

    >>> spread({"time_us": 10.0, "ci_rel": 0.1, "gflops": 100.0}, "time_us")
    (9.0, 11.0)
    >>> [round(v, 2) for v in spread({"time_us": 10.0, "ci_rel": 0.1, "gflops": 100.0}, "gflops")]
    [90.91, 111.11]
    """
    t = row.get("time_us")
    if not t or row.get(y) is None:
        return None
    if row.get("time_us_p5") is not None and row.get("time_us_p95") is not None:
        low_t, high_t = row["time_us_p5"], row["time_us_p95"]
    elif row.get("ci_rel") is not None:
        low_t, high_t = t * (1 - row["ci_rel"]), t * (1 + row["ci_rel"])
    else:
        return None
    if y == "time_us":
        return low_t, high_t
    if low_t <= 0:
        return None
    return row[y] * t / high_t, row[y] * t / low_t


def _cell(row: dict, column: str):
    return _dtype(row) if column == "dtype" else row[column]


def _shown(column: str, value) -> str:
    return str(value) if column == "dtype" else f"{column}={value}"


def _tick_at_values(ax, values: list) -> None:
    """A few swept values label their own ticks (4096, not 2^12)."""
    from matplotlib.ticker import NullFormatter

    numbers = [v for v in values if isinstance(v, (int, float))]
    if numbers and len(numbers) == len(values) and len(values) <= 10:
        ax.set_xticks(numbers, [tick_label(v) for v in numbers])
        ax.xaxis.set_minor_formatter(NullFormatter())


def _follows(rows: list[dict], x: str, p: str) -> bool:
    """p is set by x (a zipped sweep: m=n=k): each value of x comes with one value of p."""
    seen: dict = {}
    for row in rows:
        if seen.setdefault(row[x], row[p]) != row[p]:
            return False
    return len(set(seen.values())) > 1


def _wide(values) -> bool:
    """A sweep spanning a factor of 16 or more reads best on a log axis."""
    vals = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return bool(vals) and max(vals) / min(vals) >= 16


def _line_labeller(rows: list[dict]):
    """A line per backend; its version and knobs join the label only where they differ."""
    versions = Counter((r["backend"], r["backend_version"]) for r in rows)
    several = {b for b, _ in versions if sum(1 for bb, _ in versions if bb == b) > 1}

    def label(row: dict) -> str:
        text = row["backend"]
        if row["backend"] in several:
            text += f" {row['backend_version']}"
        knobs = knobs_of(row)
        if knobs:
            text += " " + ",".join(f"{k}={v}" for k, v in knobs.items())
        return text

    return label


# --- speedup and device vs device -------------------------------------------------------------


def default_pair(table: OpTable, a: Optional[str], b: Optional[str]) -> tuple[str, str]:
    """(A, B): B defaults to torch (the reference implementation), A to the first other backend."""
    backends = table.distinct("backend")
    for flag, name in (("--a", a), ("--b", b)):
        if name is not None and name not in backends:
            raise ViewError(f"{flag}={name}: op {table.op!r} has no backend {name!r} in {table.source} "
                            f"(backends: {', '.join(backends)})")
    if len(backends) < 2:
        raise ViewError(f"{table.source}: op {table.op!r} has one backend ({', '.join(backends)}): a speedup "
                        f"needs two")
    if b is None:
        b = "torch" if "torch" in backends and a != "torch" else next(n for n in backends if n != a)
    if a is None:
        a = next(n for n in backends if n != b)
    if a == b:
        raise ViewError(f"--a and --b are both {a!r}: name two backends")
    return a, b


def speedup(table: OpTable, a: Optional[str] = None, b: Optional[str] = None, max_cases: int = 60):
    """Per shape run by both: A's speedup over B (B's time / A's time; above 1: A is faster)."""
    a, b = default_pair(table, a, b)
    labels, ratios, doubts = [], [], []
    for per_backend in best_by_shape(table).values():
        if a in per_backend and b in per_backend:
            labels.append(case_id(per_backend[a], table.params, backend=False))
            ratios.append(per_backend[b]["time_us"] / per_backend[a]["time_us"])
            doubts.append(significance.why_not(per_backend[a], per_backend[b]))
    if not labels:
        raise ViewError(f"{table.source}: op {table.op!r}: no shape was run by both {a} and {b}")
    devices = ", ".join(table.distinct("device"))
    return _ratio_bars(labels, ratios, f"speedup of {a} over {b}\n({b} time / {a} time)",
                       f"{table.op}: {a} against {b} on {devices}", max_cases, doubts)


def devices(table_a: OpTable, table_b: OpTable, max_cases: int = 60):
    """Per case whose whole unique key is in both tables: B's speedup over A (A's time / B's time)."""
    if table_a.params != table_b.params:
        raise ViewError(f"op {table_a.op!r}: parameters {table_a.params} in {table_a.source} but "
                        f"{table_b.params} in {table_b.source}: not the same cases")
    key = key_columns(table_a.params)
    theirs = {tuple(r[c] for c in key): r for r in table_b.rows if r.get("time_us")}
    pairs = sorted(((r, theirs[tuple(r[c] for c in key)]) for r in table_a.rows
                    if r.get("time_us") and tuple(r[c] for c in key) in theirs),
                   key=lambda pair: sort_key(pair[0], table_a.params))
    if not pairs:
        raise ViewError(f"op {table_a.op!r}: no case is in both {table_a.source} and {table_b.source} "
                        f"(matched on {', '.join(key)})")
    name_a, name_b = _device_names(table_a, table_b)
    labels = [case_id(ra, table_a.params) for ra, _ in pairs]
    ratios = [ra["time_us"] / rb["time_us"] for ra, rb in pairs]
    doubts = [significance.why_not(ra, rb) for ra, rb in pairs]
    return _ratio_bars(labels, ratios, f"speedup of {name_b} over {name_a}\n({name_a} time / {name_b} time)",
                       f"{table_a.op}: {name_b} against {name_a}, {len(pairs)} cases in both", max_cases, doubts)


def _device_names(table_a: OpTable, table_b: OpTable) -> tuple[str, str]:
    a, b = ",".join(table_a.distinct("device")), ",".join(table_b.distinct("device"))
    if a == b:  # two runs of one device: the files tell them apart
        fa, fb = table_a.source.name, table_b.source.name
        if fa == fb:
            fa, fb = f"{table_a.source.parent.name}/{fa}", f"{table_b.source.parent.name}/{fb}"
        a, b = f"{a} ({fa})", f"{b} ({fb})"
    return a, b


def _ratio_bars(labels: list[str], ratios: list[float], xlabel: str, title: str, max_cases: int,
                doubts: list[Optional[str]]):
    """Horizontal bars from 1.0 to each ratio on a log axis: faster to the right, slower to the left.

    A ratio whose rows do not differ significantly (doubts: significance.why_not per bar) is a
    grey bar labelled "~1.05x", whatever its size: noise is not drawn as a speedup.
    """
    total = len(labels)
    labels, ratios, doubts = labels[:max_cases], ratios[:max_cases], doubts[:max_cases]
    from matplotlib.ticker import FuncFormatter

    fig = _figure(9, 1.4 + 0.28 * len(labels))
    ax = fig.add_subplot()
    ys = list(range(len(labels)))[::-1]
    colours = [NOT_SIGNIFICANT if d else "C2" if r >= 1 else "C3" for r, d in zip(ratios, doubts)]
    ax.barh(ys, [r - 1 for r in ratios], left=1, color=colours, height=0.7)
    ax.axvline(1.0, color="0.2", linewidth=1)
    ax.set_yticks(ys, labels, fontsize="small")
    ax.set_xscale("log")
    span = max(max(ratios), 1 / min(ratios), 1.25)
    ax.set_xlim(1 / span ** 1.25, span ** 1.25)
    for y, r, d in zip(ys, ratios, doubts):
        ax.annotate(significance.ratio_text(r, d), (r, y), xytext=(3 if r >= 1 else -3, 0), textcoords="offset points",
                    ha="left" if r >= 1 else "right", va="center", fontsize="x-small")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel(xlabel)
    if total > len(labels):
        title += f"\n(first {len(labels)} of {total}: --max-cases N)"
    if any(doubts):
        title += (f"\ngrey, {significance.MARK}: not significant ({sum(1 for d in doubts if d)} of {len(doubts)}: "
                  f"CIs overlap, or a row unstable, contended or without a CI)")
    ax.set_title(title)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    return fig


# --- output -----------------------------------------------------------------------------------


def save(fig, out_dir: Path, stem: str, formats: list[str]) -> list[Path]:
    """Write the figure as out_dir/stem.<format> for each format; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.=-]+", "_", stem)
    paths = []
    for form in formats:
        path = out_dir / f"{stem}.{form}"
        fig.savefig(path, format=form, dpi=110)
        paths.append(path)
    return paths


def svg(fig) -> str:
    """The figure as an <svg> element to inline in HTML, its text kept as text."""
    from matplotlib import rc_context

    buffer = io.StringIO()
    with rc_context({"svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def plot_files(paths: list[Path], kind: str, ops: Optional[list[str]], out_dir: Path, formats: list[str],
               specs: dict, **options) -> tuple[list[Path], list[str]]:
    """`opperf plot`: draw `kind` for the ops asked (every op when None) of each database (of the
    pair, for kind devices) and write them under out_dir. Returns (files written, skipped ops with
    the reason): an op asked for by name that cannot be drawn is an error instead.

    options: x, y and max_panels (lines), a, b and max_cases (speedup; max_cases for devices too).
    """
    if kind not in KINDS:
        raise ViewError(f"--kind={kind}: expected one of {', '.join(KINDS)}")
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ViewError(f"--format={','.join(formats)}: expected a comma-separated list of {', '.join(FORMATS)}")
    require_matplotlib()
    from pytest_opperf.view.source import Results

    opened = [Results.open(p) for p in paths]
    if kind == "devices" and len(opened) != 2:
        raise ViewError(f"--kind=devices compares two databases; got {len(opened)}")
    written: list[Path] = []
    skipped: list[str] = []

    def draw(stem: str, make) -> None:
        try:
            fig = make()
        except ViewError as exc:
            if ops:
                raise
            skipped.append(f"{stem}: {exc}")
            return
        written.extend(save(fig, out_dir, stem, formats))

    if kind == "devices":
        first, second = opened
        for op in first.pick(ops) if ops else [o for o in first.ops if o in second.tables]:
            second.pick([op])
            draw(f"{op}-devices-{first.path.stem}-vs-{second.path.stem}",
                 lambda op=op: devices(first.table(op), second.table(op), options.get("max_cases", 60)))
        return written, skipped
    for results in opened:
        for op in results.pick(ops):
            table = results.table(op)
            if kind == "roofline":
                for device in table.distinct("device"):
                    stem = f"{op}-roofline-{results.path.stem}" + ("" if device == results.path.stem else f"-{device}")
                    draw(stem, lambda t=table, d=device: roofline(t, specs.get(d), d,
                                                                  measured_ceilings(results.path, d)))
            elif kind == "lines":
                draw(f"{op}-lines-{results.path.stem}", lambda t=table: lines(
                    t, options.get("x"), options.get("y") or "time_us", options.get("max_panels", 12)))
            else:
                draw(f"{op}-speedup-{results.path.stem}", lambda t=table: speedup(
                    t, options.get("a"), options.get("b"), options.get("max_cases", 60)))
    return written, skipped
