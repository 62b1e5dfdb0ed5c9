"""Which limit an op hits: from its formulas at the shipped shapes, and from a measured database.

`roofline_*`: nothing measured. Every case the shipped configs sweep on a device gives the op's
FLOPs and minimal bytes (the op's own formulas, as the rows' `flops` and `bytes`). Their ratio,
the arithmetic intensity, is set against the device's ridge point: the peak MFU is taken against
(the op's matrix or vector units, in the case's input dtype) over the memory bandwidth, from
hardware/data/hardware.yaml. Below the ridge a case is memory-bound: no kernel beats
bytes / bandwidth. Above, compute-bound: FLOPs / peak. That bound time is the roofline.

`diagnose`: a results database. Per op table, its largest shape (by roofline time), its fastest
backend there, the fraction of the roofline the measured time reaches and the kernels one call
ran. Under half the roofline the limit is named from what the row holds:

- launch-bound: under 5 us per kernel; the fixed cost of a launch and a kernel's ramp-up is
  most of the time (fusing kernels or larger batches help);
- multi-pass: two or more kernels of 5 us or more on average; each pass moves data again, so
  the traffic is well above the formula's minimum bytes (fusion removes passes);
- latency/occupancy: one long kernel still far from the bound: too little parallel work per SM,
  or dependent memory accesses. The row cannot tell the two apart; Nsight Compute's occupancy
  and stall counters can.

The kernels column lists the distinct kernels of a call, so a kernel launched twice counts once:
the launch-bound test then errs towards "not launch-bound".

benchmarks/probes/roofline_limits.py and benchmarks/probes/limit_diagnosis.py print these as markdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pytest_opperf.catalog import OPS, load_builtin
from pytest_opperf import dtypes as dtype_table
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.hardware.specs import load_specs
from pytest_opperf import config
from pytest_opperf.store.results import open_results

BEGIN, END = "<!-- limits -->", "<!-- /limits -->"
LAUNCH_US = 5.0  # per kernel: below this a kernel's time is mostly its fixed cost on a current GPU
FAR = 0.5  # a best backend under this fraction of its roofline gets a named limit


def shipped_cases(device: str, configs_dir: Path) -> dict[str, list]:
    """op -> its distinct (params, dtype_in, dtype_out) over every backend the configs in
    `configs_dir` sweep on `device`."""
    load_builtin()
    out = {}
    for path in sorted(Path(configs_dir).glob("*.yaml")):
        op = path.stem
        spec = OPS[op]
        cfg = config.load(path, spec.params, spec.defaults, op_name=op, op_types=spec.types)
        seen = {(c.params, c.dtype_in, c.dtype_out): None for c in cfg.expand(spec.params, device=device)}
        out[op] = list(seen)
    return out


def limit(op_name: str, params: tuple, dtype_in: str, dtype_out: str, spec) -> dict:
    """One case's FLOPs, bytes, intensity (FLOP/B), the ridge it is set against, which side of
    it the case lies (memory, compute, or None where the spec has no peak for the dtype), and its
    roofline time: the longer of FLOPs / peak and bytes / bandwidth."""
    op = OPS[op_name]
    p = dict(params)
    dt = DTypes(dtype_table.lookup(dtype_in), dtype_table.lookup(dtype_out))
    flops, nbytes = float(op.flops(p, dt)), float(op.bytes(p, dt))
    peak = spec.peak_flops(dtype_in, op.peak)
    bw = spec.mem_bw_bytes_per_s
    intensity = flops / nbytes if nbytes else float("inf")
    ridge = peak / bw if peak else None
    if flops == 0 or (ridge is not None and intensity < ridge):
        bound = "memory"
    elif ridge is None:
        bound = None  # no peak for this dtype on these units: only the bytes side is known
    else:
        bound = "compute"
    return {"flops": flops, "bytes": nbytes, "intensity": intensity, "ridge": ridge, "bound": bound,
            "kind": op.peak, "roofline_us": roofline_us(flops, nbytes, peak, bw)}


def rows(device: str, configs_dir: Path) -> list[dict]:
    """One row per op and input dtype: its cases' intensity range, the ridge, and which bound holds."""
    spec = load_specs()[device]
    out = []
    for op, cases in shipped_cases(device, configs_dir).items():
        if OPS[op].peak == "link":
            continue  # collectives are bound by the links between devices, not memory or compute: docs/collectives.md
        by_dtype: dict[tuple, list] = {}
        for params, din, dout in cases:
            by_dtype.setdefault((din, dout), []).append((params, limit(op, params, din, dout, spec)))
        for (din, dout), found in by_dtype.items():
            found.sort(key=lambda pl: pl[1]["roofline_us"])
            largest_params, largest = found[-1]
            bounds = [r["bound"] for _, r in found]
            out.append({
                "op": op, "dtype": din if din == dout else f"{din}->{dout}", "kind": largest["kind"],
                "ridge": largest["ridge"], "cases": len(found),
                "intensity_min": min(r["intensity"] for _, r in found),
                "intensity_max": max(r["intensity"] for _, r in found),
                "memory": bounds.count("memory"), "compute": bounds.count("compute"), "unknown": bounds.count(None),
                "largest": " ".join(f"{k}={v}" for k, v in largest_params), "largest_bound": largest["bound"],
                "largest_roofline_us": largest["roofline_us"],
            })
    return out


