"""Which limit each op hits at its shipped shapes on a device: compute or memory bandwidth.

From formulas only, nothing measured (pytest_opperf.view.limits says how). Runs on any machine.

    python benchmarks/probes/roofline_limits.py                          # the table, for an H100
    python benchmarks/probes/roofline_limits.py --device h200
    python benchmarks/probes/roofline_limits.py --write docs/catalog.md  # rewrite its generated section

Writes limits.md to $OUT when that is set.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_opperf.hardware.specs import load_specs
from pytest_opperf.view import limits

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="h100", help="hardware spec name (default: h100)")
    parser.add_argument("--configs", type=Path, default=CONFIGS, help="configs directory (default: the shipped one)")
    parser.add_argument("--write", type=Path, metavar="FILE", help=f"rewrite the {limits.BEGIN} section of FILE")
    args = parser.parse_args(argv)
    specs = load_specs()
    if args.device not in specs:
        print(f"--device={args.device}: unknown; known: {', '.join(sorted(specs))}", file=sys.stderr)
        return 2
    table = limits.roofline_markdown(args.device, args.configs)
    print(table)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "limits.md").write_text(table + "\n")
    if args.write:
        try:
            changed = limits.write_section(args.write, table)
        except (OSError, ValueError) as exc:
            print(exc, file=sys.stderr)
            return 2
        print(f"{args.write}: {'updated' if changed else 'already up to date'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
