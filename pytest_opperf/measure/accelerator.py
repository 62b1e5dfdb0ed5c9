"""The device's queue, as every timer and the sampling loop touch it: wait for it, keep it busy.

Through torch's device-generic API (torch.accelerator), so other accelerators than CUDA need no
code here; the spin kernel that keeps a device busy exists only on CUDA.
"""

from __future__ import annotations

HOLD_CYCLES = 200_000  # ~100 us at 2 GHz: longer than the host needs to queue one sample


def synchronize(device_type: str) -> None:
    """Wait for the current accelerator's queued work (nothing to wait for on a CPU)."""
    if device_type == "cpu":
        return
    import torch

    torch.accelerator.synchronize()


def hold_device(device_type: str) -> None:
    """Keep the device busy while the host queues the next sample (CUDA only).

    Between a start event and the call it times, the device otherwise waits for the host to
    launch the call: microseconds that are host time, not the kernel's (more after profiler
    sessions in the same process, which add host work to every launch). A spin kernel queued
    first runs while the host queues start event, call(s) and end event behind it, so they
    then run back to back. Other accelerators have no spin kernel in torch's generic API:
    their samples keep the launch gap.
    """
    if device_type == "cuda":
        import torch

        torch.cuda._sleep(HOLD_CYCLES)
