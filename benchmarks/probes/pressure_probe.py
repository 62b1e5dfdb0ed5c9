"""What the contention probe's readings say on windows of 20 ms to 0.5 s, quiet and beside a load.

One thread of ours multiplies 256x512 by 512x512 matrices for each window; around it the probe's
own reader (measure/contention.read_cpu) takes /proc/stat's busy ticks of every CPU and PSI's
`some` total (/proc/pressure/cpu). Printed per window: the core-equivalents the CPUs were busy
(ticks: coarse below 0.1 s) and the share of the window some runnable thread waited for a CPU.

    python3 benchmarks/probes/pressure_probe.py               # quiet, then beside benchmarks/acceptance/load.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))  # load
from load import Load  # noqa: E402

from pytest_opperf.measure.contention import _tick_hz, allowed_cpus, read_cpu  # noqa: E402

WINDOWS_S = (0.02, 0.05, 0.1, 0.5)


def windows(label: str) -> None:
    cpus, hz = allowed_cpus(), _tick_hz()
    a, b = torch.randn(256, 512), torch.randn(512, 512)
    for window in WINDOWS_S:
        for _ in range(3):
            before = read_cpu(cpus)
            while time.monotonic() - before.wall_s < window:
                a @ b
            after = read_cpu(cpus)
            span = after.wall_s - before.wall_s
            busy = (after.busy_ticks - before.busy_ticks) / hz / span
            pressure = ("-" if before.pressure_us is None else
                        f"{(after.pressure_us - before.pressure_us) / 1e6 / span:.0%}")
            print(f"{label:<12} {window:5.2f} s  CPUs busy {busy:4.2f} of {len(cpus)}  oversubscribed {pressure}")


def main() -> int:
    torch.set_num_threads(1)
    windows("quiet")
    with Load(procs=None, seconds=30):
        time.sleep(0.5)  # the load's processes up and spinning
        windows("under load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