def verdict(row: dict) -> str:
    """The bound of an op's cases, in words.

    >>> verdict({"unknown": 0, "kind": "matrix", "dtype": "bf16", "cases": 6, "memory": 2, "compute": 4})
    'memory-bound at 2 of 6 (the smaller), compute-bound at 4'
    """
    if row["unknown"]:
        return f"no {row['kind']} peak for {row['dtype']}: bytes give the only bound"
    if row["memory"] == row["cases"]:
        return "memory-bound"
    if row["compute"] == row["cases"]:
        return "compute-bound"
    return f"memory-bound at {row['memory']} of {row['cases']} (the smaller), compute-bound at {row['compute']}"


def _num(x) -> str:
    if x is None:
        return "-"
    if x == float("inf"):
        return "inf"
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def roofline_markdown(device: str, configs_dir: Path) -> str:
    """The table of docs/catalog.md's generated section, for `device`."""
    spec = load_specs()[device]
    lines = [
        f"Device `{device}` ({spec.title}): memory bandwidth {spec.mem_bw_gbytes_per_s:g} GB/s; ridge point = "
        f"the peak MFU uses (matrix or vector units, input dtype) / bandwidth. Intensity = the op's FLOPs / its "
        f"minimal bytes, over the cases the shipped configs sweep on this device. Generated by "
        f"`python benchmarks/probes/roofline_limits.py --device {device} --write docs/catalog.md`: formulas only, "
        f"nothing measured.",
        "",
        "| op | dtype | units | ridge (FLOP/B) | cases | intensity (FLOP/B) | limit | the case of the longest roofline time | that time (us) |",
        "| --- | --- | --- | ---: | ---: | --- | --- | --- | ---: |",
    ]
    for r in rows(device, configs_dir):
        low, high = _num(r["intensity_min"]), _num(r["intensity_max"])
        span = low if low == high else f"{low} - {high}"
        lines.append(f"| {r['op']} | {r['dtype']} | {r['kind']} | {_num(r['ridge'])} | {r['cases']} | {span} | "
                     f"{verdict(r)} | {r['largest']} | {_num(r['largest_roofline_us'])} |")
    return "\n".join(lines)


def section(text: str) -> str:
    """The text between the limits markers (stripped)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} section")
    return text[start + len(BEGIN):end].strip()


def write_section(path: Path, table: str) -> bool:
    """Replace the text between the markers in `path` with `table`; True when it changed."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path}: no {BEGIN} ... {END} section to rewrite")
    new = text[:start + len(BEGIN)] + "\n" + table + "\n" + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


