"""`opperf datasette-metadata`: a Datasette metadata file for result databases, so that
``datasette results/h100.db -m metadata.json`` shows what every column means, its unit, and
facets on backend, dtype and timer. Datasette itself is never needed by pytest-opperf.

>>> meta = metadata([Results.open(Path("results/h100.db"))])             # doctest: +SKIP
>>> meta["databases"]["h100"]["tables"]["gemm"]["units"]["time_us"]
'us'
"""

from __future__ import annotations

from pytest_opperf.store.database import KEY_COLUMNS, MEASURE_COLUMNS, RUNS
from pytest_opperf.view.source import Results

# column -> (description, unit). Units are Pint's names, which Datasette displays; None: no unit
# Pint knows (FLOP/s is not one), the description says it.
COLUMNS = {
    "dtype_in": ("input dtype", None),
    "dtype_out": ("output dtype", None),
    "backend": ("backend: the implementation that ran", None),
    "backend_version": ("installed version of the backend's library", None),
    "knobs": ("the backend's tuning knobs as JSON ('' without)", None),
    "timer": ("how a sample was timed: cpu, event, cuda_graph or profiler", None),
    "cache": ("cache state: cold (inputs rotated past the last-level cache) or hot", None),
    "time_us": ("median time of one call", "us"),
    "time_us_mean": ("mean time of one call", "us"),
    "time_us_p95": ("95th percentile of the time of one call", "us"),
    "time_us_std": ("standard deviation of the samples", "us"),
    "time_us_min": ("fastest sample", "us"),
    "cv": ("coefficient of variation: std / mean (above 0.15: unstable)", None),
    "samples": ("samples taken", None),
    "ci_rel": ("half-width of the median's 95% confidence interval, relative to the median", None),
    "target_met": ("1 if ci_rel reached the precision target within the time budget", None),
    "unstable": ("1 if cv > 0.15", None),
    "gflops": ("achieved GFLOP/s (1e9 floating-point operations per second)", None),
    "gbytes_per_s": ("achieved memory throughput, GB/s (1e9 bytes per second)", "GB/s"),
    "mfu": ("model FLOP utilisation: achieved FLOP/s over the device's peak for the dtype", None),
    "mbu": ("memory bandwidth utilisation: achieved bytes/s over the device's peak bandwidth", None),
    "flops": ("floating-point operations of one call (the op's formula)", None),
    "bytes": ("fewest bytes one call must move (the op's formula)", "B"),
    "peak_dtype": ("the dtype whose peak MFU uses", None),
    "peak_kind": ("the units whose peak MFU uses: matrix or vector", None),
    "kernels": ("JSON list of the kernels one call ran", None),
    "warmup_calls": ("warm-up calls before sampling", None),
    "calls_per_sample": ("calls one sample averages", None),
    "first_call_ms": ("wall time of the first (checked) call: compilation, autotuning, lazy set-up", "ms"),
    "clock_warmup_s": ("seconds the device was held busy before this case until its clock was steady", "s"),
    "clock_warmup_method": ("how the clock warm-up ended: steady, bound or fixed", None),
    "clock_warmup_mhz_start": ("SM clock when the warm-up began", "MHz"),
    "clock_warmup_mhz_end": ("SM clock when the warm-up ended", "MHz"),
    "sm_clock_mhz_before": ("GPU SM clock before the case (NVML)", "MHz"),
    "sm_clock_mhz_after": ("GPU SM clock after the case (NVML)", "MHz"),
    "mem_clock_mhz": ("GPU memory clock (NVML)", "MHz"),
    "temp_c_before": ("GPU temperature before the case", "degC"),
    "temp_c_after": ("GPU temperature after the case", "degC"),
    "power_w_before": ("GPU power draw before the case", "W"),
    "power_w_after": ("GPU power draw after the case", "W"),
    "throttle_reasons": ("clock-event reasons seen during the case", None),
    "throttled": ("1 if a reason that slows the GPU was seen (power cap, thermal, HW slowdown)", None),
    "extra_info": ("bench.extra_info as JSON", None),
    "topology_tier": ("collectives: 0 across nodes, 1 within a node, 2 within a package", None),
    "comm_backend": ("collectives: the torch.distributed backend (nccl, gloo, hccl)", None),
    "algbw_gbps": ("collectives: algorithm bandwidth S / time (nccl-tests)", "GB/s"),
    "busbw_gbps": ("collectives: bus bandwidth, algbw times the op's factor (nccl-tests)", "GB/s"),
    "link_gbps": ("collectives: the device's link bandwidth, one direction (the spec)", "GB/s"),
    "busbw_util": ("collectives: busbw over the link bandwidth", None),
    "test_id": ("the pytest node id", None),
    "run_id": ("the run that wrote the row (see the runs table)", None),
    "created_at": ("when the row was written (UTC)", None),
    "worker": ("the xdist worker that ran the case", None),
    "gpu": ("index of the physical GPU that ran the case", None),
    "gpu_uuid": ("UUID of the GPU that ran the case", None),
}
FACETS = ["backend", "dtype_in", "timer"]


def table_metadata(op: str, params: list[str], columns: list[str]) -> dict:
    descriptions = {p: f"parameter {p} of {op} (from its config)" for p in params}
    descriptions.update({c: COLUMNS[c][0] for c in columns if c in COLUMNS})
    return {
        "description": f"one row per measured case of {op}: unique on ({', '.join([*params, *KEY_COLUMNS])})",
        "columns": {c: descriptions[c] for c in columns if c in descriptions},
        "units": {c: COLUMNS[c][1] for c in columns if c in COLUMNS and COLUMNS[c][1]},
        "facets": [f for f in FACETS if f in columns],
        "sort_desc": "created_at",
    }


def metadata(opened: list[Results]) -> dict:
    """Datasette metadata for these databases (each named by its file's stem, as Datasette names it)."""
    databases = {}
    for results in opened:
        tables = {}
        for op in results.ops:
            table = results.table(op)
            tables[op] = table_metadata(op, table.params, table.columns)
        if results.runs:
            tables[RUNS] = {"description": "one row per pytest session: its environment (device, driver, "
                                           "torch, libraries, git commit, host, command, settings)",
                            "facets": ["device", "torch"], "sort_desc": "started_at"}
        databases[results.path.stem] = {"description": f"pytest-opperf results of device {results.device}",
                                        "tables": tables}
    return {"title": "pytest-opperf results", "description": "operator performance: one table per op, one row "
            "per case; units in the column headers' hints", "databases": databases}


def known_columns() -> list[str]:
    """Every column the store writes besides an op's parameters (a test holds COLUMNS to them)."""
    return [*KEY_COLUMNS, *MEASURE_COLUMNS]
