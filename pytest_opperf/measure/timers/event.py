"""The event timer: device events around each sample's calls, on any accelerator.

torch.Event is the device-generic event (CUDA, XPU, NPU, ...): one code path for all. Each
sample carries the events' own launch overhead, which the cuda_graph timer divides away.
"""

from __future__ import annotations

from pytest_opperf.measure.accelerator import hold_device, synchronize
from pytest_opperf.measure.timers.base import Timer, timer


@timer
class EventTimer(Timer):
    name = "event"

    @classmethod
    def unsupported(cls, device_type):
        return "the event timer needs an accelerator; use 'cpu' on a CPU" if device_type == "cpu" else None

    def _event(self):
        import torch

        return torch.Event(device=self.device, enable_timing=True)

    def sample(self, n):
        self._refuse_unsupported()
        pairs = [(self._event(), self._event()) for _ in range(n)]
        for start, end in pairs:
            self._prepare()
            hold_device(self.device_type)
            start.record()
            self._calls()
            end.record()
        synchronize(self.device_type)
        return [start.elapsed_time(end) * 1e3 / self.calls_per_sample for start, end in pairs]
