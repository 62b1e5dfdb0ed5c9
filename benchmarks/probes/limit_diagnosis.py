"""Which limit a measured op hits, where its best backend is far under the roofline.

Per op table of a results database: the largest shape, its fastest backend, the fraction of the
datasheet roofline it reaches, and the limit named from the row (launch-bound, multi-pass,
latency/occupancy; pytest_opperf.view.limits says how).

    python3 benchmarks/probes/limit_diagnosis.py results/h100.db        # a markdown table on stdout
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from pytest_opperf.view import limits


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    args = parser.parse_args(argv)
    print(limits.diagnosis_markdown(args.db))
    return 0


if __name__ == "__main__":
    sys.exit(main())
