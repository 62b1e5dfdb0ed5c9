"""Which limit each op hits at its shipped shapes on a device: compute or memory bandwidth.

From formulas only, nothing measured: every case the shipped configs sweep on the device
(configs/*.yaml, their exclusions for that device applied) gives the op's FLOPs and minimal
bytes (the op's own formulas, as the rows' `flops` and `bytes`). Their ratio, the arithmetic
intensity, is set against the device's ridge point: the peak MFU is taken against (the
op's matrix or vector units, in the case's input dtype) over the memory bandwidth, from
hardware/data/hardware.yaml. Below the ridge the case is memory-bound: no kernel can beat
bytes / bandwidth. Above, compute-bound: FLOPs / peak. That bound time is the roofline.

    python benchmarks/roofline_limits.py                          # the table, for an H100
    python benchmarks/roofline_limits.py --device h200
    python benchmarks/roofline_limits.py --write docs/catalog.md  # rewrite its generated section

Runs on any machine (no GPU). Writes limits.md to $OUT when that is set.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_opperf.catalog import OPS, load_builtin
from pytest_opperf.catalog import dtypes as dtype_table
from pytest_opperf.catalog.registry import DTypes
from pytest_opperf.hardware.specs import load_specs
from pytest_opperf.run import config

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- limits -->", "<!-- /limits -->"


def shipped_cases(device: str) -> dict[str, list]:
    """op -> its distinct (params, dtype_in, dtype_out) over every backend the configs sweep on `device`."""
    load_builtin()
    out = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
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
    roofline_s = max(flops / peak if peak else 0.0, nbytes / bw)
    return {"flops": flops, "bytes": nbytes, "intensity": intensity, "ridge": ridge, "bound": bound,
            "kind": op.peak, "roofline_us": roofline_s * 1e6}


def rows(device: str) -> list[dict]:
    """One row per op and input dtype: its cases' intensity range, the ridge, and which bound holds."""
    spec = load_specs()[device]
    out = []
    for op, cases in shipped_cases(device).items():
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


def markdown(device: str) -> str:
    spec = load_specs()[device]
    lines = [
        f"Device `{device}` ({spec.title}): memory bandwidth {spec.mem_bw_gbytes_per_s:g} GB/s; ridge point = "
        f"the peak MFU uses (matrix or vector units, input dtype) / bandwidth. Intensity = the op's FLOPs / its "
        f"minimal bytes, over the cases the shipped configs sweep on this device. Generated by "
        f"`python benchmarks/roofline_limits.py --device {device} --write docs/catalog.md`: formulas only, "
        f"nothing measured.",
        "",
        "| op | dtype | units | ridge (FLOP/B) | cases | intensity (FLOP/B) | limit | the case of the longest roofline time | that time (us) |",
        "| --- | --- | --- | ---: | ---: | --- | --- | --- | ---: |",
    ]
    for r in rows(device):
        low, high = _num(r["intensity_min"]), _num(r["intensity_max"])
        span = low if low == high else f"{low} - {high}"
        lines.append(f"| {r['op']} | {r['dtype']} | {r['kind']} | {_num(r['ridge'])} | {r['cases']} | {span} | "
                     f"{verdict(r)} | {r['largest']} | {_num(r['largest_roofline_us'])} |")
    return "\n".join(lines)


def write_section(path: Path, table: str) -> bool:
    """Replace the text between the markers in `path` with `table`; True when it changed."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section to rewrite")
    new = text[:start + len(BEGIN)] + "\n" + table + "\n" + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="h100", help="hardware spec name (default: h100)")
    parser.add_argument("--write", type=Path, metavar="FILE", help=f"rewrite the {BEGIN} section of FILE")
    args = parser.parse_args(argv)
    specs = load_specs()
    if args.device not in specs:
        print(f"--device={args.device}: unknown; known: {', '.join(sorted(specs))}", file=sys.stderr)
        return 2
    table = markdown(args.device)
    print(table)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "limits.md").write_text(table + "\n")
    if args.write:
        print(f"{args.write}: {'updated' if write_section(args.write, table) else 'already up to date'}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