def classify(fraction: float, time_us: float, kernels: int) -> str:
    """The limit a case hits, from its roofline fraction, time and distinct kernels per call.

    >>> classify(0.9, 100.0, 1)
    'near the roofline'
    >>> classify(0.1, 8.0, 3)
    'launch-bound'
    >>> classify(0.2, 600.0, 4)
    'multi-pass'
    >>> classify(0.3, 600.0, 1)
    'latency/occupancy'
    >>> classify(9.31, 600.0, 1)
    'above the roofline: suspect'
    """
    if fraction > 1.0:
        return "above the roofline: suspect"
    if fraction >= FAR:
        return "near the roofline"
    if time_us / max(kernels, 1) < LAUNCH_US:
        return "launch-bound"
    if kernels >= 2:
        return "multi-pass"
    return "latency/occupancy"


def roofline_us(flops: float, nbytes: float, peak: Optional[float], bandwidth: float) -> float:
    """The shortest time the formulas allow: the longer of compute at peak and bytes at bandwidth.

    >>> roofline_us(2e12, 1e9, 1e15, 1e12)   # 2 ms of compute against 1 ms of memory
    2000.0
    """
    return max(flops / peak if peak else 0.0, nbytes / bandwidth) * 1e6


def diagnose(db: Path) -> tuple[str, list[dict]]:
    """(device, one dict per op table): the largest shape's fastest backend against its roofline."""
    with open_results(db) as results:
        device = results.latest_run()["device"]
        spec = load_specs()[device]
        out = []
        for table in results.op_tables():
            rows = results.rows(table)
            if any(r.get("busbw_gbps") is not None for r in rows):
                continue  # a collective: bound by links, not by memory or compute
            rows = [r for r in rows if (r.get("time_us") or 0) > 0 and (r.get("bytes") or 0) > 0]
            if rows:
                out.append(_best_against_roofline(table, rows, results.params(table), spec))
    return device, out


def _best_against_roofline(table: str, rows: list[dict], shape_cols: list[str], spec) -> dict:
    """The largest shape's fastest row against its roofline."""
    for row in rows:
        peak = spec.peak_flops(row["peak_dtype"], row["peak_kind"]) if row["peak_dtype"] else None
        row["roofline_us"] = roofline_us(row["flops"] or 0.0, row["bytes"], peak, spec.mem_bw_bytes_per_s)
    largest = max(rows, key=lambda r: r["roofline_us"])
    same = [r for r in rows if all(r[c] == largest[c] for c in shape_cols) and r["dtype_in"] == largest["dtype_in"]]
    best = min(same, key=lambda r: r["time_us"])
    kernels = len(json.loads(best["kernels"])) if best["kernels"] else 0
    fraction = best["roofline_us"] / best["time_us"]
    return {"op": table, "shape": " ".join(f"{c}={best[c]}" for c in shape_cols), "dtype": best["dtype_in"],
            "backend": best["backend"], "time_us": best["time_us"], "roofline_us": best["roofline_us"],
            "fraction": fraction, "kernels": kernels, "limit": classify(fraction, best["time_us"], kernels)}


def diagnosis_markdown(db: Path) -> str:
    """The diagnosis of `db` as a markdown table, with a title line."""
    device, found = diagnose(db)
    lines = [f"{db} ({device}): per op, its largest shape's fastest backend against the datasheet roofline", "",
             "| op | shape | dtype | best backend | time_us | roofline_us | fraction | kernels | limit |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in found:
        fraction = "100%*" if r["fraction"] > 1.0 else f"{r['fraction']:.0%}"
        lines.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['backend']} | {r['time_us']:.1f} | "
                     f"{r['roofline_us']:.1f} | {fraction} | {r['kernels']} | {r['limit']} |")
    if any(r["fraction"] > 1.0 for r in found):
        lines += ["", "*: faster than the datasheet roofline allows, shown as 100%*: the row's time, the op's "
                      "FLOP/byte formula or the spec's peak is wrong; not a fact about the backend"]
    return "\n".join(lines)
