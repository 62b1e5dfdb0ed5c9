"""A competing load: N busy processes (default one per core this process may use) for a duration.

Each process spins on the CPU in pure Python, holding one core; nothing is read or written.
Used by gate_false_alarms.py --load, and on its own beside any run:

    python3 benchmarks/acceptance/load.py                       # one per core, for 60 s
    python3 benchmarks/acceptance/load.py --procs 4 --seconds 300 &
    pytest benches/ -k add ...                       # rows measured meanwhile are flagged contended

    from load import Load                            # from a script in benchmarks/
    with Load(procs=None, seconds=600):             # ended when the block ends
        ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Optional

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Load:
    """`procs` busy processes (None: one per core) that end after `seconds`, or when the block ends."""

    def __init__(self, procs: Optional[int] = None, seconds: float = 60.0):
        self.count = procs or cores()
        self.seconds = seconds
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Load":
        code = SPIN.format(seconds=self.seconds)
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.count)]
        time.sleep(0.2)  # spinning before the caller measures anything
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=None, help="busy processes (default: one per core)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long they spin (default 60)")
    args = parser.parse_args()
    if args.procs is not None and args.procs < 1 or args.seconds <= 0:
        parser.error("--procs must be >= 1 and --seconds > 0")
    with Load(args.procs, args.seconds) as load:
        print(f"{load.count} busy processes for {args.seconds:g} s (Ctrl-C ends them)", flush=True)
        try:
            for p in load.procs:
                p.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
