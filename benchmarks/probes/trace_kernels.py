"""The kernels of an --opperf-trace file, call by call: duration, grid and block of each launch.

For a row whose samples spread (gemm_rowwise fp8: 147 to 171 us in one case): are there two
speeds, and does anything the trace records (grid, block, registers, stream) tell them apart?

    pytest benches/test_matmul.py -k "gemm_rowwise and 6144" --opperf-trace=traces
    python3 benchmarks/probes/trace_kernels.py traces/*.json --name nvjet
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path


def launches(path: Path, name: str) -> list[dict]:
    events = json.loads(path.read_text()).get("traceEvents", [])
    out = [e for e in events if e.get("cat") == "kernel" and name in e.get("name", "")]
    return sorted(out, key=lambda e: e["ts"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--name", default="", help="only kernels whose name holds this")
    a = ap.parse_args(argv)
    for path in a.traces:
        ks = launches(path, a.name)
        if not ks:
            print(f"{path}: no kernel named like {a.name!r}")
            continue
        durs = [k["dur"] for k in ks]
        shape = Counter((str(k.get("args", {}).get("grid")), str(k.get("args", {}).get("block")),
                         k.get("args", {}).get("registers per thread"), k.get("args", {}).get("stream")) for k in ks)
        print(f"{path.name}: {len(ks)} launches, median {statistics.median(durs):.1f} us, "
              f"min {min(durs):.1f}, max {max(durs):.1f}")
        print("  launch configurations (grid, block, registers, stream): " + "; ".join(f"{k} x{v}" for k, v in shape.items()))
        print("  in order: " + " ".join(f"{d:.0f}" for d in durs[:200]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
