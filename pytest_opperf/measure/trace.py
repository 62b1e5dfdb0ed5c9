"""A torch.profiler Chrome trace of a case: what its samples ran, for Perfetto or chrome://tracing.

The trace is a pass of its own after the case was measured, so the case's numbers are the
same with or without it. Each sample is made the way the case's timer makes one (its cache
flush, a graph replay for cuda_graph) inside a `record_function` range
`opperf::sample[i]`, after one call in `opperf::warmup`; the profiler timer's samples are made
as the event timer makes them (a profiler cannot run inside the trace's own).

>>> trace.write(work, device, "cuda_graph", "cold", path, samples=10, info={"case": case.id})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Optional

from pytest_opperf.measure import accelerator, inputs, profiler_records, timers

SAMPLES = 10  # samples a trace holds: enough to see their spread, few enough for a small file
WARMUP_RANGE = "opperf::warmup"
SAMPLE_RANGE = "opperf::sample[{}]"
_UNSAFE = re.compile(r"[^A-Za-z0-9._=\[\]-]+")


def file_name(test_id: str) -> str:
    """A file name for a test's trace: its node id with path separators and odd characters as '_'.

    >>> file_name("benches/test_ops.py::test_gemm[torch-bf16-m=1]")
    'benches_test_ops.py_test_gemm[torch-bf16-m=1].json'
    """
    name = _UNSAFE.sub("_", test_id).strip("_")
    if len(name) > 200:  # file systems refuse names past 255 bytes; the checksum keeps long ids apart
        name = f"{name[:190]}-{zlib.crc32(test_id.encode()):08x}"
    return name + ".json"


def write(work: inputs.Workload, device, timer_name: str, cache: str, path: Path, samples: int = SAMPLES,
          cache_bytes: Optional[int] = None, calls_per_sample: int = 1, info: Optional[dict] = None) -> Path:
    """Profile `samples` samples of `work` and write the Chrome trace to `path`; returns it.

    `info` (plain data) is added to the trace under the key "opperf": Perfetto ignores it, a
    script reading the file finds the case it belongs to.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    name = "event" if timer_name == "profiler" else timer_name
    tmr = timers.TIMERS[name](work, device, cache, cache_bytes, calls_per_sample)
    activities = [ProfilerActivity.CPU]
    if profiler_records.profiler_activity(device.type) is not None:
        activities.append(profiler_records.profiler_activity(device.type))
    with profile(activities=activities) as prof:
        with record_function(WARMUP_RANGE):
            work()
            accelerator.synchronize(device.type)
        for i in range(samples):
            with record_function(SAMPLE_RANGE.format(i)):
                tmr.sample(1)
                accelerator.synchronize(device.type)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    if info:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["opperf"] = {**info, "timer": timer_name, "traced_as": name, "cache": cache, "samples": samples}
        path.write_text(json.dumps(data), encoding="utf-8")
    return path
