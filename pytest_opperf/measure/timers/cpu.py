"""The cpu timer: the host clock around each sample's calls, between two device synchronizes.

The timer of a CPU, and the one that needs nothing of a device; on an accelerator its samples
hold the launch and the synchronize with the kernels.
"""

from __future__ import annotations

import time

from pytest_opperf.measure.accelerator import synchronize
from pytest_opperf.measure.timers.base import Timer, timer


@timer
class CpuTimer(Timer):
    name = "cpu"

    def sample(self, n):
        out, k = [], self.calls_per_sample
        for _ in range(n):
            self._prepare()
            synchronize(self.device_type)
            t0 = time.perf_counter_ns()
            self._calls()
            synchronize(self.device_type)
            out.append((time.perf_counter_ns() - t0) / 1e3 / k)
        return out
